#!/bin/sh
# test_philox.sh: runtime/dmrt_philox.h (dropout's mask, shared by the C runtime and CUDA
# kernels) gives the same bits compiled as C and as CUDA: test_philox.c built by cc and by
# nvcc (-x cu, warnings as errors, its kernel compiled for the device), each checked against
# Philox's known answers and an independent reference, their mask digests equal. Host only:
# no GPU needed.
#   sh tests/gpu/test_philox.sh     (from the repository root)
set -eu
CC=${CC:-cc}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
$CC -std=c11 -O2 -Wall -Wextra -Werror -Iruntime tests/gpu/test_philox.c -o "$out/philox_c"
c=$("$out/philox_c")
echo "C:    $c"
"$NVCC" -x cu -std=c++17 -O2 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -I runtime \
    -gencode arch=compute_90,code=sm_90 tests/gpu/test_philox.c -o "$out/philox_cuda"
cuda=$("$out/philox_cuda")
echo "CUDA: $cuda"
[ "$c" = "$cuda" ] || { echo "FAIL: the C and CUDA builds drew different masks"; exit 1; }
echo "the C and CUDA spellings draw the same masks"
