#!/bin/sh
# cuda_dialect_smoke.sh: builds tests/tools/cuda_dialect_smoke.c, writes its files into a
# temporary directory, checks the emulated kernels against the C dialect's loops (bit for
# bit, any C++ compiler) and, where nvcc is installed, compiles the CUDA file as generated
# code is compiled (every warning an error). No GPU needed.
#   sh tests/tools/cuda_dialect_smoke.sh [NESTS]     (from the repository root)
# NESTS: loop nests recorded from a model, one a line (see cuda_dialect_smoke.c).
set -eu
CC=${CC:-cc}
CXX=${CXX:-c++}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
$CC -std=c11 -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L -Iir -Icodegen -Ipasses -Ifrontend \
    tests/tools/cuda_dialect_smoke.c codegen/dialect_cuda*.c codegen/dialect_c.c codegen/dialect_c_rows.c ir/text_buf.c \
    -o "$out/smoke"
"$out/smoke" "$out" "$@"
# the same float operations on both sides: no contraction into fma
$CXX -std=c++17 -O1 -ffp-contract=off -Wall -Wextra -Werror -Iruntime "$out/smoke_emu.cpp" -o "$out/emu"
"$out/emu"
if [ -x "$NVCC" ]; then
    start=$(date +%s.%N)
    "$NVCC" -c -std=c++17 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
        -I runtime -I runtime/comm -I runtime/cuda -gencode arch=compute_90,code=sm_90 \
        "$out/smoke.cu" -o "$out/smoke.o"
    echo "nvcc: smoke.cu compiled warning-free in $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $start }") s"
else
    echo "nvcc not found ($NVCC): the CUDA compile was skipped"
fi
