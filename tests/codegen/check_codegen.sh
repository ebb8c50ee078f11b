#!/bin/sh
# Generated code is clean C11: for each model, dmc -o writes <model>.h/.c, which must
# (1) pass the libclang checker (no diagnostics, no mutable file-scope variable, every
# external symbol prefixed with the model name) and (2) compile warning-free under gcc
# and clang with -std=c11 -Wall -Wextra -Werror -pedantic (a model on a mesh includes
# runtime/comm's dmrt_comm.h).
# usage: check_codegen.sh DMC CHECK_GENERATED RUNTIME_DIR MODEL.dm [DMC ARGS...]
set -eu
dmc=$1 checker=$2 runtime=$3 model=$4
shift 4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$dmc" "$model" -o "$out" "$@"
name=$(basename "$model" .dm)
"$checker" --prefix "${name}_" -I "$runtime" -I "$runtime/comm" "$out/$name.c" "$out/$name.h"
for compiler in gcc clang; do
    command -v "$compiler" >/dev/null || continue
    "$compiler" -std=c11 -Wall -Wextra -Werror -pedantic -Wshadow -Wstrict-prototypes \
        -I "$runtime" -I "$runtime/comm" -I "$out" -c "$out/$name.c" -o "$out/$name.$compiler.o"
    echo "$compiler: $name.c compiles cleanly"
done
