#!/usr/bin/env bash
# bench/learner_step.py on the device machine's CPU (a Xeon with AMX), as on the 2-core
# machines: 2 torch threads pinned to two CPUs of different physical cores, on a random
# model of SmolLM2's shape built from .gpu/smollm2 (its config and tokenizer files).
#   bash bench/results/learner-step/device_learner_step.sh OUT [WAYS]
# Expects .whl/ beside the working tree (agentrl's wheel and what the machine lacks:
# tests/gpu/wheels.sh). Writes lscpu.txt, machine.txt and learner-step.txt to OUT.
# To check this script on a CPU: AGENTRL_GPU_WHEELS=0 LAYERS=2 BENCH_ARGS="--episodes 4 --tokens 96" bash ...
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-device-out}"
ways="${2:-shared+autocast}"
mkdir -p "$out"
. tests/gpu/wheels.sh
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
lscpu > "$out/lscpu.txt"
cpus=$(python3 - <<'EOF'
from pathlib import Path
seen, picked = set(), []
for cpu in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])):
    topo = cpu / "topology"
    core = (topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()
    if core not in seen:
        seen.add(core)
        picked.append(cpu.name[3:])
print(",".join(picked[:2]))
EOF
)
{ echo "cpus $cpus (two physical cores); load $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "capability", torch.backends.cpu.get_cpu_capability(), "transformers", transformers.__version__)'
} 2>&1 | tee "$out/machine.txt"
model=/tmp/smollm2-random
python3 -c 'import sys; from agentrl.trainer._models import write_random_model as w
w(".gpu/smollm2", sys.argv[1], seed=0, num_hidden_layers=int(sys.argv[2]) or None)' \
    "$model" "${LAYERS:-0}" || exit 1
start=$(date +%s)
taskset -c "$cpus" python3 bench/learner_step.py --model "$model" --threads 2 --repeats 1 \
    --ways "$ways" ${BENCH_ARGS:-} 2>&1 | grep -v -E "Loading weights|Writing model|info  " | tee "$out/learner-step.txt"
echo "bench exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$out/learner-step.txt"
