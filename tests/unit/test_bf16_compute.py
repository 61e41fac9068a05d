"""bfloat16 compute in the torch learner (``bf16_compute``): the passes on a bfloat16 copy
of the float32 masters, refreshed once per update; gradients gathered into float32 after
each micro-batch; the same update as float32 within bfloat16's rounding."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer import LoraSpec, TorchLearner

from .test_autocast import float32_and, update_cosine
from .test_torch_learner import make_batch, model_dir, on_policy  # noqa: F401 (fixture)

HYPER = dict(lr=1e-3, kl_coef=0.05, temperature=0.8)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(dtype="bfloat16"), "float32 master weights"),
        (dict(autocast=True), "replaces autocast"),
        (dict(lora=LoraSpec(rank=2, alpha=4.0)), "unset lora"),
        (dict(objective="sft"), "grpo objective only"),
    ],
)
def test_bf16_compute_refuses_what_it_cannot_run(model_dir, settings, message):  # noqa: F811
    with pytest.raises(ValueError, match=message):
        TorchLearner(model_dir, bf16_compute=True, **settings)


def test_the_passes_run_on_a_bfloat16_copy_refreshed_from_float32_masters(
    model_dir,  # noqa: F811
):
    learner = TorchLearner(model_dir, bf16_compute=True, **HYPER)
    assert all(p.dtype == torch.bfloat16 for p in learner.compute.parameters())
    assert all(p.dtype == torch.bfloat16 for p in learner.reference.parameters())
    masters = list(learner.model.parameters())
    assert all(p.dtype == torch.float32 for p in masters)
    batch = on_policy(learner, make_batch())
    assert learner.logprobs(batch).dtype == torch.float32
    learner.step(batch)
    moments = learner.optimizer.state[masters[0]]
    assert moments["exp_avg"].dtype == moments["exp_avg_sq"].dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in masters)
    assert all(p.grad is None for p in learner.compute.parameters())
    # the copy still holds the weights before the update until the next pass needs it
    stale = [c for _, c in learner._pairs]
    assert not all(torch.equal(c, m.to(torch.bfloat16)) for m, c in learner._pairs)
    learner.logprobs(batch)
    assert all(torch.equal(c, m.to(torch.bfloat16)) for m, c in learner._pairs)
    assert all(a is b for a, b in zip(stale, learner.compute.parameters(), strict=True))
    # a tied LM head stays tied in the copy
    head, embedding = (
        learner.compute.get_output_embeddings(),
        learner.compute.get_input_embeddings(),
    )
    assert (head.weight is embedding.weight) == (
        learner.model.get_output_embeddings().weight is learner.model.get_input_embeddings().weight
    )


def test_the_first_update_has_zero_kl_to_the_bfloat16_reference(model_dir):  # noqa: F811
    learner = TorchLearner(model_dir, bf16_compute=True, **HYPER)
    metrics = learner.step(on_policy(learner, make_batch()))
    assert metrics["learner/kl"] == 0.0  # the copy and the reference: the same bf16 weights


def test_each_micro_batch_gradient_is_added_into_float32(model_dir, monkeypatch):  # noqa: F811
    learner = TorchLearner(model_dir, bf16_compute=True, micro_batch_tokens=16, **HYPER)
    batch = on_policy(learner, make_batch())
    seen = []
    gather = learner._gather_gradients

    def spy(micro=None):
        seen.append(sum(p.grad is not None for p in learner.compute.parameters()))
        gather(micro)
        assert all(p.grad is None for p in learner.compute.parameters())
        assert all(
            p.grad is None or p.grad.dtype == torch.float32 for p in learner.model.parameters()
        )

    monkeypatch.setattr(learner, "_gather_gradients", spy)
    metrics = learner.accumulate_gradients(batch)
    assert metrics["learner/micro_batches"] > 1
    assert len(seen) == metrics["learner/micro_batches"] and all(seen)
    # the same gradient as one micro-batch, within bfloat16's rounding
    whole = TorchLearner(model_dir, bf16_compute=True, micro_batch_tokens=4096, **HYPER)
    whole.accumulate_gradients(batch)
    got = torch.cat([p.grad.flatten() for p in learner.model.parameters()])
    want = torch.cat([p.grad.flatten() for p in whole.model.parameters()])
    assert float((got - want).norm() / want.norm()) < 0.02


def test_a_bf16_compute_update_matches_float32(model_dir):  # noqa: F811
    fp32, want, bf16, got = float32_and(model_dir, bf16_compute=True)
    for key in ("learner/pg_loss", "learner/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=0.05), key
    assert got["learner/entropy"] == pytest.approx(want["learner/entropy"], rel=2e-2)
    cosine = update_cosine(model_dir, fp32, bf16)
    assert cosine > 0.95, cosine


def test_the_config_wires_bf16_compute_and_refuses_what_it_cannot_run():
    from agentrl.ops import ConfigError, parse_config

    base = {"run": "r", "tasks": {"calculator": {}}}
    cfg = parse_config({**base, "learner": {"bf16_compute": True}})
    assert cfg.learner.bf16_compute and cfg.learner.engine_dtype() == "bfloat16"
    for bad, message in (
        ({"dtype": "bfloat16"}, "needs dtype float32"),
        ({"backend": "megatron"}, "needs dtype float32"),
        ({"autocast": True}, "replaces learner.autocast"),
        ({"lora": {"rank": 4}}, "unset learner.lora"),
    ):
        with pytest.raises(ConfigError, match=rf"learner\.bf16_compute: .*{message}"):
            parse_config({**base, "learner": {"bf16_compute": True, **bad}})


def test_the_sft_warm_start_of_a_bf16_compute_run_runs_under_autocast():
    from agentrl.ops import parse_config
    from agentrl.ops.sft.train import _backend_factory
    from agentrl.trainer import resolve_model

    raw = {"run": "r", "model": "tiny", "tasks": {"calculator": {}}}
    cfg = parse_config({**raw, "learner": {"bf16_compute": True}})
    learner = _backend_factory(cfg)(resolve_model("tiny"), 1e-4)
    assert learner.autocast and not learner.bf16_compute and learner.objective == "sft"


def test_an_update_that_raised_leaves_no_gradient_for_the_next(model_dir, monkeypatch):  # noqa: F811
    learner = TorchLearner(model_dir, bf16_compute=True, micro_batch_tokens=16, **HYPER)
    batch = on_policy(learner, make_batch())
    gather = learner._gather_gradients
    calls = []

    def fail_after_the_first(micro=None):
        calls.append(micro)
        if len(calls) > 1:
            raise RuntimeError("out of memory")  # the second micro-batch's grads stay on the copy
        gather(micro)

    monkeypatch.setattr(learner, "_gather_gradients", fail_after_the_first)
    with pytest.raises(RuntimeError):
        learner.accumulate_gradients(batch)
    assert any(p.grad is not None for p in learner.compute.parameters())
    monkeypatch.setattr(learner, "_gather_gradients", gather)
    learner.optimizer.zero_grad(set_to_none=True)
    learner.accumulate_gradients(batch)
    got = torch.cat([p.grad.flatten() for p in learner.model.parameters()])
    fresh = TorchLearner(model_dir, bf16_compute=True, micro_batch_tokens=16, **HYPER)
    fresh.accumulate_gradients(batch)
    want = torch.cat([p.grad.flatten() for p in fresh.model.parameters()])
    assert torch.equal(got, want)
