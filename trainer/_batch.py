"""Trajectories -> one padded, advantage-normalised training batch.

Alignment (the one rule to remember): every ``[B, L]`` tensor other than
``input_ids`` and ``attention_mask`` is aligned to the *targets*. Position
``t`` holds what the model's logits at ``t`` predict, i.e. token ``t + 1``:

    loss_mask[b, t]    = trajectory.loss_mask[t + 1]
    old_logprobs[b, t] = trajectory.logprobs[t + 1]
    versions[b, t]     = trajectory.versions[t + 1]

so the learner computes ``logits = model(input_ids)`` and scores
``targets[:, t] = input_ids[:, t + 1]`` with no further shifting. The last
column (nothing to predict) and the padding are always 0 in ``loss_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ._grpo import group_advantages, group_spread
from ._grpo import task_normalize as normalize_per_task

if TYPE_CHECKING:
    from agentrl.messages import Trajectory

__all__ = ["TrainBatch", "build_batch", "micro_batch_rows", "micro_batches"]


@dataclass(frozen=True, slots=True)
class TrainBatch:
    """One learner update's worth of episodes, right-padded, one episode per row."""

    input_ids: torch.Tensor
    """``[B, L]`` long: token ids, right-padded with ``pad_id``."""
    attention_mask: torch.Tensor
    """``[B, L]`` long: 1 on real tokens, 0 on padding."""
    loss_mask: torch.Tensor
    """``[B, L]`` float32: 1 where the target token ``t + 1`` was sampled by the policy."""
    old_logprobs: torch.Tensor
    """``[B, L]`` float32: rollout (behaviour) logprob of target ``t + 1``, 0 where unmasked."""
    advantages: torch.Tensor
    """``[B, L]`` float32: group advantage broadcast to masked targets, already task-normalised
    (when ``build_batch(task_normalize=True)``); exactly 0 on rows of flat groups."""
    versions: torch.Tensor
    """``[B, L]`` long: policy version that sampled target ``t + 1``, -1 where unmasked."""
    task_index: torch.Tensor
    """``[B]`` long: index into ``tasks`` of each row."""
    group_index: torch.Tensor
    """``[B]`` long: GRPO group of each row (numbered by first appearance)."""
    rewards: torch.Tensor
    """``[B]`` float32: the episode reward each row was trained with."""
    tasks: tuple[str, ...]
    """Task names, sorted; ``task_index`` points into it."""
    masked_old_tokens: int = 0
    """Sampled tokens ``build_batch`` took out of ``loss_mask`` for being older than
    ``max_token_lag`` (whole batch; a ``select``-ed part reports 0)."""

    @property
    def num_rows(self) -> int:
        """Number of episodes ``B``."""
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Number of trained (masked) tokens in the whole batch."""
        return int(self.loss_mask.sum().item())

    def targets(self, pad_id: int = 0) -> torch.Tensor:
        """``[B, L]`` long: ``input_ids`` shifted left by one, ``pad_id`` in the last column."""
        out = torch.full_like(self.input_ids, pad_id)
        out[:, :-1] = self.input_ids[:, 1:]
        return out

    def select(self, rows: torch.Tensor, length: int | None = None) -> TrainBatch:
        """The given rows (``[b]`` long), optionally cut to the first ``length`` positions."""
        cut = slice(None) if length is None else slice(0, length)
        return TrainBatch(
            input_ids=self.input_ids[rows, cut],
            attention_mask=self.attention_mask[rows, cut],
            loss_mask=self.loss_mask[rows, cut],
            old_logprobs=self.old_logprobs[rows, cut],
            advantages=self.advantages[rows, cut],
            versions=self.versions[rows, cut],
            task_index=self.task_index[rows],
            group_index=self.group_index[rows],
            rewards=self.rewards[rows],
            tasks=self.tasks,
        )


def build_batch(
    trajectories: Sequence[Trajectory],
    pad_id: int,
    *,
    task_normalize: bool = True,
    task_center: bool = False,
    version: int | None = None,
    max_token_lag: int | None = None,
) -> TrainBatch:
    """Pad trajectories into a ``TrainBatch`` with final, task-normalised advantages.

    Steps (DESIGN.md "The method"):

    0. With ``version`` (of the weights about to be updated) and
       ``max_token_lag``, a sampled token with ``version - token version >
       max_token_lag`` is taken out of ``loss_mask`` (counted in
       ``masked_old_tokens``): it neither trains nor enters the statistics below.
    1. R = ``trajectory.reward``. The rollout has already applied the penalty
       rule (``episode_reward``); it is *not* applied again here.
    2. A = ``group_advantages(R, group)`` per episode, grouped by ``group_id``:
       exactly 0 in a group whose rewards are all equal.
    3. A is broadcast to every masked (sampled assistant) target token.
    4. With ``task_normalize`` (``learner.task_normalize``, the default):
       ``task_normalize`` (scaled per task, every sign kept; re-centred with
       ``task_center``, ``learner.task_center``) over the tokens of the batch's rows whose group has
       reward spread, so the loss sees Ã directly (normalisation happens before
       the update, never after). Without it the loss gets the group advantages
       as they are.

    Raises:
        ValueError: when there are no trajectories, a trajectory's arrays have
            unequal lengths, or its first token is masked (nothing predicts it).
    """
    if not trajectories:
        raise ValueError("build_batch needs at least one trajectory")
    for traj in trajectories:
        n = len(traj.token_ids)
        if not (len(traj.loss_mask) == len(traj.logprobs) == len(traj.versions) == n):
            raise ValueError(
                f"trajectory {traj.episode_id}: token_ids/loss_mask/logprobs/versions "
                f"lengths differ ({n}, {len(traj.loss_mask)}, {len(traj.logprobs)}, "
                f"{len(traj.versions)})"
            )
        if n and traj.loss_mask[0]:
            raise ValueError(f"trajectory {traj.episode_id}: the first token cannot be trained")

    rows = len(trajectories)
    length = max(len(t.token_ids) for t in trajectories)
    input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, length), dtype=torch.long)
    loss_mask = torch.zeros((rows, length), dtype=torch.float32)
    old_logprobs = torch.zeros((rows, length), dtype=torch.float32)
    versions = torch.full((rows, length), -1, dtype=torch.long)
    for b, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        if n == 0:
            continue
        input_ids[b, :n] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        # Target alignment: position t scores token t + 1.
        mask = torch.tensor(traj.loss_mask[1:], dtype=torch.float32)
        loss_mask[b, : n - 1] = mask
        old_logprobs[b, : n - 1] = torch.tensor(traj.logprobs[1:], dtype=torch.float32) * mask
        versions[b, : n - 1] = torch.where(
            mask.bool(), torch.tensor(traj.versions[1:], dtype=torch.long), -1
        )

    tasks = tuple(sorted({t.task for t in trajectories}))
    task_index = torch.tensor([tasks.index(t.task) for t in trajectories], dtype=torch.long)
    group_ids: dict[str, int] = {}
    group_index = torch.tensor(
        [group_ids.setdefault(t.group_id, len(group_ids)) for t in trajectories], dtype=torch.long
    )
    rewards = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)

    masked_old = 0
    if version is not None and max_token_lag is not None:
        old = loss_mask.bool() & (versions < version - max_token_lag)  # lag > max_token_lag
        masked_old = int(old.sum())
        loss_mask[old] = 0.0
        old_logprobs[old] = 0.0
        versions[old] = -1

    episode_adv = group_advantages(rewards, group_index)  # [B], exact 0 in flat groups
    token_adv = episode_adv[:, None] * loss_mask  # [B, L]
    if task_normalize:
        spread = group_spread(rewards, group_index)  # [B]
        advantages = normalize_per_task(  # [B, L]
            token_adv, loss_mask, task_index, spread, center=task_center
        )
    else:
        advantages = token_adv

    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=advantages,
        versions=versions,
        task_index=task_index,
        group_index=group_index,
        rewards=rewards,
        tasks=tasks,
        masked_old_tokens=masked_old,
    )


def micro_batches(batch: TrainBatch, max_tokens: int) -> list[TrainBatch]:
    """Split a batch into micro-batches of at most ``max_tokens`` padded positions.

    Rows are sorted by length (longest first) and packed greedily, so rows of
    similar length share a micro-batch; each micro-batch is cut to its longest
    row. A row longer than ``max_tokens`` gets a micro-batch of its own. The
    advantages are the batch's own (already normalised over the whole batch);
    splitting never renormalises. Row order does not change the summed loss.
    """
    lengths = batch.attention_mask.sum(dim=1)
    return [_cut(batch, rows, lengths) for rows in micro_batch_rows(batch, max_tokens)]


def micro_batch_rows(batch: TrainBatch, max_tokens: int) -> list[list[int]]:
    """The rows of each of `micro_batches`'s micro-batches, in its order."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = batch.attention_mask.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    out: list[list[int]] = []
    current: list[int] = []
    for row in order:
        # Sorted descending: the first row of a chunk is its longest.
        longest = int(lengths[current[0]]) if current else int(lengths[row])
        if current and (len(current) + 1) * longest > max_tokens:
            out.append(current)
            current = []
        current.append(row)
    if current:
        out.append(current)
    return out


def _cut(batch: TrainBatch, rows: list[int], lengths: torch.Tensor) -> TrainBatch:
    """Rows of ``batch`` cut to the longest of them (at least one position)."""
    index = torch.tensor(rows, dtype=torch.long)
    return batch.select(index, max(1, int(lengths[index].max())))
