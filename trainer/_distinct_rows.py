"""Rows alike token for token, forwarded once per update.

A sharp policy samples the same episode more than once. In the trained groups (rewards
with spread) of the 60-minute learning runs, 328 of 768 rows (seed-2 full arm), 318 of 704
(seed 1) and 261 of 576 (no task norm) were distinct; every other row was a copy of one
of them, token for token (`bench/README.md`, learner step). A row's logits depend on its
tokens only, so the learner forwards each distinct row once, for the policy and for the
KL reference, and each copy takes its logprobs from that one computation. Each row keeps
its own loss term (its advantage, its behaviour logprobs and versions, its tokens in
the token mean), and the backward pass sums the copies' gradients into the one
computation: the update of the per-row computation, up to float summation order (a test
holds it).

Copies share everything the loss reads from the forward pass: the token ids and the
trained mask (`distinct_rows` keys on both, over the row's real tokens). The model must
be deterministic in training mode (no dropout), as the learner already requires for its
logprob gap; `TorchLearner` turns this off for a model with dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._batch import TrainBatch, _cut

__all__ = ["Distinct", "MicroBatch", "distinct_rows", "paired_micro_batches"]


@dataclass(frozen=True)
class Distinct:
    """The distinct rows of a batch: ``rows[j]`` is the first row of the j-th kind, and
    ``of_row[b]`` the kind of row ``b`` (``rows[of_row[b]]`` is ``b`` or a copy of it)."""

    rows: list[int]
    of_row: list[int]

    @property
    def copies(self) -> int:
        """Rows that are a copy of an earlier row."""
        return len(self.of_row) - len(self.rows)


def distinct_rows(batch: TrainBatch, *, merge: bool = True) -> Distinct:
    """``batch``'s rows by kind: alike in token ids and trained mask over their real
    tokens (and their length). ``merge=False``: every row its own kind."""
    if not merge:
        every = list(range(batch.num_rows))
        return Distinct(every, every)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    kinds: dict[tuple[bytes, bytes], int] = {}
    rows: list[int] = []
    of_row: list[int] = []
    for b, n in enumerate(lengths):
        key = (
            batch.input_ids[b, :n].numpy().tobytes(),
            batch.loss_mask[b, :n].numpy().tobytes(),
        )
        kind = kinds.setdefault(key, len(rows))
        if kind == len(rows):
            rows.append(b)
        of_row.append(kind)
    return Distinct(rows, of_row)


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass: ``compute`` holds the distinct rows it runs, ``loss``
    every row of the batch that is one of them (a row and all its copies), and
    ``copy_of[i]`` the row of ``compute`` that ``loss``'s row ``i`` takes its logprobs
    from. Both are cut to the same width (copies have their original's length)."""

    compute: TrainBatch
    loss: TrainBatch
    copy_of: torch.Tensor

    def spread(self, per_row: torch.Tensor) -> torch.Tensor:
        """``[r, ...]``: ``compute``'s per-row values (``[u, ...]``) for every row of
        ``loss``."""
        return per_row[self.copy_of.to(per_row.device)]

    def multiplicity(self) -> torch.Tensor:
        """``[u]`` long: how many rows of ``loss`` each row of ``compute`` stands for."""
        return torch.bincount(self.copy_of, minlength=self.compute.num_rows)


def paired_micro_batches(
    batch: TrainBatch, distinct: Distinct, work: TrainBatch, packing: list[list[int]]
) -> list[MicroBatch]:
    """``packing``: the rows of ``work`` (``batch.select(distinct.rows)``) in each
    micro-batch, as a micro-batch function packs them. Each becomes a `MicroBatch` whose
    ``loss`` holds the rows of ``batch`` of those kinds."""
    work_lengths = work.attention_mask.sum(dim=1)
    lengths = batch.attention_mask.sum(dim=1)
    members: list[list[int]] = [[] for _ in distinct.rows]
    for b, kind in enumerate(distinct.of_row):
        members[kind].append(b)
    out = []
    for rows in packing:
        loss_rows = [b for local, kind in enumerate(rows) for b in members[kind]]
        copy_of = [local for local, kind in enumerate(rows) for _ in members[kind]]
        out.append(
            MicroBatch(
                compute=_cut(work, rows, work_lengths),
                loss=_cut(batch, loss_rows, lengths),
                copy_of=torch.tensor(copy_of, dtype=torch.long),
            )
        )
    return out
