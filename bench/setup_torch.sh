#!/bin/sh
# setup_torch.sh: PyTorch 2.x for the CPU benchmarks, in a virtual environment of its own.
#
# usage: sh bench/setup_torch.sh        (from anywhere; needs PyPI, about 4.1 GB of disk)
#
# Creates bench/.venv (ignored by git) with the first Python 3 that can make one (`python3`
# on PATH, then /usr/bin/python3) and installs bench/torch-requirements.txt into it with
# `pip install --no-deps`: every version pinned, and only the packages torch loads (the file
# says why). Then the benches take that interpreter:
#     bench/.venv/bin/python bench/gpt_step.py --dmc build/driver/dmc
#     bench/.venv/bin/python bench/mlp_epoch.py --dmc build/driver/dmc
# Run again, it does nothing when the environment was set up from this very requirements
# file (a copy of it, written once torch imported and multiplied, says so); after an edit of
# the file it installs the difference. rm -rf bench/.venv starts over. Not part of the test suite: the tests use /usr/bin/python3.
set -eu

bench=$(cd "$(dirname "$0")" && pwd)
venv="$bench/.venv"
reqs="$bench/torch-requirements.txt"
stamp="$venv/.dmc-torch-requirements"

check() {
    "$venv/bin/python" -c 'import torch, numpy
x = torch.ones(2, 3) @ torch.ones(3, 2)
assert float(x.sum()) == 12.0
print("torch %s (numpy %s) in %s" % (torch.__version__, numpy.__version__, torch.__file__.rsplit("/", 2)[0]))'
}

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$reqs"; then
    echo "setup_torch: $venv is up to date"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    made=
    for py in python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        if "$py" -m venv "$venv" 2>/dev/null; then made=$py; break; fi
        rm -rf "$venv"
    done
    if [ -z "$made" ]; then
        echo "setup_torch: no Python 3 here can create a virtual environment (python3 -m venv;" \
             "on Debian: apt-get install python3-venv)" >&2
        exit 1
    fi
    echo "setup_torch: created $venv with $("$venv/bin/python" --version 2>&1) ($made)"
fi

"$venv/bin/python" -m pip install --disable-pip-version-check --no-deps -r "$reqs"
check
cp "$reqs" "$stamp"
