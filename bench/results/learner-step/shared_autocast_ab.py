"""Seconds per update of one way, shared prompt + bfloat16 autocast, on `bench/learner_step.py`'s
synthetic batch (8 episodes x 1,100 tokens, groups of 4 sharing 70%): one learner, one
untimed update, two timed. Run from a checkout's root with the agentrl to time importable;
for an older commit, a package folder of its trees first on the path:

    python bench/results/learner-step/shared_autocast_ab.py
    git worktree add /tmp/old 68bced8 --detach && mkdir -p /tmp/oldpkg/agentrl \
      && touch /tmp/oldpkg/agentrl/__init__.py && for d in actors messages trainer environments \
      ops; do ln -s /tmp/old/$d /tmp/oldpkg/agentrl/$d; done
    (cd /tmp/old && PYTHONPATH=/tmp/oldpkg python /path/to/shared_autocast_ab.py)
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig

import agentrl.trainer
from agentrl.trainer import TorchLearner, resolve_model

sys.path.insert(0, str(Path.cwd() / "bench"))
from learner_step import synthetic_batch


def main() -> None:
    print(agentrl.trainer.__file__)
    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2")
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = synthetic_batch(8, 1100, 4, 0.12, vocab, shared=0.7)
    learner = TorchLearner(
        model_dir,
        micro_batch_tokens=2048,
        gradient_checkpointing=False,
        autocast=True,
        share_prefix=True,
    )
    batch = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
    learner.step(batch)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        learner.step(batch)
        seconds.append(time.perf_counter() - start)
    print("shared+autocast", [round(x, 2) for x in seconds], flush=True)


if __name__ == "__main__":
    main()
