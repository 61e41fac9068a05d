"""Scoring a micro-batch with a causal LM: logits only where a target is trained.

An agent episode is mostly context: system prompt, tool schemas, tool results. Its
trained (assistant) tokens are a small part of it (10-20% in the levels-0+1 runs). The
LM head (576 x 49,152 for SmolLM2, a fifth of the model's multiply-adds per token) and
the softmax over the vocabulary are needed only where a target is trained, so
``trained_positions`` picks those positions, ``logits_at`` computes the logits there
(``logits_to_keep``, HF causal LMs since transformers 4.50), and ``target_logprobs``
scatters the logprobs back to ``[b, l]``, 0 elsewhere. The transformer body still runs
on every position: attention needs the whole context.

With ``autocast`` (``learner.autocast``) the forward runs under ``torch.autocast`` in
bfloat16: matrix products in bfloat16 (AMX on this CPU, tensor cores on a GPU) from the
float32 weights, whose gradients and AdamW state stay float32; ``token_logprobs`` upcasts
the logits to float32 before its log-softmax.
"""

from __future__ import annotations

import inspect

import torch

from ._batch import TrainBatch
from ._grpo import token_logprobs

__all__ = ["logits_at", "slices_logits", "target_logprobs", "trained_positions"]


def slices_logits(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (a tensor of positions computes
    the LM head there only)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def trained_positions(
    model: torch.nn.Module, micro: TrainBatch, device: torch.device
) -> torch.Tensor:
    """``[k]`` long: the positions where some row of ``micro`` has a trained target
    (``loss_mask``); every position when ``model`` cannot slice its logits."""
    if not slices_logits(model):
        return torch.arange(micro.input_ids.shape[1], device=device)
    return micro.loss_mask.bool().any(dim=0).nonzero().squeeze(-1).to(device)


def logits_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    keep: torch.Tensor,
    device: torch.device,
    *,
    autocast: bool = False,
) -> torch.Tensor:
    """``[b, k, V]`` logits of ``model`` on ``micro`` at the ``keep`` positions (computed in
    bfloat16 under ``torch.autocast`` with ``autocast``)."""
    sliced = keep.numel() < micro.input_ids.shape[1]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(
            input_ids=micro.input_ids.to(device),
            attention_mask=micro.attention_mask.to(device),
            use_cache=False,
            **({"logits_to_keep": keep} if sliced else {}),
        ).logits


def target_logprobs(
    logits: torch.Tensor,
    micro: TrainBatch,
    keep: torch.Tensor,
    temperature: float,
    device: torch.device,
) -> torch.Tensor:
    """``[b, l]`` float32 logprobs of ``micro``'s targets under ``softmax(logits / T)``, from
    the logits of the ``keep`` positions (``[b, k, V]``); 0 at every other position."""
    targets = micro.targets().to(device)[:, keep]
    kept = token_logprobs(logits, targets, temperature)
    return kept.new_zeros(micro.input_ids.shape).index_copy(1, keep, kept)
