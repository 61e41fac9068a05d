"""LoRA RL on the device: the adapters' update against the same update on the CPU, and the
engine on the device merging the adapter checkpoint and scoring as the learner."""

from __future__ import annotations

import pytest
import torch

from agentrl.actors.engines.torch import TorchEngine
from agentrl.trainer import LoraSpec, TorchLearner
from agentrl.trainer._lora import merged_state

from .helpers import (
    chat_prompts,
    generations_batch,
    hf_weights,
    logprob_gap,
    relative_difference,
    synthetic_batch,
)

pytest.importorskip("peft", reason="the lora extra (peft) is not installed: put its wheel in .whl/")

HYPER = dict(lr=1e-3, kl_coef=0.05, temperature=0.8, lora=LoraSpec(rank=16, alpha=32.0))
"""Adapters on every linear layer; KL on: the base's forward with the adapters disabled."""

UPDATE_TOLERANCE = 0.02
"""Largest ||W_a - W_b|| / ||W_a - W_0|| between the merged weights after the same updates
on the device and on the CPU (as test_learner_gpu's full-model bound)."""

GAP_BOUND = (1e-3, 2e-2)
"""(mean, max) |engine - learner| logprob per sampled token in float32 (test_engine_gpu's)."""


def _merged(learner: TorchLearner, out) -> dict[str, torch.Tensor]:
    learner.save(out)
    return merged_state(out)


def test_lora_updates_on_the_device_as_on_the_cpu_and_the_engine_merges_them(
    device, model_dir, tokenizer, tmp_path, report
):
    batches = [synthetic_batch(len(tokenizer), seed=s) for s in (1, 2)]
    on_device = TorchLearner(model_dir, device=device, **HYPER)
    assert on_device.reference is None  # the base itself is the reference
    lora_params = [p for n, p in on_device.model.named_parameters() if ".lora_" in n]
    assert all(p.device.type == torch.device(device).type for p in lora_params)
    got = [on_device.step(b) for b in batches]
    state = on_device.optimizer.state[lora_params[0]]
    assert state["exp_avg"].device.type == torch.device(device).type
    device_weights = _merged(on_device, tmp_path / "device")
    on_cpu = TorchLearner(model_dir, device="cpu", **HYPER)
    want = [on_cpu.step(b) for b in batches]
    cpu_weights = _merged(on_cpu, tmp_path / "cpu")
    del on_cpu
    base = hf_weights(model_dir)
    adapted = [k for k in cpu_weights if not torch.equal(cpu_weights[k], base[k])]
    assert adapted  # the updates moved the merged target weights
    diff = relative_difference(
        {k: cpu_weights[k] for k in adapted}, {k: device_weights[k] for k in adapted}, base
    )
    kl = max(abs(w["learner/kl"] - g["learner/kl"]) for w, g in zip(want, got, strict=True))

    prompts = chat_prompts(tokenizer)
    engine = TorchEngine(model_dir, device=device, max_batch=8, seed=1)
    try:
        engine.load(tmp_path / "device", version=2).result(timeout=300)
        futures = [
            engine.submit(p, max_new_tokens=32, temperature=0.8, top_p=1.0,
                          stop_ids=[tokenizer.eos_token_id], seed=i)
            for i, p in enumerate(prompts)
        ]  # fmt: skip
        generations = [f.result(timeout=300) for f in futures]
    finally:
        engine.close()
    assert {g.version for g in generations} == {2}
    batch = generations_batch(prompts, generations, tokenizer.pad_token_id)
    mean, worst, tokens = logprob_gap(on_device.logprobs(batch), batch)
    report(
        lora_update_rel_diff_vs_cpu=diff, lora_kl_abs_diff_vs_cpu=kl,
        lora_engine_gap_mean=mean, lora_engine_gap_max=worst, tokens=tokens,
    )  # fmt: skip
    assert diff < UPDATE_TOLERANCE and kl < 1e-4, (diff, kl)
    assert mean < GAP_BOUND[0] and worst < GAP_BOUND[1], (mean, worst, tokens)
