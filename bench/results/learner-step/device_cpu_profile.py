"""CPU op profile of one learner update, shared prompt + bfloat16 autocast, then with LoRA r16
too, on a random model of a config's shape (device-cpu-profile.txt was run so, on the device
machine's CPU, 2 threads):

    python bench/results/learner-step/device_cpu_profile.py CONFIG_DIR LAYERS EPISODES TOKENS
    # e.g. .gpu/smollm2 0 4 1100 (LAYERS 0: the config's own)

CONFIG_DIR holds a model's config and tokenizer files; the batch is `bench/learner_step.py`'s
synthetic one (groups of 4 sharing their first 70%, 12% trained).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig

from agentrl.trainer import LoraSpec, TorchLearner
from agentrl.trainer._models import write_random_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from learner_step import synthetic_batch


def main() -> None:
    source = Path(sys.argv[1])
    layers, episodes, tokens = (int(a) for a in sys.argv[2:5])
    torch.set_num_threads(2)
    model_dir = write_random_model(source, tempfile.mkdtemp(), num_hidden_layers=layers or None)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = synthetic_batch(episodes, tokens, 4, 0.12, vocab, shared=0.7)
    lora = LoraSpec(rank=16, alpha=32.0)
    ways = [("shared+autocast", {}), ("lora+shared+autocast", {"lora": lora})]
    for label, extra in ways:
        learner = shared_prompt_learner(model_dir, autocast=True, **extra)
        scored = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
        learner.step(scored)
        start = time.perf_counter()
        learner.step(scored)
        print(label, "step", round(time.perf_counter() - start, 3), flush=True)
        print_profiled_step(learner, scored, rows=45)


def shared_prompt_learner(model_dir, **mode) -> TorchLearner:
    """The learner these profiles time: micro-batches of 2,048 tokens, gradient
    checkpointing off, the shared prompt on, on the CPU; ``mode``: its precision (LoRA)."""
    return TorchLearner(
        model_dir,
        micro_batch_tokens=2048,
        gradient_checkpointing=False,
        share_prefix=True,
        device="cpu",
        **mode,
    )


def print_profiled_step(learner: TorchLearner, batch, *, rows: int) -> None:
    """One more update of ``batch`` under the CPU profiler; prints its ``rows`` costliest
    ops by their own time."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        learner.step(batch)
    table = prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60
    )
    print(table, flush=True)


if __name__ == "__main__":
    main()
