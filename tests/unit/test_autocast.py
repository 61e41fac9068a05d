"""bfloat16 autocast in the torch learner: float32 master weights and AdamW state, the
forward in bfloat16, the same update as float32 within bfloat16's rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.trainer import TorchLearner, _scoring

from .test_torch_learner import make_batch, model_dir, on_policy  # noqa: F401 (fixture)

HYPER = dict(lr=1e-3, kl_coef=0.05, temperature=0.8)


def test_autocast_needs_float32_master_weights(model_dir):  # noqa: F811
    with pytest.raises(ValueError, match="float32 master weights"):
        TorchLearner(model_dir, dtype="bfloat16", autocast=True)


def test_the_forward_runs_in_bfloat16_and_the_logprobs_in_float32(model_dir):  # noqa: F811
    learner = TorchLearner(model_dir, autocast=True, **HYPER)
    batch = make_batch()
    keep = _scoring.trained_positions(batch, learner.device)
    logits = _scoring.logits_at(learner.model, batch, keep, learner.device, autocast=True)
    assert logits.dtype == torch.bfloat16  # the LM head ran under autocast
    plain = _scoring.logits_at(learner.model, batch, keep, learner.device)
    assert plain.dtype == torch.float32
    assert learner.logprobs(batch).dtype == torch.float32


def test_the_reference_stores_its_linear_weights_in_bfloat16_with_the_same_logits(
    model_dir,  # noqa: F811
):
    learner = TorchLearner(model_dir, autocast=True, **HYPER)
    plain = TorchLearner(model_dir, **HYPER).reference  # float32, cast at every call
    reference = learner.reference
    linears = [m for m in reference.modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    head = reference.get_output_embeddings()
    tied = head.weight is reference.get_input_embeddings().weight
    assert all(m.weight.dtype == torch.bfloat16 for m in linears if m is not head or not tied)
    assert reference.get_input_embeddings().weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())
    batch = make_batch()
    keep = _scoring.trained_positions(batch, learner.device)
    got = _scoring.logits_at(reference, batch, keep, learner.device, autocast=True)
    want = _scoring.logits_at(plain, batch, keep, learner.device, autocast=True)
    assert torch.equal(got, want)


def test_an_autocast_update_keeps_float32_state_and_matches_float32(model_dir):  # noqa: F811
    fp32, want, auto, got = float32_and(model_dir, autocast=True)
    params = list(auto.model.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    moments = auto.optimizer.state[params[0]]
    assert moments["exp_avg"].dtype == moments["exp_avg_sq"].dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: ~0.4% per product. The loss terms agree to a few
    # percent, the entropy (a float32 log-softmax of bfloat16 logits) much closer.
    for key in ("learner/pg_loss", "learner/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=0.05), key
    assert got["learner/entropy"] == pytest.approx(want["learner/entropy"], rel=1e-2)
    # The weights moved the same way: the autocast update's direction agrees with float32's.
    cosine = update_cosine(model_dir, fp32, auto)
    assert cosine > 0.95, cosine


def float32_and(weights: Path, **other) -> tuple:
    """One update of the same batch by a float32 learner and by one built with ``other``:
    ``(fp32, its metrics, the other, its metrics)``."""
    fp32 = TorchLearner(weights, **HYPER)
    batch = on_policy(fp32, make_batch())
    want = fp32.step(batch)
    learner = TorchLearner(weights, **other, **HYPER)
    return fp32, want, learner, learner.step(batch)


def update_cosine(weights: Path, a: TorchLearner, b: TorchLearner) -> float:
    """The cosine between two learners' updates of the same initial ``weights``."""
    before = TorchLearner(weights, **HYPER).model.state_dict()
    wa, wb = a.model.state_dict(), b.model.state_dict()
    du = torch.cat([(wa[k] - before[k]).flatten() for k in wa])
    dv = torch.cat([(wb[k] - before[k]).flatten() for k in wa])
    return float(du @ dv / (du.norm() * dv.norm()))


def test_the_config_wires_autocast_to_bfloat16_engines_and_refuses_other_masters():
    from agentrl.ops import ConfigError, parse_config

    base = {"run": "r", "tasks": {"calculator": {}}}
    cfg = parse_config({**base, "learner": {"autocast": True}})
    assert cfg.learner.autocast and cfg.learner.share_prefix is None  # the learner decides
    assert cfg.learner.engine_dtype() == "bfloat16" and cfg.learner.dtype == "float32"
    assert parse_config(base).learner.engine_dtype() == "float32"
    for bad in ({"autocast": True, "dtype": "bfloat16"}, {"autocast": True, "backend": "megatron"}):
        with pytest.raises(ConfigError, match=r"learner\.autocast: needs dtype float32"):
            parse_config({**base, "learner": bad})
