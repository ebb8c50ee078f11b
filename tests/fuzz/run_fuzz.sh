#!/bin/sh
# run_fuzz.sh SECONDS [BUILD_DIR]: builds tests/fuzz/fuzz_frontend.c with libFuzzer,
# AddressSanitizer (with LeakSanitizer) and UBSan, and fuzzes the frontend and passes
# for SECONDS on a copy of tests/fuzz/corpus. Exits non-zero when anything was found.
#
# The sources of frontend/, ir/ and passes/ are compiled with clang directly; the
# lexer and parser that flex and bison generate are taken from BUILD_DIR/frontend
# (default: ./build, built by ninja first if missing):
#     meson setup build && ninja -C build && tests/fuzz/run_fuzz.sh 60 build
#
# Environment: CLANG (default clang), FUZZ_WORK (default a fresh temporary directory;
# crash-*, leak-*, timeout-* files and the fuzzer's log are kept there), FUZZ_JOBS
# (parallel fuzzing processes, libFuzzer's -fork, default 1; with more than one the
# fuzzing goes on after a crash, to collect several).
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 SECONDS [BUILD_DIR]" >&2
    exit 2
fi
SECONDS_TO_RUN=$1
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${2:-$src/build}
CLANG=${CLANG:-clang}
JOBS=${FUZZ_JOBS:-1}

case $SECONDS_TO_RUN in
    ''|*[!0-9]*) echo "run_fuzz.sh: SECONDS must be a whole number, got '$SECONDS_TO_RUN'" >&2; exit 2 ;;
esac
if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "run_fuzz.sh: $CLANG not found (set CLANG)" >&2
    exit 2
fi
gen=$build/frontend
if [ ! -f "$gen/lexer.c" ] || [ ! -f "$gen/parser.c" ]; then
    if [ -f "$build/build.ninja" ]; then
        ninja -C "$build" frontend/lexer.c frontend/parser.c >/dev/null
    else
        echo "run_fuzz.sh: no generated lexer/parser in $gen (run: meson setup $build && ninja -C $build)" >&2
        exit 2
    fi
fi

work=${FUZZ_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/dmc-fuzz-XXXXXX")}
mkdir -p "$work/corpus" "$work/obj" "$work/artifacts"
work=$(cd "$work" && pwd)
echo "run_fuzz.sh: working in $work"

# Compile each source on its own, so that the generated ones can get their own flags.
flags="-g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -fno-omit-frame-pointer
       -I$src/frontend -I$gen -I$src/ir -I$src/passes -I$src/runtime"  # runtime: passes/explain_quant.c reads dmrt_quant_size.h
objs=""
# on every core (about 60 sources: 100 s one at a time on a 2-core CI machine), a batch of
# as many as there are cores at a time; a failed compile fails the script (set -e on wait)
cores=$(nproc 2>/dev/null || echo 1)
running=0
pids=""
for f in "$src"/frontend/*.c "$src"/ir/*.c "$src"/passes/*.c "$gen/lexer.c" "$gen/parser.c" "$here/fuzz_frontend.c"; do
    o=$work/obj/$(echo "$f" | sed 's|^/||; s|/|_|g').o
    # shellcheck disable=SC2086
    "$CLANG" $flags -w -c "$f" -o "$o" &
    pids="$pids $!"
    objs="$objs $o"
    running=$((running + 1))
    if [ "$running" -ge "$cores" ]; then
        for p in $pids; do wait "$p"; done
        pids=""
        running=0
    fi
done
for p in $pids; do wait "$p"; done
# shellcheck disable=SC2086
"$CLANG" -fsanitize=fuzzer,address,undefined $objs -lm -ljansson -o "$work/fuzz_frontend"

cp "$here"/corpus/* "$work/corpus/"
echo "run_fuzz.sh: fuzzing for ${SECONDS_TO_RUN}s on $(ls "$work/corpus" | wc -l) seeds"
fork=""
# with several processes, keep going after a crash to collect more of them
[ "$JOBS" -gt 1 ] && fork="-fork=$JOBS -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1"
set +e
(
    cd "$work" &&
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ./fuzz_frontend -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 -timeout=10 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
        -dict="$here/dm.dict" $fork corpus
) > "$work/fuzz.log" 2>&1
status=$?
set -e
tail -n 30 "$work/fuzz.log"
found=$(ls "$work/artifacts" | wc -l)
if [ $status -ne 0 ] || [ "$found" -ne 0 ]; then
    echo "run_fuzz.sh: FAILED (status $status); artifacts in $work/artifacts:" >&2
    ls -l "$work/artifacts" >&2
    exit 1
fi
echo "run_fuzz.sh: no crash, leak or timeout in ${SECONDS_TO_RUN}s"
