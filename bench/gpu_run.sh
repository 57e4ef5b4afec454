#!/bin/bash
# The GPU checks, in one call on a lent machine with one NVIDIA GPU (bench/results/gpu.md has what
# they showed). distrun is installed from its wheel and run from a directory outside the source, as
# a user runs it; the jobs come from `distrun examples`. Needs: python3 with torch (CUDA), and the
# wheels in .whl/ (paramiko and its needs, py-spy, torchft and its needs; gpu.md lists them).
#   bash bench/gpu_run.sh            # on the GPU machine; logs and job files go to $OUT
#   SMALL=1 bash bench/gpu_run.sh    # the same steps on CPU with tiny sizes (checks the script)
#   ONLY="ft held" bash bench/gpu_run.sh   # only the steps named (doctor doctor-json bandwidth compare ft held ps)
set -u
OUT=${OUT:-/tmp/gpu-out}
SRC=$PWD
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

rm -rf /tmp/site /tmp/wheel
# One install into one --target (a second --upgrade install there would replace its bin/).
python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/wheel . 2>/dev/null || python3 -m pip wheel -q --no-deps -w /tmp/wheel . || exit 1
wheels=(/tmp/wheel/distrun-*.whl)
[ -n "${SMALL:-}" ] || wheels+=(.whl/*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${wheels[@]}" || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 DISTRUN_HOME=/tmp/dh
rm -rf /tmp/w && mkdir -p /tmp/w && cd /tmp/w || exit 1
step() {  # step NAME SECONDS COMMAND...: run it, say its exit status and time, show its last lines
    local name=$1 limit=$2 start rc
    shift 2
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || return 0
    echo "=== $name: $*"
    start=$(date +%s)
    timeout "$limit" "$@" >"/tmp/w/$name.log" 2>&1
    rc=$?
    echo "=== $name: exit $rc after $(( $(date +%s) - start )) s"
    tail -n "${TAILN:-12}" "/tmp/w/$name.log"
}

nvidia-smi -L
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
torch.cuda.nccl.version() if torch.cuda.is_available() else None, "python", sys.version.split()[0])'
python3 -c 'import orchestrator; print("distrun from", orchestrator.__file__)'; command -v distrun
distrun examples >/dev/null && ls jobs

if [ -n "${SMALL:-}" ]; then IMAGE=32; BATCH=4; STEPS=12; LOG=1; KILL_AT=4; else IMAGE=224; BATCH=96; STEPS=60; LOG=10; KILL_AT=30; fi
mkdir -p compare-gpu
for f in jobs/compare/*.yaml; do
    sed -e "s/--image-size, \"32\"/--image-size, \"$IMAGE\"/" -e "s/--batch-size, \"4\"/--batch-size, \"$BATCH\"/" "$f" \
        >"compare-gpu/$(basename "$f")"
done
cat >ft-gpu.yaml <<EOF
name: ft-gpu
script: jobs/train_resnet50.py
args: [--strategy, ft-ddp, --model, resnet50, --image-size, "$IMAGE", --batch-size, "$BATCH", --steps, "$STEPS",
       --log-every, "$LOG"]
nnodes: 1
spares: 1
nproc_per_node: 1
env: {RUST_LOG: warn}
restarts: {max: 1, backoff: 1}
fault_tolerance: {min_replicas: 1}
EOF
cp "$SRC/bench/gpu_held_job.py" .
cat >held.yaml <<EOF
name: gpu-held
script: gpu_held_job.py
nproc_per_node: 1
EOF

TAILN=40 step doctor 60 distrun doctor
step doctor-json 60 distrun doctor --json
TAILN=30 step bandwidth 120 distrun doctor --bandwidth
TAILN=60 step compare 300 distrun bench compare-gpu -o "$OUT/compare.html"
# ft-ddp on NCCL: one replica group (one GPU runs one NCCL rank); its worker is SIGKILLed at its
# step KILL_AT and the group is relaunched on the spare, "gpu1", the same machine under another name.
printf 'nodes:\n  - {name: gpu0, host: localhost, transport: local}\n  - {name: gpu1, host: localhost, transport: local}\n' >two.yaml
(for i in $(seq 400); do
    sleep 0.5
    if [ "$i" -gt 20 ] && ! pgrep -f 'launch ft-gpu.yaml' >/dev/null; then break; fi
    if grep -qs "ft step $KILL_AT " /tmp/w/ft.log; then
        pkill -KILL -n -f 'strategy ft-ddp' && echo "=== killed the ft worker at step $KILL_AT"
        break
    fi
done) &
killer=$!
TAILN=40 step ft 240 distrun launch ft-gpu.yaml -i two.yaml
wait "$killer"
TAILN=25 step held 120 distrun launch held.yaml
echo "=== compute processes left on the GPU:"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
step ps 30 distrun ps
python3 - <<'EOF'
import json, pathlib
for tel in sorted(pathlib.Path("/tmp/dh/jobs").glob("*/telemetry.jsonl")):
    lines = tel.read_text().splitlines()
    gpu = [line for line in lines if '"util"' in line]
    print(f"=== {tel.parent.name}: {len(lines)} telemetry lines, {len(gpu)} with a GPU's figures; the last:")
    print((gpu or lines or ["(none)"])[-1][:700])
EOF
tar czf "$OUT/jobs.tgz" -C /tmp w dh/jobs 2>/dev/null
ls -la "$OUT"
