#!/usr/bin/env bash
# One run of everything that needs a GPU, on a machine without network:
#   bash tests/gpu/device-check.sh [OUT_DIR]
# Expects, beside the working tree (`bash tests/gpu/prepare.sh` builds both, here): .whl/
# (agentrl's wheel and the dependencies the machine lacks, for its Python) and .gpu/smollm2/
# (SmolLM2's config and tokenizer files: the GPU suite and the benches build a random model
# of that shape). Runs the GPU suite
# (tests/gpu), then bench/gpu.py, then bench/learner_step.py on the device (every way of
# the update against today's float32, on the synthetic batch and on 5 groups of a learning
# run's real episodes), each under a time limit, the logs and the suite's measured figures
# into OUT_DIR (default ./gpu-out). A stage that fails does not stop the next one; the exit
# code is the suite's. A stage's *_SECONDS=0 skips it. On a CPU, to check this script itself:
#   AGENTRL_GPU_WHEELS=0 AGENTRL_GPU_TEST_DEVICE=cpu AGENTRL_GPU_MODEL_LAYERS=2 \
#   BENCH_ARGS="--device cpu --layers 2 --requests 4 --batches 2x96" \
#   STEP_ARGS="--device cpu --repeats 1 --episodes 4 --tokens 96 --groups 1" bash tests/gpu/device-check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-gpu-out}}"
mkdir -p "$out"
. tests/gpu/wheels.sh
export AGENTRL_GPU_MODEL_SOURCE="${AGENTRL_GPU_MODEL_SOURCE:-$PWD/.gpu/smollm2}"
export AGENTRL_GPU_REPORT="$out/gpu-report.jsonl"
TRACE="${TRACE:-$PWD/bench/results/rl60-full-s2-60min/trace.sqlite}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee "$out/machine.txt"
suite=skipped
if [ "${SUITE_SECONDS:-300}" != 0 ]; then
    timeout "${SUITE_SECONDS:-300}" python3 -m pytest -m gpu tests/gpu -rs -v -s -p no:cacheprovider \
        2>&1 | tee "$out/suite.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|GPU-REPORT|passed|failed|Error"
    suite=${PIPESTATUS[0]}
fi
bench=skipped
if [ "${BENCH_SECONDS:-240}" != 0 ]; then
    timeout "${BENCH_SECONDS:-240}" python3 bench/gpu.py --model-source "$AGENTRL_GPU_MODEL_SOURCE" \
        ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" | grep -E "^(device|model|sampler|learner|megatron)|Error"
    bench=${PIPESTATUS[0]}
fi
step=skipped
if [ "${STEP_SECONDS:-240}" != 0 ]; then
    model=/tmp/agentrl-smollm2-random
    python3 -c 'import sys; from agentrl.trainer._models import write_random_model as w
w(sys.argv[1], sys.argv[2], seed=0, num_hidden_layers=int(sys.argv[3]) or None)' \
        "$AGENTRL_GPU_MODEL_SOURCE" "$model" "${AGENTRL_GPU_MODEL_LAYERS:-0}" || exit 1
    cp "$TRACE" /tmp/agentrl-trace.sqlite || exit 1  # (reading it writes -wal and -shm beside it)
    args="--model $model --device cuda --repeats 3"
    args="$args --ways every-position,autocast,bf16,shared,shared+autocast,shared+bf16"
    timeout "${STEP_SECONDS:-240}" bash -c "python3 bench/learner_step.py $args ${STEP_ARGS:-} &&
        python3 bench/learner_step.py $args --trace /tmp/agentrl-trace.sqlite --groups 5 ${STEP_ARGS:-}" \
        2>&1 | grep -v -E "Loading weights|Writing model|info  " | tee "$out/learner-step.log"
    step=${PIPESTATUS[0]}
fi
echo "suite exit $suite, bench exit $bench, learner_step exit $step"
exit "$suite"
