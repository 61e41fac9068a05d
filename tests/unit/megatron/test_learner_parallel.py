"""MegatronLearner over two processes (gloo): TP=2, DP=2 and PP=2 give the TP=1 update.

Rank 0 is this test process; rank 1 is a worker process fed by broadcast. Two
updates on different batches, so the second one also checks the AdamW moments.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.trainer.megatron import MegatronLearner

from .learner_cases import (
    HYPER,
    TOL,
    hf_weights,
    make_batch,
    max_metric_diff,
    max_weight_diff,
    save_model,
)

_BATCHES = (1, 2)


def _train(model_dir: Path, out: Path, **layout) -> list[dict[str, float]]:
    learner = MegatronLearner(model_dir, **layout, **HYPER)
    try:
        metrics = [learner.step(make_batch(seed)) for seed in _BATCHES]
        learner.save(out)
    finally:
        learner.close()
    return metrics


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """Per model kind: (model dir, TP=1 metrics of both updates, TP=1 checkpoint)."""
    cache: dict[str, tuple[Path, list[dict[str, float]], Path]] = {}

    def get(kind: str):
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind)
            model_dir = save_model(kind, root / "model")
            cache[kind] = (model_dir, _train(model_dir, root / "tp1"), root / "tp1")
        return cache[kind]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "layout"),
    [
        ("llama", {"tp": 2}),
        ("llama", {"dp": 2}),
        ("qwen2", {"tp": 2}),
        ("qwen2", {"dp": 2}),
        ("qwen2", {"pp": 2}),  # tied embeddings: their grads are summed across the stages
    ],
    ids=["llama-tp2", "llama-dp2", "qwen2-tp2", "qwen2-dp2", "qwen2-pp2"],
)
def test_two_processes_give_the_single_process_update(kind, layout, reference, tmp_path):
    model_dir, expected, tp1_checkpoint = reference(kind)
    got = _train(model_dir, tmp_path / "out", **layout)
    for want, have in zip(expected, got, strict=True):
        # losses, KL, entropy (vocab-parallel under TP), clip fractions, grad norm, tokens
        assert max_metric_diff(want, have) < TOL, (want, have)
    assert got[0]["learner/micro_batches"] == expected[0]["learner/micro_batches"] > 2
    assert max_weight_diff(hf_weights(tp1_checkpoint), hf_weights(tmp_path / "out")) < TOL
