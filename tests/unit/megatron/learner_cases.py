"""Shared pieces of the MegatronLearner tests: tiny model directories, batches, comparisons."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.trainer import TrainBatch, build_batch
from tests.unit.records import trajectory

from .tiny import MODELS, VOCAB

HYPER = dict(
    lr=2e-4,
    micro_batch_tokens=24,
    kl_coef=0.1,
    temperature=0.8,
    weight_decay=0.01,
    warmup_steps=2,
    is_cap=2.0,
)
"""Learner settings of every comparison: KL on (reference passes), several micro-batches,
the lr warmup (its step count resumes with AdamW's), truncated importance weights."""

TOL = 1e-5
"""Largest allowed difference between two layouts or backends (float32, CPU)."""


def save_model(kind: str, directory: Path) -> Path:
    """Write the tiny ``kind`` model (see tiny.py) as an HF directory; returns it."""
    _config, model = MODELS[kind]()
    model.save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    return directory


def make_batch(seed: int) -> TrainBatch:
    """Six episodes, three groups, two tasks, lengths 5..12, stale rollout logprobs (one row
    so stale that its importance weights exceed the cap and are truncated)."""
    gen = torch.Generator().manual_seed(seed)

    def traj(
        group: str,
        task: str,
        reward: float,
        n: int,
        prompt: int,
        version: int = 0,
        logprob: float = -5.0,
    ):
        return trajectory(
            [0] * prompt + [1] * (n - prompt),
            group=group,
            reward=reward,
            logprob=logprob,
            version=version,
            episode_id=f"{seed}-{group}-{n}-{reward}",
            task=task,
            token_ids=torch.randint(0, VOCAB, (n,), generator=gen).tolist(),
        )

    return build_batch(
        [
            traj("g1", "os", 1.0, 12, 5),
            traj("g1", "os", 0.0, 7, 3, version=1),
            traj("g2", "db", 1.0, 10, 4),
            traj("g2", "db", -0.2, 5, 2),
            traj("g3", "db", 1.0, 9, 4, version=1, logprob=-7.5),
            traj("g3", "db", 0.5, 11, 2),
        ],
        pad_id=0,
    )


def hf_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory's safetensors files."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest elementwise difference of two HF state dicts with the same keys."""
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def max_metric_diff(a: dict[str, float], b: dict[str, float]) -> float:
    """Largest difference of two metric dicts with the same keys."""
    assert sorted(a) == sorted(b)
    return max(abs(a[k] - b[k]) for k in a)
