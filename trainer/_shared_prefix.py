"""A GRPO group's shared prompt forwarded once per update, not once per member.

The G episodes of a group start from the same prompt (system prompt, tool schemas,
the task's first message): 62-85% of a batch's context tokens in the levels-0+1 runs.
Computed per row, that prompt costs G forward passes, G backward passes and G more for
the KL reference. Here the rows of one group share it:

1. ``s`` = the group's longest common prefix, kept before its first trained target and
   before the rows' last shared token (whose logits are needed);
2. the prefix runs once (batch of 1) with the model's KV cache on; its per-layer keys
   and values are expanded (a view, no copy) to the rows of the group in a micro-batch;
   a group split over several micro-batches computes it in the first and attends it in
   each (`GroupPrefixes`: once per update and model);
3. the rows' continuations run on that cache at positions ``s ..`` with the full
   attention mask, and the LM head runs at each row's own trained targets
   (`_scoring.Kept`), chunk by chunk (`_scoring.score`) from the final hidden states
   there, which the groups' pieces assemble (`shared_outputs_at`).

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
from ._scoring import HEAD_ONLY_TYPES, AtTargets, Kept, body_and_head, hidden_at, slices_logits

__all__ = [
    "GroupPrefixes",
    "can_share",
    "common_prefix",
    "group_micro_batch_rows",
    "group_micro_batches",
    "share_lengths",
    "shared_logits_at",
    "shared_outputs_at",
]

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


def share_lengths(batch: TrainBatch) -> dict[int, int]:
    """Each group's prompt length ``s`` computed once (0: its rows run unshared), from all
    of its rows in ``batch``: their common prefix, kept before the first trained target and
    before the rows' last shared token (`_share_length`). Rows that agree beyond it (the
    members' first assistant tokens alike, or whole episodes alike) still compute every
    position after ``s``, each row its own."""
    out: dict[int, int] = {}
    lengths = batch.attention_mask.sum(dim=1)
    kept = Kept(*batch.loss_mask.bool().nonzero(as_tuple=True))
    for group in torch.unique(batch.group_index).tolist():
        rows = (batch.group_index == group).nonzero().squeeze(-1)
        _, local = kept.of_rows(rows, batch.num_rows)
        s = _share_length(batch, rows, lengths[rows], local)
        out[group] = s if len(rows) >= 2 and s >= MIN_SHARED else 0
    return out


class GroupPrefixes:
    """Each group's shared prompt computed once per update and model, whatever the
    micro-batches its rows fall into.

    `group_micro_batches` splits a group too large for one micro-batch into chunks; run
    apart, every chunk forwarded the prompt again (and its backward and the reference's
    forward again): on the 96 trained groups of the seed-2 arm, 33% more positions than
    the prompt once (342,145 against 257,173; alfworld groups came in 4 chunks, webshop's
    in 6.7). Here the first chunk computes the prompt's keys and values; every chunk of the
    group attends a detached copy of them (``grad``: a leaf that gathers the chunks'
    gradients) and, after the group's last micro-batch has gone backward (`done`), the
    gathered gradients run back through the prompt's own graph: the gradient of the
    unshared computation, up to float summation order (a test holds it). Memory stays
    within `group_micro_batches`'s budget: a chunk's cost counts the prompt.

    ``lengths``: each group's prompt length ``s`` (0: its rows run unshared), from all of
    its rows in ``batch`` (every chunk attends the same prompt). Without ``grad`` (the
    reference, under ``torch.no_grad``) the chunks attend the prompt's tensors themselves.
    """

    def __init__(self, batch: TrainBatch, micros: list[TrainBatch], *, grad: bool) -> None:
        self.grad = grad
        self.lengths = share_lengths(batch)
        self._left: dict[int, int] = {}
        for micro in micros:
            for group in torch.unique(micro.group_index).tolist():
                self._left[group] = self._left.get(group, 0) + 1
        self._kv: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    @classmethod
    def of(cls, micro: TrainBatch) -> GroupPrefixes:
        """One micro-batch on its own: each group's prompt within it, attended directly
        (the continuation's graph runs through it; nothing for `done`)."""
        return cls(micro, [], grad=False)

    def keys_values(self, body: torch.nn.Module, ids: torch.Tensor, group: int) -> list:
        """The group's prompt keys and values per layer ``[(k, v)]``, ``ids`` its tokens
        ``[1, s]``: computed at the group's first call."""
        if group not in self._kv:
            cache = body(input_ids=ids, use_cache=True).past_key_values
            roots = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            if self.grad and torch.is_grad_enabled():  # (a frozen base's keys need none)
                used = [t.detach().requires_grad_(True) if t.requires_grad else t for t in roots]
            else:
                used, roots = roots, []
            self._kv[group] = (roots, used)
        used = self._kv[group][1]
        return list(zip(used[0::2], used[1::2], strict=True))

    def done(self, micro: TrainBatch) -> None:
        """After ``micro``'s backward: the prompts of groups with no micro-batch left send
        their gathered gradients back through their own graph, then go."""
        for group in torch.unique(micro.group_index).tolist():
            self._left[group] -= 1
            if self._left[group] or group not in self._kv:
                continue
            roots, used = self._kv.pop(group)
            if not roots:  # attended directly: nothing gathered
                continue
            pairs = [
                (r, u.grad)
                for r, u in zip(roots, used, strict=True)
                if r.requires_grad and u.grad is not None
            ]
            if pairs:
                torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])


def shared_logits_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    kept: Kept,
    device: torch.device,
    *,
    autocast: bool = False,
    prefixes: GroupPrefixes | None = None,
) -> torch.Tensor:
    """``[N, V]`` logits of ``model`` on ``micro`` at the ``kept`` targets, all at once
    (`shared_outputs_at`, then the head)."""
    return shared_outputs_at(
        model, micro, kept, device, autocast=autocast, prefixes=prefixes
    ).logits()


def shared_outputs_at(
    model: torch.nn.Module,
    micro: TrainBatch,
    kept: Kept,
    device: torch.device,
    *,
    autocast: bool = False,
    prefixes: GroupPrefixes | None = None,
) -> AtTargets:
    """``[N, H]`` final hidden states of ``model`` on ``micro`` at the ``kept`` targets and
    its head, each group's shared prefix computed once (`_scoring.outputs_at`'s result,
    shared work): once per update with ``prefixes`` (`GroupPrefixes`), else once in this
    micro-batch."""
    from transformers import DynamicCache

    if prefixes is None:
        prefixes = GroupPrefixes.of(micro)
    body, head = body_and_head(model)
    ids = micro.input_ids.to(device)
    mask = micro.attention_mask.to(device)
    lengths = micro.attention_mask.sum(dim=1)
    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []  # indices into kept, their states
    alone: list[torch.Tensor] = []  # rows of groups without a prefix worth sharing
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        for group in torch.unique(micro.group_index).tolist():
            rows = (micro.group_index == group).nonzero().squeeze(-1)
            index, local = kept.of_rows(rows, micro.num_rows)
            if not local.count:
                continue
            s = prefixes.lengths[group]
            if not s:
                alone.append(rows)
                continue
            n = len(rows)
            # the group's rows run to the longest of them, not to the micro-batch's width:
            # a micro-batch packs groups of other lengths (`group_micro_batches` counts each
            # group's rows padded to its own longest), and the padding would cost
            # activations for positions no target needs
            width = int(lengths[rows].max())
            layers = prefixes.keys_values(body, ids[rows[:1], :s], group)
            cache = DynamicCache(
                ddp_cache_data=[
                    (k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in layers
                ],
                config=model.config,
            )
            hidden = body(
                input_ids=ids[rows.to(device), s:width],
                attention_mask=mask[rows.to(device), :width],
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
            pieces.append((index, hidden[local.rows, local.cols - s]))
        if alone:  # one batched forward for all of them, as without sharing
            rows = torch.cat(alone)
            index, local = kept.of_rows(rows, micro.num_rows)
            width = max(1, int(lengths[rows].max()))
            pieces.append((index, hidden_at(model, micro.select(rows, width), local, device)))
    if not pieces:
        raise ValueError("shared_outputs_at: no kept target in the micro-batch")
    out = pieces[0][1].new_empty((kept.count, pieces[0][1].shape[-1]))
    for index, values in pieces:
        out[index] = values
    return AtTargets(out, head, autocast)


def group_micro_batches(batch: TrainBatch, max_tokens: int) -> list[TrainBatch]:
    """Micro-batches of whole groups where they fit, each costing its groups' shared
    prefix once plus every row's padded rest (``max_tokens`` bounds that cost). The prefix
    is the one computed once (`share_lengths`), not the rows' whole common prefix: rows
    alike past their first trained target compute those positions each (8 identical
    webshop episodes of 1,457 tokens once went into one micro-batch of 8,471 positions
    against a budget of 2,048).

    A group too large for one micro-batch is split into chunks (each still shares its
    prefix); rows keep the batch's advantages (splitting never renormalises).
    """
    lengths = batch.attention_mask.sum(dim=1)
    return [_cut(batch, rows, lengths) for rows in group_micro_batch_rows(batch, max_tokens)]


def group_micro_batch_rows(batch: TrainBatch, max_tokens: int) -> list[list[int]]:
    """The rows of each of `group_micro_batches`'s micro-batches, in its order."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = batch.attention_mask.sum(dim=1)
    share = share_lengths(batch)
    chunks: list[tuple[list[int], int]] = []  # rows, cost
    for group in torch.unique(batch.group_index).tolist():
        rows = (batch.group_index == group).nonzero().squeeze(-1)
        rows = rows[torch.argsort(lengths[rows], descending=True, stable=True)].tolist()
        shared = share[group]  # the positions computed once, as `GroupPrefixes` does
        current: list[int] = []
        for row in rows:
            longest = int(lengths[current[0]]) if current else int(lengths[row])
            if current and shared + (len(current) + 1) * (longest - shared) > max_tokens:
                chunks.append((current, shared + len(current) * (longest - shared)))
                current = []
            current.append(row)
        longest = int(lengths[current[0]])
        chunks.append((current, shared + len(current) * (longest - shared)))
    out: list[list[int]] = []
    rows_now: list[int] = []
    cost_now = 0
    for rows, cost in chunks:
        if rows_now and cost_now + cost > max_tokens:
            out.append(rows_now)
            rows_now, cost_now = [], 0
        rows_now += rows
        cost_now += cost
    if rows_now:
        out.append(rows_now)
    return out
