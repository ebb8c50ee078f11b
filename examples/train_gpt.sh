#!/usr/bin/env bash
# train_gpt.sh: trains a small byte-level GPT (examples/gpt.dm) on English text that every
# Debian machine can install without internet: the `fortunes` package (fortune cookies,
# quotations and verse, /usr/share/games/fortunes). Prints the loss as it falls, the
# validation loss every 250 steps, and 400 bytes sampled from the trained model.
#   bash examples/train_gpt.sh [extra dmc run options, e.g. --steps 3000 --seed 1]
# Reproducible: the same seed gives the same run (windows, initialisation, sample).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=/usr/share/games/fortunes
files=literature,science,songs-poems,wisdom,work,people,computers,cookie
corpus=""
for f in ${files//,/ }; do
    [ -r "$dir/$f" ] || { echo "train_gpt.sh: $dir/$f is missing: apt-get install fortunes" >&2; exit 1; }
    corpus+="${corpus:+,}$dir/$f"
done
set -x
build/driver/dmc run examples/gpt.dm --set V=256,T=64,C=128,NH=4,L=4,B=16 \
    --data "text:$corpus" --steps 1500 --eval-every 250 \
    --sample 400 --prompt "The " --temperature 0.8 --top-k 40 "$@"
