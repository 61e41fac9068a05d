#!/usr/bin/env bash
# One run of everything that needs a GPU, on a machine without network:
#   bash tests/gpu/device-check.sh [OUT_DIR]
# Expects, beside the working tree: .whl/ (agentrl's wheel and the dependencies the
# machine lacks, for its Python; peft's for the LoRA test) and .gpu/smollm2/ (SmolLM2's config and tokenizer files:
# the GPU suite and bench/gpu.py build a random model of that shape). Runs the GPU suite
# (tests/gpu), then bench/gpu.py, each under a time limit, the logs and the suite's
# measured figures into OUT_DIR (default ./gpu-out). A stage that fails does not stop the
# next one; the exit code is the suite's. On a CPU, to check this script itself:
#   AGENTRL_GPU_WHEELS=0 AGENTRL_GPU_TEST_DEVICE=cpu AGENTRL_GPU_MODEL_LAYERS=2 \
#   BENCH_ARGS="--device cpu --layers 2 --requests 4 --batches 2x96" bash tests/gpu/device-check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-gpu-out}}"
mkdir -p "$out"
. tests/gpu/wheels.sh
export AGENTRL_GPU_MODEL_SOURCE="${AGENTRL_GPU_MODEL_SOURCE:-$PWD/.gpu/smollm2}"
export AGENTRL_GPU_REPORT="$out/gpu-report.jsonl"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee "$out/machine.txt"
timeout "${SUITE_SECONDS:-300}" python3 -m pytest -m gpu tests/gpu -rs -v -s -p no:cacheprovider \
    2>&1 | tee "$out/suite.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|GPU-REPORT|passed|failed|Error"
suite=${PIPESTATUS[0]}
timeout "${BENCH_SECONDS:-240}" python3 bench/gpu.py --model-source "$AGENTRL_GPU_MODEL_SOURCE" ${BENCH_ARGS:-} \
    2>&1 | tee "$out/bench.log" | grep -E "^(device|model|sampler|learner|megatron)|Error"
echo "suite exit $suite, bench exit ${PIPESTATUS[0]}"
exit "$suite"
