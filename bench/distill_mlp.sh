#!/bin/sh
# distill_mlp.sh [DMC]: knowledge distillation on examples/mlp.dm and Fashion-MNIST
# (docs/compression.md). A teacher (the file's H = 1024) is trained TEACHER_EPOCHS epochs;
# then the H = 64 student is trained EPOCHS epochs alone and EPOCHS epochs distilled from the
# teacher (--teacher, T = $T, alpha = $ALPHA), the same seed and steps; the test accuracy of
# each is printed. Environment: TEACHER_EPOCHS (default 2), EPOCHS (2), T (4), ALPHA (0.5),
# SEED (0), DMC_DATA_DIR (the trainer's default data directory).
set -eu
dmc=${1:-build/driver/dmc}
root=$(cd "$(dirname "$0")/.." && pwd)
mlp="$root/examples/mlp.dm"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/distill-mlp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
data=""
[ -n "${DMC_DATA_DIR:-}" ] && data="--data-dir $DMC_DATA_DIR"
seed=${SEED:-0}

accuracy() { sed -n 's/^test accuracy //p' "$1"; }

# shellcheck disable=SC2086
"$dmc" run "$mlp" --quiet --seed "$seed" --epochs "${TEACHER_EPOCHS:-2}" --save "$tmp/teacher.safetensors" $data \
    > "$tmp/teacher.out"
# shellcheck disable=SC2086
"$dmc" run "$mlp" --set H=64 --quiet --seed "$seed" --epochs "${EPOCHS:-2}" $data > "$tmp/alone.out"
# shellcheck disable=SC2086
"$dmc" run "$mlp" --set H=64 --teacher "$mlp" --teacher-init "$tmp/teacher.safetensors" \
    --distill-temperature "${T:-4}" --distill-alpha "${ALPHA:-0.5}" --quiet --seed "$seed" --epochs "${EPOCHS:-2}" $data \
    > "$tmp/distilled.out"
echo "teacher H=1024, ${TEACHER_EPOCHS:-2} epochs: test accuracy $(accuracy "$tmp/teacher.out")"
echo "student H=64 alone, ${EPOCHS:-2} epochs: test accuracy $(accuracy "$tmp/alone.out")"
echo "student H=64 distilled (T=${T:-4}, alpha=${ALPHA:-0.5}), ${EPOCHS:-2} epochs: test accuracy $(accuracy "$tmp/distilled.out")"
