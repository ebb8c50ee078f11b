#!/bin/sh
# prune_mlp.sh: what --prune costs examples/mlp.dm in accuracy on Fashion-MNIST.
#
# usage: bench/prune_mlp.sh DMC [EPOCHS (default 5)] [RATIO (default 0.5)] [SEED (default 0)]
#
# Trains the fp32 model and the same model with --prune RATIO (the default ramp: from the
# first update to 3/4 of the run) for the same epochs and seed (the same initial weights and
# data order), saves both, evaluates each saved file with --evaluate (the accuracy the
# weights give, without training), and prints both test accuracies, their difference in
# points and the fraction of the pruned model's weight matrices that is exactly zero.
# docs/compression.md ("Pruning") has the figures.
set -eu
dmc=${1:?usage: bench/prune_mlp.sh DMC [EPOCHS] [RATIO] [SEED]}
epochs=${2:-5}
ratio=${3:-0.5}
seed=${4:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

accuracy() { # the accuracy --evaluate gives the weights file $1, compiled with the options after it
    weights=$1
    shift
    "$dmc" run "$root/examples/mlp.dm" "$@" --evaluate --init "$weights" --quiet | sed -n 's/^test accuracy //p'
}

"$dmc" run "$root/examples/mlp.dm" --epochs "$epochs" --seed "$seed" --quiet --save "$tmp/fp32.safetensors" >/dev/null
"$dmc" run "$root/examples/mlp.dm" --prune "$ratio" --epochs "$epochs" --seed "$seed" --quiet \
    --save "$tmp/pruned.safetensors" >/dev/null
fp32=$(accuracy "$tmp/fp32.safetensors")
pruned=$(accuracy "$tmp/pruned.safetensors")
zeros=$(/usr/bin/python3 - "$tmp/pruned.safetensors" <<'PY'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
zero = total = 0
for name, t in header.items():
    if name.endswith(".weight") and len(t["shape"]) == 2:
        values = struct.unpack("<%df" % ((t["data_offsets"][1] - t["data_offsets"][0]) // 4),
                               data[t["data_offsets"][0]:t["data_offsets"][1]])
        zero += sum(v == 0.0 for v in values)
        total += len(values)
print("%.4f" % (zero / total))
PY
)
echo "mlp.dm, Fashion-MNIST, $epochs epochs, seed $seed"
echo "fp32                 test accuracy $fp32"
echo "--prune $ratio          test accuracy $pruned (weight matrices $zeros zero)"
awk -v a="$fp32" -v b="$pruned" 'BEGIN { printf "difference           %+.2f points\n", 100 * (b - a) }'
