"""Scoring a micro-batch with a causal LM: logits only where a target is trained.

An agent episode is mostly context: system prompt, tool schemas, tool results. Its
trained (assistant) tokens are a small part of it (10-20% in the levels-0+1 runs). The
LM head (576 x 49,152 for SmolLM2, a fifth of the model's multiply-adds per token) and
the softmax over the vocabulary are needed only where a target is trained, so
``trained_positions`` picks those targets, each by its row and position (`Kept`),
``logits_at`` runs the transformer body on every position (attention needs the whole
context) and the LM head on the kept ones only: ``[N, V]`` logits for N trained targets.
``target_logprobs`` scatters their logprobs back to ``[b, l]``, 0 elsewhere.

Kept per row, not per position: the rows of a micro-batch (a GRPO group's members, in
particular) have their assistant turns at different positions, and logits at the union of
their positions, ``[b, k, V]``, grew with ``b x k``; for 8 members of ~1,200 tokens that
is ~8 x 1,000 x 49,152 values per forward (1.6 GB in float32, several copies alive with
the log-softmax, the entropy and the reference's), which ended a run of 64 episodes in
the kernel's OOM killer at 23.8 GB. Per row it is N x V, N = the trained targets.

The body and the head are called apart where the model's forward is exactly
``lm_head(body(...))`` (`slices_logits`: HF Llama, Qwen2/3 and Mistral models); any
other model computes its logits everywhere and they are indexed.

With ``autocast`` (``learner.autocast``) the forward runs under ``torch.autocast`` in
bfloat16: matrix products in bfloat16 (AMX on this CPU, tensor cores on a GPU) from the
float32 weights, whose gradients and AdamW state stay float32; ``token_logprobs`` upcasts
the logits to float32 before its log-softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._batch import TrainBatch
from ._grpo import token_logprobs

__all__ = [
    "Kept",
    "body_and_head",
    "logits_at",
    "slices_logits",
    "target_logprobs",
    "trained_positions",
]

HEAD_ONLY_TYPES = ("llama", "qwen2", "qwen3", "mistral")
"""Model types whose causal-LM forward is ``lm_head(body(...).last_hidden_state)`` and
nothing else (no logit scaling or soft-capping)."""


@dataclass(frozen=True)
class Kept:
    """The targets of a micro-batch whose logits are computed: ``rows[i]``, ``cols[i]``."""

    rows: torch.Tensor
    cols: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.rows.numel())

    def of_rows(self, rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, Kept]:
        """The entries in ``rows`` (of a micro-batch of ``num_rows``): their indices here,
        and the same targets renumbered for ``micro.select(rows)``."""
        local = torch.full((num_rows,), -1, dtype=torch.long, device=self.rows.device)
        local[rows.to(self.rows.device)] = torch.arange(len(rows), device=self.rows.device)
        mapped = local[self.rows]
        index = (mapped >= 0).nonzero().squeeze(-1)
        return index, Kept(mapped[index], self.cols[index])


def slices_logits(model: torch.nn.Module) -> bool:
    """Whether the LM head of ``model`` can run on chosen positions only: its forward is
    the body then the head (`body_and_head`)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in HEAD_ONLY_TYPES and callable(
        getattr(model, "get_decoder", None)
    )


def body_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (last hidden states) and the LM head of a `slices_logits` model."""
    return model.get_decoder(), model.get_output_embeddings()


def trained_positions(micro: TrainBatch, device: torch.device) -> Kept:
    """Every trained target of ``micro`` (``loss_mask``), by row and position."""
    rows, cols = micro.loss_mask.bool().nonzero(as_tuple=True)
    return Kept(rows.to(device), cols.to(device))


def logits_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    kept: Kept,
    device: torch.device,
    *,
    autocast: bool = False,
) -> torch.Tensor:
    """``[N, V]`` logits of ``model`` on ``micro`` at the ``kept`` targets (computed in
    bfloat16 under ``torch.autocast`` with ``autocast``)."""
    ids = micro.input_ids.to(device)
    mask = micro.attention_mask.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        if slices_logits(model):
            body, head = body_and_head(model)
            hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            return head(hidden[kept.rows, kept.cols])
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return logits[kept.rows, kept.cols]


def target_logprobs(
    logits: torch.Tensor,
    micro: TrainBatch,
    kept: Kept,
    temperature: float,
    device: torch.device,
) -> torch.Tensor:
    """``[b, l]`` float32 logprobs of ``micro``'s targets under ``softmax(logits / T)``, from
    the logits of the ``kept`` targets (``[N, V]``); 0 at every other position."""
    targets = micro.targets().to(device)[kept.rows, kept.cols]
    values = token_logprobs(logits.unsqueeze(0), targets.unsqueeze(0), temperature)[0]
    out = values.new_zeros(micro.input_ids.shape)
    return out.index_put((kept.rows, kept.cols), values)
