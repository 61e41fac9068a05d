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

Even at the trained targets only, ``[N, V]`` logits grow with the vocabulary: at
Qwen2.5's 151,936 a micro-batch of 8,192 trained targets holds 5 GB of float32 logits,
as much again of log-softmax kept for the backward pass, three transient copies for the
entropy and the reference's logits, all at once. So the scoring does not take logits:
`outputs_at` returns the final hidden states at the kept targets with the head
(`AtTargets`, ``[N, H]``), and `score` runs the head, the float32 log-softmax, the
target's logprob and the entropy on `chunk_positions` targets at a time, each chunk
under ``torch.utils.checkpoint`` (non-reentrant): its ``[C, V]`` logits are freed once
its ``[C]`` logprobs are out, and the backward pass computes them again, chunk by chunk.
The head's part of a micro-batch's peak memory is then O(C x V) whatever N is
(`bench/chunked_scoring.py` measures it), for one more head matrix product per target
in the backward pass. The logprobs, entropy and gradients are those of the logits taken
whole, up to float32 rounding (a test holds it; under autocast the head's gradient within
bfloat16's, each chunk's bfloat16 gradient being added in float32). A model whose head
cannot run apart hands its ``[N, V]`` logits to the same chunks.

With ``autocast`` (``learner.autocast``) the forward runs under ``torch.autocast`` in
bfloat16: matrix products in bfloat16 (AMX on this CPU, tensor cores on a GPU) from the
float32 weights, whose gradients and AdamW state stay float32; the head's product too,
chunk by chunk, and ``token_logprobs`` upcasts the logits to float32 before its
log-softmax.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ._batch import TrainBatch
from ._grpo import token_entropy, token_logprobs

__all__ = [
    "HEAD_CHUNK_BYTES",
    "AtTargets",
    "Kept",
    "body_and_head",
    "chunk_positions",
    "hidden_at",
    "logits_at",
    "outputs_at",
    "score",
    "slices_logits",
    "spread",
    "target_logprobs",
    "target_scores",
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


HEAD_CHUNK_BYTES = 1 << 28
"""Bytes of one float32 copy of a chunk's logits in `score` (256 MiB); a chunk holds a few
such copies at once (the logits, their float32 log-softmax, the entropy's)."""


def chunk_positions(vocab: int) -> int:
    """Targets per chunk of `score`: one float32 ``[C, V]`` copy in `HEAD_CHUNK_BYTES`
    (441 at a vocabulary of 151,936, 1,365 at 49,152)."""
    return max(1, HEAD_CHUNK_BYTES // (4 * vocab))


@dataclass(frozen=True)
class AtTargets:
    """A model's outputs at the kept targets of a micro-batch, before its LM head.

    ``values``: ``[N, H]`` final hidden states, ``head`` the LM head that makes them
    logits; or, ``head`` None (a model whose head does not run apart), ``[N, V]`` logits.
    ``autocast``: the head's product runs under bfloat16 ``torch.autocast``, as the body did.
    """

    values: torch.Tensor
    head: torch.nn.Module | None
    autocast: bool = False

    @property
    def vocab(self) -> int:
        if self.head is None:
            return int(self.values.shape[-1])
        return int(self.head.weight.shape[0])

    def logits(self, values: torch.Tensor | None = None) -> torch.Tensor:
        """``[n, V]`` logits of ``values`` (rows of ``self.values``; default all of them)."""
        values = self.values if values is None else values
        if self.head is None:
            return values
        with torch.autocast(values.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self.head(values)


def outputs_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    kept: Kept,
    device: torch.device,
    *,
    autocast: bool = False,
) -> AtTargets:
    """``model``'s outputs on ``micro`` at the ``kept`` targets (computed in bfloat16 under
    ``torch.autocast`` with ``autocast``): hidden states and head where `slices_logits`,
    else logits."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        if slices_logits(model):
            hidden = hidden_at(model, micro, kept, device)
            return AtTargets(hidden, body_and_head(model)[1], autocast)
        ids = micro.input_ids.to(device)
        mask = micro.attention_mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return AtTargets(logits[kept.rows, kept.cols], None, autocast)


def hidden_at(
    model: torch.nn.Module, micro: TrainBatch, kept: Kept, device: torch.device
) -> torch.Tensor:
    """``[N, H]`` final hidden states of a `slices_logits` ``model``'s body on ``micro`` at
    the ``kept`` targets (under the caller's autocast, if any)."""
    ids = micro.input_ids.to(device)
    mask = micro.attention_mask.to(device)
    body = body_and_head(model)[0]
    hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return hidden[kept.rows, kept.cols]


def logits_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    kept: Kept,
    device: torch.device,
    *,
    autocast: bool = False,
) -> torch.Tensor:
    """``[N, V]`` logits of ``model`` on ``micro`` at the ``kept`` targets, all at once
    (`outputs_at`, then the head)."""
    return outputs_at(model, micro, kept, device, autocast=autocast).logits()


def score(
    at: AtTargets,
    targets: torch.Tensor,
    temperature: float,
    *,
    entropy: bool = False,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N]`` float32 logprob of each target (``targets`` ``[N]``) under
    ``softmax(logits / T)`` (`token_logprobs`), and with ``entropy`` the ``[N]`` entropy
    of that distribution (`token_entropy`, no gradient), ``chunk`` targets at a time
    (default `chunk_positions`). With gradients on, each chunk runs under a non-reentrant
    checkpoint: only its logprobs stay for the backward pass, which computes its logits
    again (module docstring)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    count = int(targets.numel())
    if at.values.shape[0] != count:
        raise ValueError(f"score: {at.values.shape[0]} outputs for {count} targets")
    size = chunk or chunk_positions(at.vocab)
    logprobs: list[torch.Tensor] = []
    slots: list[list[torch.Tensor]] = []  # each chunk's entropies, once
    for start in range(0, count, size):
        slots.append([])
        part = functools.partial(_chunk, at, temperature, slots[-1] if entropy else None)
        values, chunk_targets = at.values[start : start + size], targets[start : start + size]
        if torch.is_grad_enabled():
            logprobs.append(
                checkpoint(
                    part,
                    values,
                    chunk_targets,
                    use_reentrant=False,
                    preserve_rng_state=False,  # the head draws nothing at random
                )
            )
        else:
            logprobs.append(part(values, chunk_targets))
    if not logprobs:
        empty = at.values.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if entropy else None)
    return torch.cat(logprobs), (torch.cat([s[0] for s in slots]) if entropy else None)


def _chunk(
    at: AtTargets,
    temperature: float,
    slot: list[torch.Tensor] | None,
    values: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """One chunk of `score`: ``[C]`` logprobs of ``targets`` from ``values`` (rows of
    ``at.values``); their entropies put in an empty ``slot``, so not again when the
    backward pass runs this a second time."""
    logits = at.logits(values)
    if slot is not None and not slot:
        with torch.no_grad():
            slot.append(token_entropy(logits.detach(), temperature))
    return token_logprobs(logits[None], targets[None], temperature)[0]


def spread(values: torch.Tensor, micro: TrainBatch, kept: Kept) -> torch.Tensor:
    """``[b, l]``: the ``[N]`` ``values`` of the ``kept`` targets at their places in
    ``micro``, 0 elsewhere."""
    out = values.new_zeros(micro.input_ids.shape)
    return out.index_put((kept.rows, kept.cols), values)


def target_scores(
    at: AtTargets,
    micro: TrainBatch,
    kept: Kept,
    temperature: float,
    device: torch.device,
    *,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`score` of ``micro``'s ``kept`` targets: ``[b, l]`` float32 logprobs (0 at every
    other position) and with ``entropy`` the ``[N]`` entropies."""
    targets = micro.targets().to(device)[kept.rows, kept.cols]
    values, entropies = score(at, targets, temperature, entropy=entropy)
    return spread(values, micro, kept), entropies


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
    return spread(values, micro, kept)
