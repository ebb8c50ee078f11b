# gpu_session.sh: what a session lent a GPU runs first, in one call of the device tool
# (under 8 minutes): the GPU and CUDA suites, GPT-2 124M against PyTorch eager in each
# precision, and a profile of dmc's step; a summary in $OUT/summary.txt, the tests' logs in
# $OUT/logs.tgz (the device tool brings back a few files, not a folder of logs).
#
# On the build machine first (the GPU machine has no flex or bison, and no oneDNN: the
# build it runs is configured without it, docs/testing.md "GPU sessions"):
#   [ -d build-gpu ] || meson setup build-gpu -Donednn=disabled
#   ninja -C build-gpu && meson introspect build-gpu --tests > tests.json
# then, with the device tool:
#   run(command="bash tests/tools/gpu_session.sh", carry=["build-gpu", "tests.json"], timeout_s=540)
# BUILD (default build-gpu) names the carried build. BUDGET (seconds, default 330) bounds
# the tests; the benchmark gets what is left of SESSION (default 470): a test not started in
# time is reported NOT RUN, one stopped at the budget's end CUT (neither is a failure). On
# the GPU machine every GPU test must run: a skip counts as a failure (SKIP_FAILS).
set -u
OUT=${OUT:-/tmp/out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
start=$(date +%s)
summary="$OUT/summary.txt"
echo "== gpu_session.sh, $(date -u)" > "$summary"
pack_logs() { [ -d "$OUT/logs" ] && tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"; }
[ -f tests.json ] || { echo "tests.json missing: carry it (see the top of this file)" | tee -a "$summary"; exit 2; }
[ -x "$BUILD/driver/dmc" ] || { echo "$BUILD/driver/dmc missing: carry $BUILD (see the top of this file)" | tee -a "$summary"; exit 2; }
. tests/tools/gpu_machine_setup.sh > "$OUT/setup.log" 2>&1
echo "== setup: $(tail -1 "$OUT/setup.log")" >> "$summary"
# cuDNN says why it refuses a graph or plan (errors only): in the failing test's log
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr PYTHONUNBUFFERED=1
echo "== $(nvidia-smi -L 2>&1 | head -1)" >> "$summary"

# the suites, most telling first: kernels and the PyTorch oracles, then the meshes
names=$(/usr/bin/python3 - <<'EOF'
import json
tests = json.load(open("tests.json"))
first = ["gpu-kernels", "gpu-step-end", "gpu-ref-mlp", "gpu-ref-gpt", "gpu-vs-c-mlp", "gpu-vs-c-gpt", "cudnn-sdpa-graph",
         "gpu-attention16", "gpu-attention16-gpt", "gpu-vs-c-llama-gqa", "gpu-ref-ops"]
gpu = [t["name"] for t in tests if any(s.endswith(":gpu") or s == "gpu" for s in t["suite"])]
print(" ".join([n for n in first if n in gpu] + [n for n in gpu if n not in first]))
EOF
)
echo "== the gpu suite ($(echo $names | wc -w) tests, BUDGET ${BUDGET:-330} s)" >> "$summary"
(cd "$BUILD" && BUDGET=${BUDGET:-330} JOBS=${JOBS:-2} SKIP_FAILS=1 /usr/bin/python3 ../tests/tools/run_tests_from_json.py \
    ../tests.json $names) >> "$summary" 2>&1
echo "== tests took $(( $(date +%s) - start )) s" >> "$summary"
# which cuDNN attention graphs planned, per shape (and each form's reason where none did)
grep -h "engine workspace\|plan:" "$OUT/logs/cudnn-sdpa-graph.log" >> "$summary" 2>/dev/null
# which of gpt.dm's product shapes cuBLASLt's bias epilogues took (gpu-kernels' NOTE lines)
grep -h "^NOTE: .*cuBLASLt" "$OUT/logs/gpu-kernels.log" >> "$summary" 2>/dev/null
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
