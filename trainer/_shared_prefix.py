"""A GRPO group's shared prompt forwarded once per micro-batch, not once per member.

The G episodes of a group start from the same prompt (system prompt, tool schemas,
the task's first message): 62-85% of a batch's context tokens in the levels-0+1 runs.
Computed per row, that prompt costs G forward passes, G backward passes and G more for
the KL reference. Here the rows of one group in a micro-batch share it:

1. ``s`` = the rows' longest common prefix, kept before the first trained target of
   the micro-batch and before the rows' last shared token (whose logits are needed);
2. the prefix runs once (batch of 1) with the model's KV cache on; its per-layer keys
   and values are expanded (a view, no copy) to the group's ``n`` rows;
3. the rows' continuations run on that cache at positions ``s ..`` with the full
   attention mask, and the LM head runs at each row's own trained targets
   (`_scoring.Kept`).

The cached keys and values carry their autograd history, so the backward pass sends
each member's gradient into the one prefix computation, summed over the members: the
same gradient as the unshared computation, up to float summation order (a test holds
it). The attention of the continuation over the prefix is still computed per row, and
keeps no attention probabilities for the backward pass: torch's CPU attention runs its
flash kernel under the explicit mask too (a test holds it), so a micro-batch's memory is
its activations, bounded by `group_micro_batches`'s token budget: each group's rows run
to the longest of them, not to the micro-batch's width (a test holds it). Measured on 2
cores, SmolLM2 under autocast, one update of 40 real episodes (5 groups of 8, 39,240
tokens, micro-batches of 2,048 tokens): 8.4 GB peak shared, against 3.6 GB unshared with
gradient checkpointing. Before each group ran to its own width, a micro-batch of that
update computed 6,534 positions against its budget of 2,048, and the peak was 13.8 GB;
the update took 162 s shared against 233 s checkpointed (bench/results/rl60-full-s1/
README.md). In the 60-minute seed-1 arm (8 groups of 8 per update, the samplers beside
it), updates took 211-289 s (bench/results/rl60-full-s1-60min/).

Where it applies: HF Llama, Qwen2, Qwen3 and Mistral models (``DynamicCache``, the body
and the head called apart) without gradient checkpointing (HF drops the cache under it);
anything else takes the unshared path. The rows of groups without a prefix worth
sharing run together in one batched forward. By default it is on for CPU learners
only: on an H100 the per-group passes (and HF's attention with an explicit mask over
the cache) made a SmolLM2-sized update slower, 0.81 s against 0.32 s for 8 episodes
of 1,100 tokens under autocast (`bench/gpu.py`), where a CPU is bound by the
matrix products the prefix saves. `group_micro_batches` packs micro-batches by
group so a group's rows meet in one micro-batch, counting its prefix once.
"""

from __future__ import annotations

import torch

from ._batch import TrainBatch, _cut
from ._scoring import HEAD_ONLY_TYPES, Kept, body_and_head, logits_at, slices_logits

__all__ = ["can_share", "common_prefix", "group_micro_batches", "shared_logits_at"]

SHARED_TYPES = HEAD_ONLY_TYPES
"""The model types the shared path runs: those whose body and head are called apart
(`_scoring.slices_logits`); a test builds each and compares the logits per row."""

MIN_SHARED = 8
"""Prefixes shorter than this are not worth a forward pass of their own."""


def can_share(model: torch.nn.Module) -> bool:
    """Whether `shared_logits_at` can run ``model`` (module docstring)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SHARED_TYPES:
        return False
    if getattr(cfg, "sliding_window", None) is not None and getattr(
        cfg, "use_sliding_window", True
    ):
        return False
    return slices_logits(model) and not getattr(model, "is_gradient_checkpointing", False)


def common_prefix(input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Longest prefix shared by every row of ``input_ids`` ``[n, L]`` within its real tokens."""
    if input_ids.shape[0] == 1:
        return int(lengths[0])
    differ = (input_ids != input_ids[:1]).any(dim=0)
    first = int(differ.nonzero()[0]) if bool(differ.any()) else input_ids.shape[1]
    return min(first, int(lengths.min()))


def _share_length(micro: TrainBatch, rows: torch.Tensor, lengths: torch.Tensor, kept: Kept) -> int:
    """Positions of ``rows``' common prefix computed once (``lengths``: the rows' own)."""
    shared = common_prefix(micro.input_ids[rows], lengths)
    first_kept = int(kept.cols.min()) if kept.count else micro.input_ids.shape[1]
    return max(0, min(shared - 1, first_kept))


def shared_logits_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    kept: Kept,
    device: torch.device,
    *,
    autocast: bool = False,
) -> torch.Tensor:
    """``[N, V]`` logits of ``model`` on ``micro`` at the ``kept`` targets, each group's
    shared prefix computed once (`_scoring.logits_at`'s result, shared work)."""
    from transformers import DynamicCache

    body, head = body_and_head(model)
    ids = micro.input_ids.to(device)
    mask = micro.attention_mask.to(device)
    lengths = micro.attention_mask.sum(dim=1)
    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []  # indices into kept, their logits
    alone: list[torch.Tensor] = []  # rows of groups without a prefix worth sharing
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        for group in torch.unique(micro.group_index):
            rows = (micro.group_index == group).nonzero().squeeze(-1)
            index, local = kept.of_rows(rows, micro.num_rows)
            if not local.count:
                continue
            s = _share_length(micro, rows, lengths[rows], local)
            n = len(rows)
            if n < 2 or s < MIN_SHARED:
                alone.append(rows)
                continue
            # the group's rows run to the longest of them, not to the micro-batch's width:
            # a micro-batch packs groups of other lengths (`group_micro_batches` counts each
            # group's rows padded to its own longest), and the padding would cost
            # activations for positions no target needs
            width = int(lengths[rows].max())
            prefix = body(input_ids=ids[rows[:1], :s], use_cache=True)
            cache = DynamicCache(
                ddp_cache_data=[
                    (layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1))
                    for layer in prefix.past_key_values.layers
                ],
                config=model.config,
            )
            hidden = body(
                input_ids=ids[rows.to(device), s:width],
                attention_mask=mask[rows.to(device), :width],
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
            pieces.append((index, head(hidden[local.rows, local.cols - s])))
    if alone:  # one batched forward for all of them, as without sharing
        rows = torch.cat(alone)
        index, local = kept.of_rows(rows, micro.num_rows)
        width = max(1, int(lengths[rows].max()))
        logits = logits_at(model, micro.select(rows, width), local, device, autocast=autocast)
        pieces.append((index, logits))
    if not pieces:
        raise ValueError("shared_logits_at: no kept target in the micro-batch")
    out = pieces[0][1].new_empty((kept.count, pieces[0][1].shape[-1]))
    for index, logits in pieces:
        out[index] = logits
    return out


def group_micro_batches(batch: TrainBatch, max_tokens: int) -> list[TrainBatch]:
    """Micro-batches of whole groups where they fit, each costing its groups' shared
    prefix once plus every row's padded rest (``max_tokens`` bounds that cost).

    A group too large for one micro-batch is split into chunks (each still shares its
    prefix); rows keep the batch's advantages (splitting never renormalises).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = batch.attention_mask.sum(dim=1)
    chunks: list[tuple[list[int], int]] = []  # rows, cost
    for group in torch.unique(batch.group_index):
        rows = (batch.group_index == group).nonzero().squeeze(-1)
        rows = rows[torch.argsort(lengths[rows], descending=True, stable=True)].tolist()
        shared = common_prefix(batch.input_ids[rows], lengths[rows])
        current: list[int] = []
        for row in rows:
            longest = int(lengths[current[0]]) if current else int(lengths[row])
            if current and shared + (len(current) + 1) * (longest - shared) > max_tokens:
                chunks.append((current, shared + len(current) * (longest - shared)))
                current = []
            current.append(row)
        longest = int(lengths[current[0]])
        chunks.append((current, shared + len(current) * (longest - shared)))
    out: list[TrainBatch] = []
    rows_now: list[int] = []
    cost_now = 0
    for rows, cost in chunks:
        if rows_now and cost_now + cost > max_tokens:
            out.append(_cut(batch, rows_now, lengths))
            rows_now, cost_now = [], 0
        rows_now += rows
        cost_now += cost
    if rows_now:
        out.append(_cut(batch, rows_now, lengths))
    return out
