#!/bin/sh
# quantize_mlp.sh: what --quantize costs in accuracy and gains in size and inference time,
# on examples/mlp.dm (Fashion-MNIST) and on a small fortunes GPT (examples/gpt.dm).
#
# usage: bench/quantize_mlp.sh DMC [EPOCHS (default 5)] [SEED (default 0)] [GPT_STEPS (default 300)]
# environment: ROWS (the rows of the timed batch, default 10000: the test set), RUNS (timed
# --predict runs per mode, the modes in turn in each round, the median printed; default 7),
# THREADS (the programs' --threads, default 1), DMC_DATA_DIR (the trainer's default data
# directory), FORTUNES (the GPT's corpus, default /usr/share/games/fortunes/cookie; absent:
# no GPT rows), SKIP_MLP=1 (the GPT's rows alone).
#
# mlp.dm is trained once in fp32 (EPOCHS, SEED) and saved; then each mode is a program built
# once (dmc run --keep; fp32 is the same model without --quantize) that
#   - writes its --save-quantized file from the f32 weights (fp32: the f32 file itself),
#   - evaluates that file with --evaluate (test accuracy on the 10,000 test images),
#   - predicts the first ROWS test images (--predict --batch-file, calls of up to B = 128
#     rows) RUNS times, the modes taking turns; the time is the one the program prints for
#     its predictions ("predicted N rows ... in T s": the forward passes, not the files),
#     the median taken.
# Printed per mode: accuracy, its difference to fp32 in points, the file's size and its
# ratio to the f32 file, the median time and its ratio to fp32's. int8 (int8 activations)
# is measured when dmc accepts --quantize int8 and is "not built" otherwise.
# The GPT (V=256, T=32, C=64, NH=4, L=2, B=16) trains GPT_STEPS steps on the fortunes and
# each mode prints its validation loss (--evaluate's "val loss") and file size; MODE+emb is
# MODE with --quantize-embeddings (the tied wte narrow too).
# docs/compression.md ("Quantization, measured") has the figures.
set -eu
dmc=${1:?usage: bench/quantize_mlp.sh DMC [EPOCHS] [SEED] [GPT_STEPS]}
epochs=${2:-5}
seed=${3:-0}
gpt_steps=${4:-300}
rows=${ROWS:-10000}
runs=${RUNS:-7}
threads=${THREADS:-1}
fortunes=${FORTUNES:-/usr/share/games/fortunes/cookie}
data_dir=${DMC_DATA_DIR:-/usr/share/datasets/fashion-mnist}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/quantize-mlp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
data=""
[ -n "${DMC_DATA_DIR:-}" ] && data="--data-dir $DMC_DATA_DIR"

# the first $rows test images as a batch file: x f32[rows, 784], pixels / 255
/usr/bin/python3 - "$data_dir/t10k-images-idx3-ubyte.gz" "$rows" "$tmp/x.safetensors" "$root/tests/ref" <<'PY'
import gzip, sys
import numpy as np
sys.path.insert(0, sys.argv[4])
import stio
raw = gzip.open(sys.argv[1], "rb").read()
images = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(-1, 784)[:int(sys.argv[2])]
stio.save({"x": images.astype(np.float32) / 255.0}, sys.argv[3])
PY

mode_args() { # dmc's options for mode $1 (MODE+emb: with --quantize-embeddings)
    case $1 in
    fp32) ;;
    *+emb) echo "--quantize ${1%+emb} --quantize-embeddings" ;;
    *) echo "--quantize $1" ;;
    esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
size() { wc -c < "$1" | tr -d ' '; }
refused() { # mode $1, which dmc --check refused in $tmp/check.out
    case $1 in
    int8) echo "int8: not built ($(head -n 1 "$tmp/check.out"))" ;;
    *) echo "$1: refused ($(head -n 1 "$tmp/check.out"))" ;;
    esac
}

if [ "${SKIP_MLP:-0}" != 1 ]; then # (SKIP_MLP=1: the GPT rows alone)
# the mlp trained once, in fp32
# shellcheck disable=SC2086
"$dmc" run "$root/examples/mlp.dm" --epochs "$epochs" --seed "$seed" --quiet --save "$tmp/fp32.safetensors" $data >/dev/null
fp32_size=$(size "$tmp/fp32.safetensors")

# each mode's program, weights file and accuracy; $tmp/modes lists the modes built
: >"$tmp/modes"
for mode in fp32 int8-weights int4-weights:64 int4-weights:128 int8; do
    # shellcheck disable=SC2046
    if ! "$dmc" "$root/examples/mlp.dm" $(mode_args $mode) --check >"$tmp/check.out" 2>&1; then
        refused "$mode" >"$tmp/$mode.refused"
        continue
    fi
    # shellcheck disable=SC2046,SC2086
    "$dmc" run --keep "$tmp/$mode" "$root/examples/mlp.dm" $(mode_args $mode) -- --evaluate \
        --init "$tmp/fp32.safetensors" --quiet $data >/dev/null
    weights="$tmp/fp32.safetensors"
    if [ $mode != fp32 ]; then
        weights="$tmp/$mode.safetensors"
        # shellcheck disable=SC2086
        "$tmp/$mode/mlp" --init "$tmp/fp32.safetensors" --save-quantized "$weights" --quiet $data >/dev/null
    fi
    # shellcheck disable=SC2086
    "$tmp/$mode/mlp" --evaluate --init "$weights" --threads "$threads" --quiet $data | sed -n 's/^test accuracy //p' \
        >"$tmp/$mode.accuracy"
    echo "$mode $weights" >>"$tmp/modes"
done

# the timed predictions, the modes in turn in every round (a load that comes and goes then
# falls on all of them alike)
i=0
while [ $i -lt "$runs" ]; do
    while read -r mode weights; do
        "$tmp/$mode/mlp" --predict --init "$weights" --batch-file "$tmp/x.safetensors" --out "$tmp/y.safetensors" \
            --threads "$threads" 2>&1 >/dev/null | sed -n 's/^predicted .* in \([0-9.e+-]*\) s.*/\1/p' >>"$tmp/$mode.times"
    done <"$tmp/modes"
    i=$((i + 1))
done

echo "mlp.dm, Fashion-MNIST, $epochs epochs, seed $seed; time: --predict of $rows rows (calls of 128), --threads $threads, median of $runs"
printf '%-16s %-9s %-8s %-18s %s\n' mode accuracy points "file bytes" "predict s (x fp32)"
fp32_acc=$(cat "$tmp/fp32.accuracy")
fp32_time=$(median <"$tmp/fp32.times")
for mode in fp32 int8-weights int4-weights:64 int4-weights:128 int8; do
    if [ -f "$tmp/$mode.refused" ]; then
        cat "$tmp/$mode.refused"
        continue
    fi
    weights=$(sed -n "s/^$mode //p" "$tmp/modes")
    awk -v m="$mode" -v a="$(cat "$tmp/$mode.accuracy")" -v a0="$fp32_acc" -v s="$(size "$weights")" -v s0="$fp32_size" \
        -v t="$(median <"$tmp/$mode.times")" -v t0="$fp32_time" \
        'BEGIN { printf "%-16s %-9s %+-8.2f %9d (%.3f) %8.4f (%.2f)\n", m, a, 100 * (a - a0), s, s / s0, t, t / t0 }'
done
fi

[ -r "$fortunes" ] || { echo "GPT: no corpus $fortunes: skipped"; exit 0; }
gpt="$root/examples/gpt.dm"
dims="V=256,T=32,C=64,NH=4,L=2,B=16"
"$dmc" run "$gpt" --set "$dims" --steps "$gpt_steps" --seed "$seed" --data "text:$fortunes" --quiet \
    --save "$tmp/gpt.safetensors" >/dev/null
gpt_size=$(size "$tmp/gpt.safetensors")
echo
echo "gpt.dm ($dims), fortunes, $gpt_steps steps, seed $seed"
printf '%-16s %-11s %-8s %s\n' mode "val loss" "x fp32" "file bytes"
fp32_loss=""
for mode in fp32 int8-weights int4-weights:64 int8 int8-weights+emb int4-weights:64+emb int8+emb; do
    # shellcheck disable=SC2046
    if ! "$dmc" "$gpt" --set "$dims" $(mode_args $mode) --check >"$tmp/check.out" 2>&1; then
        refused "$mode"
        continue
    fi
    keep="$tmp/gpt-$mode"
    # shellcheck disable=SC2046
    "$dmc" run --keep "$keep" "$gpt" --set "$dims" $(mode_args $mode) -- --evaluate --init "$tmp/gpt.safetensors" \
        --data "text:$fortunes" --quiet >/dev/null
    weights="$tmp/gpt.safetensors"
    if [ $mode != fp32 ]; then
        weights="$tmp/gpt-$mode.safetensors"
        # int8 calibrates its input scales on the corpus's training windows
        calibrate=""
        case $mode in int8 | int8+emb) calibrate="--data text:$fortunes" ;; esac
        # shellcheck disable=SC2086
        "$keep/gpt" --init "$tmp/gpt.safetensors" --save-quantized "$weights" --quiet $calibrate >/dev/null
    fi
    loss=$("$keep/gpt" --evaluate --init "$weights" --data "text:$fortunes" --quiet | sed -n 's/^val loss //p')
    [ -n "$fp32_loss" ] || fp32_loss=$loss
    awk -v m="$mode" -v l="$loss" -v l0="$fp32_loss" -v s="$(size "$weights")" -v s0="$gpt_size" \
        'BEGIN { printf "%-16s %-11s %-8.4f %9d (%.3f)\n", m, l, l / l0, s, s / s0 }'
done
