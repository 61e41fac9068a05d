"""The supervised warm-start objective: token-mean negative log-likelihood.

``agentrl sft`` trains on oracle trajectories built in the rollout's exact
token format (``agentrl.ops.sft.data``). The loss is

    L = - Σ_{b,t} mask[b,t] · log p(target[b,t] | prefix)  /  Σ mask

at temperature 1 (the model's own distribution, not the sampler's
temperature), over every masked token of the *whole* batch: like the GRPO
update, each micro-batch's summed loss is divided by the batch's token count,
so micro-batching only bounds memory. The backends run it when built with
``objective="sft"`` and keep their AdamW and gradient clipping.

Metrics returned in SFT mode (both backends): ``learner/loss`` (the NLL
above), ``learner/tokens``, ``learner/micro_batches`` and, from ``step``,
``learner/grad_norm``.
"""

from __future__ import annotations

import torch

from ._batch import TrainBatch, micro_batches
from ._scoring import logits_at, target_logprobs, trained_positions

__all__ = ["OBJECTIVES", "check_objective", "masked_nll", "sft_gradients"]

OBJECTIVES = ("grpo", "sft")
"""What a learner backend can optimise: the GRPO update or the supervised warm start."""


def check_objective(objective: str) -> str:
    """``objective`` itself, or ValueError naming the valid values."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    return objective


def masked_nll(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood ``-Σ logp · mask`` (a scalar; divide by the token count).

    ``logp``, ``mask``: ``[B, L]``, aligned to the targets (``TrainBatch``).
    """
    if logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} differ")
    return -(logp * mask).sum()


def sft_gradients(
    model: torch.nn.Module,
    batch: TrainBatch,
    *,
    micro_batch_tokens: int,
    device: torch.device,
    autocast: bool = False,
) -> dict[str, float]:
    """Forward/backward the token-mean NLL of ``batch`` into ``.grad``; no optimiser step
    (the forward in bfloat16 under ``torch.autocast`` with ``autocast``).

    Each micro-batch's summed NLL is divided by the masked token count of the
    whole batch, so the accumulated gradient is that of the batch's token mean.
    """
    total = batch.num_tokens
    nll_sum, count = 0.0, 0
    for micro in micro_batches(batch, micro_batch_tokens):
        count += 1
        if micro.num_tokens == 0:
            continue
        keep = trained_positions(micro, device)  # the LM head where a target is trained
        logits = logits_at(model, micro, keep, device, autocast=autocast)
        logp = target_logprobs(logits, micro, keep, 1.0, device)
        nll = masked_nll(logp, micro.loss_mask.to(device))
        (nll / total).backward()
        nll_sum += nll.detach().item()
    return {
        "learner/loss": nll_sum / max(total, 1),
        "learner/tokens": float(total),
        "learner/micro_batches": float(count),
    }
