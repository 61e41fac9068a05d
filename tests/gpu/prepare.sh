#!/usr/bin/env bash
# Run here, before a device-machine call: builds what tests/gpu/device-check.sh expects beside
# the working tree, which that machine (no network; its own torch and transformers) lacks:
#   .whl/          agentrl's wheel and the dependencies the machine's image does not hold,
#                  for its Python 3.12 (megatron-core for the Megatron test)
#   .gpu/smollm2/  SmolLM2-135M-Instruct's config and tokenizer files (no weights: the suite
#                  and the benches build a random model of that shape)
# Both are ignored by git (.git/info/exclude) and carried by the call: carry [".whl", ".gpu"].
#   bash tests/gpu/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
for path in /.whl/ /.gpu/; do
    grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude
done
rm -rf .whl .gpu
mkdir -p .whl .gpu/smollm2
python3 -m pip wheel --quiet --no-deps . -w .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    gguf pika pykka structlog rdflib isodate docker PyMySQL megatron-core==0.16.1
model=$(python3 -c 'from agentrl.trainer import resolve_model; print(resolve_model("smollm2"))')
cp "$model"/config.json "$model"/generation_config.json "$model"/tokenizer*.json .gpu/smollm2/
for template in "$model"/*.jinja; do  # the chat template, where transformers saved it apart
    if [ -e "$template" ]; then cp "$template" .gpu/smollm2/; fi
done
du -sh .whl .gpu
