"""MegatronLearner with TP = PP = DP = 1 (one process) against the torch backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from agentrl.trainer import TorchLearner, checkpoint_digest
from agentrl.trainer.megatron import MegatronLearner, UnsupportedModelError

from .learner_cases import (
    HYPER,
    TOL,
    hf_weights,
    make_batch,
    max_metric_diff,
    max_weight_diff,
    save_model,
)


@pytest.fixture
def close_after():
    """Learners to close at the end of the test (they own the process group)."""
    learners: list[MegatronLearner] = []
    yield learners
    for learner in learners:
        learner.close()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tp1_gives_the_torch_learners_losses_and_weights(kind, tmp_path: Path, close_after):
    model_dir = save_model(kind, tmp_path / kind)
    batches = [make_batch(1), make_batch(2)]
    torch_learner = TorchLearner(model_dir, **HYPER)
    expected = [torch_learner.step(b) for b in batches]
    torch_learner.save(tmp_path / "torch")

    learner = MegatronLearner(model_dir, **HYPER)
    close_after.append(learner)
    got = [learner.step(b) for b in batches]
    digest = learner.save(tmp_path / "megatron")

    for want, have in zip(expected, got, strict=True):
        assert max_metric_diff(want, have) < TOL, (want, have)
    assert "learner/kl" in got[1] and got[1]["learner/kl"] > 0  # the reference pass ran
    assert "rollout/logprob_gap_current" in got[0]  # rows sampled by version 0
    assert learner.version == 2 and learner.steps == 2
    initial = hf_weights(model_dir)
    trained = hf_weights(tmp_path / "megatron")
    assert max_weight_diff(hf_weights(tmp_path / "torch"), trained) < TOL
    assert max_weight_diff(initial, trained) > 20 * TOL  # the update is large enough to compare
    assert digest == checkpoint_digest(tmp_path / "megatron")
    assert (tmp_path / "megatron" / "DIGEST").read_text().strip() == digest


def test_an_empty_batch_changes_nothing_and_checkpoints_load_in_transformers(
    tmp_path: Path, close_after
):
    from transformers import AutoModelForCausalLM

    model_dir = save_model("qwen2", tmp_path / "qwen2")
    learner = MegatronLearner(model_dir, **HYPER)
    close_after.append(learner)
    batch = make_batch(1)
    empty = dataclasses.replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
    metrics = learner.step(empty)
    assert metrics["learner/tokens"] == 0 and metrics["learner/grad_norm"] == 0.0
    assert learner.version == 1 and learner.steps == 0  # no update; the actor saves it as v1
    learner.save(tmp_path / "out")
    assert max_weight_diff(hf_weights(model_dir), hf_weights(tmp_path / "out")) == 0.0
    assert (tmp_path / "out" / "tokenizer_config.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert reloaded.config.tie_word_embeddings  # qwen2 tiny: lm_head tied, not stored


def test_a_layout_the_model_cannot_split_is_refused_before_any_process_starts(tmp_path: Path):
    model_dir = save_model("llama", tmp_path / "llama")  # 4 heads, 2 KV heads, 96 wide, 2 layers
    with pytest.raises(UnsupportedModelError) as info:
        MegatronLearner(model_dir, tp=4, pp=3, **HYPER)
    assert str(info.value).endswith(
        "2 KV heads do not split over tp=4; 2 layers do not split over pp=3"
    )
    assert not torch.distributed.is_initialized()


def test_without_a_state_for_its_version_the_learner_starts_with_fresh_moments(
    tmp_path: Path, close_after
):
    model_dir = save_model("qwen2", tmp_path / "qwen2")
    state = tmp_path / "learner_state"
    learner = MegatronLearner(model_dir, state_dir=state, state_every=2, **HYPER)
    learner.step(make_batch(1))
    learner.save(tmp_path / "v1")  # update 1: no state (every 2nd update only)
    learner.close()
    assert not (state / "v000001").exists()
    resumed = MegatronLearner(tmp_path / "v1", version=1, state_dir=state, state_every=2, **HYPER)
    close_after.append(resumed)
    assert all(not s for s in resumed._rank.optimizer.state.values())  # zero moments
    resumed.step(make_batch(2))
    resumed.save(tmp_path / "v2")
    assert (state / "v000002" / "metadata.json").exists()
