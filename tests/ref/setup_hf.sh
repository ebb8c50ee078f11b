#!/bin/sh
# setup_hf.sh: Hugging Face transformers for tests/ref/test_llama_hf.py (meson test
# `ref-llama-hf`), in a virtual environment of its own.
#
# usage: sh tests/ref/setup_hf.sh        (from anywhere; needs PyPI, about 30 MB)
#
# Creates tests/ref/.venv-hf (ignored by git) from /usr/bin/python3 with
# --system-site-packages, so that it reuses the system torch and numpy (python3-torch,
# python3-numpy: what every other test runs on), and installs the pinned
# tests/ref/hf-requirements.txt into it (transformers 4.40 still supports torch 1.13).
# The test re-executes itself with this interpreter; without it, it skips (exit 77).
# .ci/setup runs it (a failure there only makes the test skip). Run again, it does
# nothing when the environment was made from this very requirements file.
# rm -rf tests/ref/.venv-hf starts over.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv-hf"
reqs="$here/hf-requirements.txt"
stamp="$venv/.dmc-hf-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$reqs"; then
    echo "setup_hf: $venv is up to date"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    echo "setup_hf: created $venv ($("$venv/bin/python" --version 2>&1), system site packages)"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -r "$reqs"
"$venv/bin/python" -c 'import torch, transformers
print("transformers %s on torch %s" % (transformers.__version__, torch.__version__))'
cp "$reqs" "$stamp"
