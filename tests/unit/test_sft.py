"""The supervised warm start: the NLL objective and the torch backend's `objective="sft"`."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer import TorchLearner, build_batch, resolve_model
from agentrl.trainer._sft import check_objective, masked_nll
from tests.unit.records import trajectory


def test_masked_nll_sums_minus_logp_over_masked_tokens():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.25, -4.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    # -(-1 - 0.5 - 0.25) = 1.75 over 3 tokens: token mean 0.58333
    assert masked_nll(logp, mask).item() == pytest.approx(1.75)
    assert (masked_nll(logp, mask) / mask.sum()).item() == pytest.approx(1.75 / 3)
    with pytest.raises(ValueError, match="differ"):
        masked_nll(logp, mask[:, :2])
    with pytest.raises(ValueError, match="grpo, sft"):
        check_objective("dpo")


def batch_of(masks: list[list[int]], tokens: list[list[int]]):
    trajs = [
        trajectory(m, group=f"g{i}", token_ids=t, reward=1.0, group_size=1)
        for i, (m, t) in enumerate(zip(masks, tokens, strict=True))
    ]
    return build_batch(trajs, pad_id=0)


def expected_nll(model: torch.nn.Module, tokens: list[list[int]], masks: list[list[int]]) -> float:
    """Token-mean NLL at T = 1 written out: -log softmax(logits[t])[token t + 1]."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in zip(tokens, masks, strict=True):
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            logp = torch.log_softmax(logits.double(), dim=-1)
            for t in range(1, len(ids)):
                if mask[t]:
                    total -= logp[t - 1, ids[t]].item()
                    count += 1
    return total / count


@pytest.mark.parametrize("micro_batch_tokens", [4096, 6])
def test_the_sft_step_reports_the_token_mean_nll_at_temperature_1(micro_batch_tokens):
    tokens = [[5, 9, 14, 3, 7, 2], [11, 4, 8, 8]]
    masks = [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0]]
    learner = TorchLearner(
        resolve_model("tiny"),
        lr=1e-3,
        temperature=0.5,  # the rollout's; SFT ignores it
        micro_batch_tokens=micro_batch_tokens,
        objective="sft",
    )
    want = expected_nll(learner.model, tokens, masks)
    seen: list[int] = []  # the LM head's rows per micro-batch: the trained targets only
    hook = learner.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.shape[0]))
    metrics = learner.step(batch_of(masks, tokens))
    hook.remove()
    # targets trained at positions 1, 2, 4 (row 0) and 0, 1 (row 1): 5 of the 12 together
    assert seen == ({4096: [5], 6: [3, 2]}[micro_batch_tokens])
    assert metrics["learner/loss"] == pytest.approx(want, rel=1e-5)
    assert metrics["learner/tokens"] == 5.0 and metrics["learner/grad_norm"] > 0
    assert learner.version == 1
    assert expected_nll(learner.model, tokens, masks) < want  # one AdamW step lowered it


def test_sft_gradient_does_not_depend_on_micro_batching():
    tokens = [[5, 9, 14, 3, 7, 2], [11, 4, 8, 8], [6, 6, 1]]
    masks = [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0], [0, 1, 1]]
    grads = []
    for micro in (4096, 6):
        learner = TorchLearner(resolve_model("tiny"), micro_batch_tokens=micro, objective="sft")
        learner.accumulate_gradients(batch_of(masks, tokens))
        grads.append(torch.cat([p.grad.flatten() for p in learner.model.parameters()]))
    # equal up to float32 summation order: measured 5.7e-6 of the gradient's norm apart
    # (transformers 5.19, torch 2.13), single entries up to 4e-6 (3.7e-4 relative)
    assert float((grads[0] - grads[1]).norm() / grads[0].norm()) < 1e-4
    assert torch.allclose(grads[0], grads[1], rtol=1e-3, atol=1e-5)
    assert not math.isclose(grads[0].abs().sum().item(), 0.0)
