# gpu_session.sh: what a session lent a GPU runs first, in one call of the device tool
# (under 8 minutes): the GPU and CUDA suites, GPT-2 124M against PyTorch eager in each
# precision, and a profile of dmc's step; a summary in $OUT/summary.txt, logs beside it.
#
# On the build machine first (the GPU machine has no flex, bison or meson of its own):
#   ninja -C build && meson introspect build --tests > tests.json
# then, with the device tool:
#   run(command="bash tests/tools/gpu_session.sh", carry=["build", "tests.json"], timeout_s=540)
# BUDGET (seconds, default 330) bounds the tests; the benchmark gets what is left of
# SESSION (default 470): a test not started in time is reported NOT RUN, not failed.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
summary="$OUT/summary.txt"
. tests/tools/gpu_machine_setup.sh > "$OUT/setup.log" 2>&1
# cuDNN says why it refuses a graph or plan (errors only): in the failing test's log
export CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr
{ echo "== $(nvidia-smi -L 2>&1 | head -1)"; date -u; } > "$summary"
[ -f tests.json ] || { echo "tests.json missing: carry it (see the top of this file)" | tee -a "$summary"; exit 2; }

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
(cd build && BUDGET=${BUDGET:-330} JOBS=${JOBS:-2} /usr/bin/python3 ../tests/tools/run_tests_from_json.py \
    ../tests.json $names) >> "$summary" 2>&1
echo "== tests took $(( $(date +%s) - start )) s" >> "$summary"
# which cuDNN attention graphs planned, per shape (and each form's reason where none did)
grep -h "engine workspace\|plan:" "$OUT/logs/cudnn-sdpa-graph.log" >> "$summary" 2>/dev/null
# which of gpt.dm's product shapes cuBLASLt's bias epilogues took (gpu-kernels' NOTE lines)
grep -h "^NOTE: .*cuBLASLt" "$OUT/logs/gpu-kernels.log" >> "$summary" 2>/dev/null

# GPT-2 124M steps: dmc --target cuda against PyTorch eager, each precision, with a profile
left=$(( ${SESSION:-470} - ($(date +%s) - start) ))
if [ "$left" -gt 60 ]; then
    echo "== bench/gpu_gpt2.py (B=8, $left s left)" >> "$summary"
    timeout "$left" /usr/bin/python3 bench/gpu_gpt2.py --dmc build/driver/dmc --batches 8 \
        --precisions tf32,bf16,fp16 --steps 10 --profile --compare-cublaslt > "$OUT/gpu_gpt2.txt" 2>&1
    echo "exit $?" >> "$summary"
    grep -A8 "^  B  prec" "$OUT/gpu_gpt2.txt" >> "$summary" || tail -20 "$OUT/gpu_gpt2.txt" >> "$summary"
    grep "f32 attention kernel instead\|cuBLASLt" "$OUT/gpu_gpt2.txt" >> "$summary"
else
    echo "== bench/gpu_gpt2.py NOT RUN: $left s left" >> "$summary"
fi
echo "== done in $(( $(date +%s) - start )) s" >> "$summary"
cat "$summary"
