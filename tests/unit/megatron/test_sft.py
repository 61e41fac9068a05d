"""The warm start's objective on the Megatron backend equals the torch backend's."""

from __future__ import annotations

from pathlib import Path

from agentrl.trainer import TorchLearner
from agentrl.trainer.megatron import MegatronLearner

from .learner_cases import TOL, hf_weights, make_batch, max_weight_diff, save_model

SFT = dict(lr=2e-4, micro_batch_tokens=24, kl_coef=0.0, temperature=0.8, objective="sft")
"""Several micro-batches; the rollout temperature is given but SFT scores at T = 1."""


def test_megatron_sft_gives_the_torch_learners_nll_and_weights(tmp_path: Path):
    model_dir = save_model("llama", tmp_path / "llama")
    batches = [make_batch(1), make_batch(2)]
    torch_learner = TorchLearner(model_dir, **SFT)
    expected = [torch_learner.step(b) for b in batches]
    torch_learner.save(tmp_path / "torch")

    learner = MegatronLearner(model_dir, **SFT)
    try:
        got = [learner.step(b) for b in batches]
        learner.save(tmp_path / "megatron")
    finally:
        learner.close()

    for want, have in zip(expected, got, strict=True):
        for key in ("learner/loss", "learner/tokens", "learner/grad_norm"):
            assert abs(want[key] - have[key]) < TOL * max(1.0, abs(want[key])), (key, want, have)
    trained = hf_weights(tmp_path / "megatron")
    assert max_weight_diff(hf_weights(tmp_path / "torch"), trained) < TOL
    assert max_weight_diff(hf_weights(model_dir), trained) > 20 * TOL  # the update is large
