"""The torch sampler engine on the device: generation, its logprobs against the learner's
on the same device, and a checkpoint written by the learner loaded by the engine."""

from __future__ import annotations

import pytest
import torch

from agentrl.actors.engines.torch import TorchEngine
from agentrl.trainer import TorchLearner

from .helpers import chat_prompts, generations_batch, logprob_gap, synthetic_batch

TEMPERATURE = 0.8

GAP_BOUNDS = {"float32": (1e-3, 2e-2), "bfloat16": (0.1, 2.0)}
"""(mean, max) |engine - learner| logprob per sampled token allowed per dtype. float32:
the same function on both sides up to kernel rounding. bfloat16: both sides round to 8
bits of mantissa in different kernels (the engine's slot forward, the learner's HF forward);
docs/engines.md "dtype" measured 0.024 mean on the CPU for vLLM in bfloat16."""


def _generate(engine, prompts, eos: int, *, top_p: float = 1.0, seed0: int = 0):
    futures = [
        engine.submit(
            p,
            max_new_tokens=48,
            temperature=TEMPERATURE,
            top_p=top_p if i % 2 else 1.0,
            stop_ids=[eos],
            seed=seed0 + i,
        )
        for i, p in enumerate(prompts)
    ]
    return [f.result(timeout=300) for f in futures]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_generates_on_the_device_and_the_learner_scores_its_tokens_alike(
    device, model_dir, tokenizer, dtype, report
):
    prompts = chat_prompts(tokenizer)
    engine = TorchEngine(model_dir, device=device, dtype=dtype, max_batch=8, seed=1)
    try:
        assert engine.device.type == torch.device(device).type
        assert next(engine._model.parameters()).device == engine.device
        generations = _generate(engine, prompts, tokenizer.eos_token_id, top_p=0.9)
        once = _generate(engine, prompts[:1], tokenizer.eos_token_id, seed0=7)
        twice = _generate(engine, prompts[:1], tokenizer.eos_token_id, seed0=7)
    finally:
        engine.close()
    assert all(g.token_ids and g.version == 0 for g in generations)
    # A seeded request draws the same tokens again (its generator is a CPU generator).
    assert once[0].token_ids == twice[0].token_ids

    learner = TorchLearner(
        model_dir, device=device, dtype=dtype, kl_coef=0.0, temperature=TEMPERATURE
    )
    batch = generations_batch(prompts, generations, tokenizer.pad_token_id)
    mean, worst, tokens = logprob_gap(learner.logprobs(batch), batch)
    report(dtype=dtype, sampled_tokens=tokens, logprob_gap_mean=mean, logprob_gap_max=worst)
    bound_mean, bound_max = GAP_BOUNDS[dtype]
    assert mean < bound_mean and worst < bound_max, (mean, worst)


def test_a_checkpoint_written_by_the_learner_is_loaded_by_the_engine(
    device, model_dir, tokenizer, tmp_path, report
):
    learner = TorchLearner(model_dir, device=device, lr=1e-3, kl_coef=1e-3, temperature=0.8)
    metrics = learner.step(synthetic_batch(len(tokenizer)))
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    digest = learner.save(tmp_path / "v000001")
    assert (tmp_path / "v000001" / "DIGEST").read_text().strip() == digest

    prompts = chat_prompts(tokenizer)
    engine = TorchEngine(model_dir, device=device, max_batch=8, seed=2)
    try:
        before = _generate(engine, prompts[:2], tokenizer.eos_token_id)
        engine.load(tmp_path / "v000001", 1).result(timeout=300)
        after = _generate(engine, prompts, tokenizer.eos_token_id)
    finally:
        engine.close()
    assert {g.version for g in before} == {0} and {g.version for g in after} == {1}
    # The engine now samples from the learner's new weights: the learner (which holds
    # them) scores the engine's tokens as the engine recorded them.
    batch = generations_batch(prompts, after, tokenizer.pad_token_id)
    mean, worst, tokens = logprob_gap(learner.logprobs(batch), batch)
    report(sampled_tokens=tokens, logprob_gap_mean=mean, logprob_gap_max=worst)
    assert mean < GAP_BOUNDS["float32"][0] and worst < GAP_BOUNDS["float32"][1]
