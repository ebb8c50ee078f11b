# gpu_session.sh: what a session lent a GPU runs first, in one call of the device tool
# (under 8 minutes): the GPU and CUDA suites, GPT-2 124M against PyTorch eager in each
# precision, and a profile of dmc's step; a summary in $OUT/summary.txt, the tests' logs in
# $OUT/logs.tgz (the device tool brings back a few files, not a folder of logs).
#
# On the build machine first (the GPU machine has no flex or bison, and no oneDNN: the
# build it runs is configured without it, docs/gpu.md "Tests"):
#   [ -d build-gpu ] || meson setup build-gpu -Donednn=disabled
#   ninja -C build-gpu && meson introspect build-gpu --tests > build-gpu/tests.json
# then, with the device tool:
#   run(command="bash tests/tools/gpu_session.sh", carry=["build-gpu"], timeout_s=540)
# BUILD (default build-gpu) names the carried build, its test list BUILD/tests.json (or
# ./tests.json). BUDGET (seconds, default 330) bounds the tests, JOBS (default 6) run at a
# time (nvcc builds are most of a test's time, and the machine has 16 cores); the benchmark
# gets what is left of SESSION (default 470): a test not started in time is reported NOT
# RUN, one stopped at the budget's end CUT (neither is a failure). On the GPU machine every
# GPU test must run: a skip counts as a failure (SKIP_FAILS). Each test's line reaches the
# summary as it ends; the logs are packed into $OUT/logs.tgz after the tests.
set -u
OUT=${OUT:-/tmp/out}
BUILD=${BUILD:-build-gpu}
LOGS=${LOGS:-/tmp/gpu_session_logs}   # outside $OUT: the device tool brings back few files
mkdir -p "$OUT"
rm -rf "$LOGS" && mkdir -p "$LOGS"
export LOGS
start=$(date +%s)
summary="$OUT/summary.txt"
echo "== gpu_session.sh, $(date -u)" > "$summary"
pack_logs() { tar czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"; }
tests_json=$BUILD/tests.json
[ -f "$tests_json" ] || tests_json=tests.json
[ -f "$tests_json" ] || { echo "$BUILD/tests.json missing: write it (see the top of this file)" | tee -a "$summary"; exit 2; }
tests_json=$(readlink -f "$tests_json")
[ -x "$BUILD/driver/dmc" ] || { echo "$BUILD/driver/dmc missing: carry $BUILD (see the top of this file)" | tee -a "$summary"; exit 2; }
. tests/tools/gpu_machine_setup.sh > "$LOGS/setup.log" 2>&1
echo "== setup: $(tail -1 "$LOGS/setup.log")" >> "$summary"
if [ "$(readlink -f /work/main)" != "$(readlink -f .)" ]; then
    echo "== /work/main is not this checkout (the tests' paths lead elsewhere): stopped" | tee -a "$summary"
    pack_logs; exit 2
fi
# cuDNN says why it refuses a graph or plan (errors only): in the failing test's log
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr PYTHONUNBUFFERED=1
echo "== $(nvidia-smi -L 2>&1 | head -1)" >> "$summary"

# One small CUDA program first: generated code is compiled with the host compiler's
# warnings as errors, and that compiler here is not the build machine's. Where it fails
# only on that, the session goes on with them as warnings (said in the summary), rather
# than lose every CUDA test to one new warning.
smoke() { "$BUILD/driver/dmc" run examples/gpt.dm --target cuda --set V=256,T=16,C=32,NH=2,L=1,B=4 -- --steps 2 \
    --data text:README.md > "$LOGS/smoke.log" 2>&1; }
if smoke; then
    echo "== smoke: a small gpt.dm --target cuda trained 2 steps ($(tail -1 "$LOGS/smoke.log"))" >> "$summary"
else
    echo "== smoke FAILED: a small gpt.dm --target cuda:" >> "$summary"
    tail -15 "$LOGS/smoke.log" | sed 's/^/   | /' >> "$summary"
    lenient=/tmp/nvcc-lenient
    cat > "$lenient" <<'EOF'
#!/bin/bash
# nvcc without warnings as errors: drops -Werror (and its argument) and ,-Werror
args=(); skip=0
for a in "$@"; do
    if [ "$a" = -Werror ]; then skip=1; continue; fi
    if [ $skip = 1 ]; then skip=0; continue; fi
    args+=("${a//,-Werror/}")
done
exec /usr/local/cuda/bin/nvcc "${args[@]}"
EOF
    chmod +x "$lenient"
    if NVCC=$lenient smoke; then
        export NVCC=$lenient
        echo "== smoke passes without warnings as errors: the session goes on so (NVCC=$lenient); fix the warnings" >> "$summary"
        grep -m5 "warning" "$LOGS/smoke.log" | sed 's/^/   | /' >> "$summary"
    fi
fi

# the suites, most telling first: kernels and the PyTorch oracles, then one test of each
# technique never run on a GPU yet, then the rest (the meshes: many builds each)
names=$(/usr/bin/python3 - "$tests_json" <<'EOF'
import json, sys
tests = json.load(open(sys.argv[1]))
first = ["gpu-kernels", "gpu-step-end", "cudnn-sdpa-graph", "gpu-attention16", "gpu-quant-kernels", "gpu-ref-mlp",
         "gpu-ref-gpt", "gpu-vs-c-mlp", "gpu-vs-c-gpt", "gpu-resume-mlp", "gpu-predict-mlp", "gpu-quantize-int8-weights",
         "gpu-vs-c-dropout", "gpu-ref-param-servers", "gpu-spmd-compress", "gpu-prune", "gpu-distill", "gpu-faults",
         "gpu-attention16-gpt", "gpu-vs-c-llama-gqa", "gpu-ref-ops", "gpu-ref-schedule", "gpu-ref-2bw",
         "gpu-ref-pipedream"]
gpu = [t["name"] for t in tests if any(s.endswith(":gpu") or s == "gpu" for s in t["suite"])]
print(" ".join([n for n in first if n in gpu] + [n for n in gpu if n not in first]))
EOF
)
echo "== the gpu suite ($(echo $names | wc -w) tests, BUDGET ${BUDGET:-330} s, ${JOBS:-6} at a time)" >> "$summary"
(cd "$BUILD" && BUDGET=${BUDGET:-330} JOBS=${JOBS:-6} SKIP_FAILS=1 /usr/bin/python3 ../tests/tools/run_tests_from_json.py \
    "$tests_json" $names) >> "$summary" 2>&1
echo "== tests took $(( $(date +%s) - start )) s" >> "$summary"
# which cuDNN attention graphs planned, per shape (and each form's reason where none did)
grep -h "engine workspace\|plan:" "$LOGS/cudnn-sdpa-graph.log" >> "$summary" 2>/dev/null
# which of gpt.dm's product shapes cuBLASLt's bias epilogues took (gpu-kernels' NOTE lines)
grep -h "^NOTE: .*cuBLASLt" "$LOGS/gpu-kernels.log" >> "$summary" 2>/dev/null
pack_logs

# GPT-2 124M steps: dmc --target cuda against PyTorch eager, each precision (a line each as
# it is measured), with a profile of the bf16 step
left=$(( ${SESSION:-470} - ($(date +%s) - start) ))
if [ "$left" -gt 60 ]; then
    echo "== bench/gpu_gpt2.py (B=8, $left s left)" >> "$summary"
    timeout -k 10 "$left" /usr/bin/python3 bench/gpu_gpt2.py --dmc "$BUILD/driver/dmc" --batches 8 \
        --precisions tf32,bf16,fp16 --steps 10 --profile bf16 --compare-cublaslt > "$OUT/gpu_gpt2.txt" 2>&1
    echo "exit $?" >> "$summary"
    grep "^gpu_gpt2: \|^  B  prec" "$OUT/gpu_gpt2.txt" >> "$summary"
    grep -A8 "^  B  prec" "$OUT/gpu_gpt2.txt" | tail -n +2 >> "$summary"
else
    echo "== bench/gpu_gpt2.py NOT RUN: $left s left" >> "$summary"
fi
echo "== done in $(( $(date +%s) - start )) s" >> "$summary"
cat "$summary"
