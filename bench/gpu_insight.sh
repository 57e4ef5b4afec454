#!/bin/bash
# On a lent GPU, what distrun shows of a run that prints nothing for it (issue 45) and the DeepSpeed
# example on CUDA (issue 48): distrun from this checkout (PYTHONPATH), its needs from the wheels in
# .whl/ (paramiko and the rest, deepspeed and its needs, for Python 3.12), the local backend, 1 GPU.
#   bash bench/gpu_insight.sh     # on the lent machine (device tool: run, carry [".whl"]); files to $OUT
set -u
OUT=${OUT:-/tmp/gpu-out}
SRC=$PWD
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$SRC:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 DISTRUN_HOME=/tmp/dh
distrun() { python3 -m orchestrator "$@"; }
rm -rf /tmp/w && mkdir -p /tmp/w && cd /tmp/w || exit 1
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'

echo "=== ddp-gpu: a program that prints nothing for distrun, NCCL"
cp "$SRC/bench/gpu_ddp_job.py" .
cat >ddp-gpu.yaml <<YAML
name: ddp-gpu
script: gpu_ddp_job.py
args: [--seconds, "40"]
nproc_per_node: 1
rendezvous: {backend: static, port: auto}
max_restarts: 0
telemetry: {interval: 1}
YAML
timeout 300 python3 -m orchestrator launch ddp-gpu.yaml --backend local --no-live >"$OUT/ddp-launch.log" 2>&1
echo "launch exit $?"; tail -n 15 "$OUT/ddp-launch.log"
job=$(ls -t /tmp/dh/jobs | head -1)
echo "collectives.jsonl lines: $(wc -l </tmp/dh/jobs/$job/collectives.jsonl)"
distrun ps --json >"$OUT/ps.json"
distrun trace "$job" -o "$OUT/trace.json"; echo "trace exit $?"
python3 - "$OUT/trace.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
slices = [e for e in events if e.get("ph") == "X"]
print("slices", len(slices), "first", slices[:1], "missing", (trace.get("otherData") or {}).get("missing"))
PY

echo "=== deepspeed: the ZeRO-3 example on CUDA"
cp "$SRC"/jobs/deepspeed_zero.py "$SRC"/jobs/deepspeed_config.json "$SRC"/jobs/deepspeed.yaml "$SRC"/jobs/quick_exit.py .
sed -i 's/nproc_per_node: auto/nproc_per_node: 1/' deepspeed.yaml
timeout 300 python3 -m orchestrator launch deepspeed.yaml --backend local --no-live --metrics-lines >"$OUT/ds-launch.log" 2>&1
echo "launch exit $?"; tail -n 25 "$OUT/ds-launch.log"
echo "=== compute processes left: [$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader)]"
