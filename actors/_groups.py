"""The learner's GRPO groups: the buffered group, the buffer that chooses which groups train
(`GroupBuffer`), which members train, and the books of what was dropped.

Groups: a group is complete when all `group_size` members have arrived. Members
lost to infrastructure (`metrics.infra_failure`) or whose instance the task could
not set up (`metrics.sample_error`) are left out (`is_untrained`). A group is
dropped whole, complete or not, when

- it is older than the hard staleness bound (v - issued_version > hard): `stale`;
- it has been incomplete for longer than `group_timeout` seconds since its first
  member arrived (a member lost for good must not hold the rest forever): `timeout`;
- it is complete with fewer than 2 trainable members: `too_few_members`;
- it is complete and a trainable member's reward or a sampled token's logprob is not a
  finite number, or its GRPO advantages computed as the trainer does (float32) are not
  finite (rewards near the float32 limit): `non_finite`. Defence in depth behind the
  rollout's and the endpoint's reward checks: no NaN or infinity reaches an update;
- with ``drop_flat_groups`` (``learner.drop_flat_groups``, DAPO's dynamic sampling), it
  is complete and its trainable members' rewards are all equal: `no_spread`. Its GRPO
  advantage is exactly 0, so training it would cost a forward/backward for the KL term
  alone; the batch is filled with groups that carry a signal instead. These drops are
  counted per task since the previous update (`FlatGroups`: `env/<task>/flat_groups_dropped`,
  and `env/<task>/flat_groups_succeeded` for the all-success ones), so the training
  success of the trained batch, which now holds only groups with spread, can be read
  beside them.

The whole group (`group_size` episodes, arrived or not) is added to
`learner/dropped_episodes_total` (`DropBook`), which the controller adds to its admission
budget: it issues replacements for the whole group. Drops are counted by reason
(`learner/groups_dropped_total/<reason>`), written to the ledger before their acks, and
their totals continue from the ledger after a restart.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.messages import Delivery, Trajectory
from agentrl.trainer import group_advantages

from ._ledger import DROPPED_FILE, append_lines, read_lines
from ._metrics import has_spread, is_success

__all__ = [
    "DROP_REASONS",
    "Batch",
    "DropBook",
    "FlatGroups",
    "Group",
    "GroupBuffer",
    "is_untrained",
    "non_finite",
]

DROP_REASONS = ("stale", "timeout", "too_few_members", "no_spread", "non_finite")
"""Why a group is dropped (`learner/groups_dropped_total/<reason>`, module doc)."""

_REMEMBERED_DROPS = 10_000
"""Dropped group ids remembered so that their late members are acked on arrival."""


def non_finite(members: list[Trajectory]) -> bool:
    """True when training ``members`` (one group's trainable ones) would put a NaN or an
    infinity into the update: a reward or a sampled token's logprob that is not a finite
    number, or a group advantage that is not finite in float32 (module doc)."""
    for t in members:
        if not isinstance(t.reward, int | float) or not math.isfinite(t.reward):
            return True
        if not all(math.isfinite(lp) for lp, m in zip(t.logprobs, t.loss_mask, strict=False) if m):
            return True
    rewards = torch.tensor([float(t.reward) for t in members], dtype=torch.float32)
    advantages = group_advantages(rewards, torch.zeros(len(members), dtype=torch.long))
    return not bool(torch.isfinite(advantages).all() and torch.isfinite(rewards).all())


def is_untrained(t: Trajectory) -> bool:
    """True for a member with nothing to learn from: lost to infra or never set up."""
    return bool(t.metrics.get("infra_failure") or t.metrics.get("sample_error"))


@dataclass
class Group:
    first_seen: float
    members: dict[str, tuple[Trajectory, Delivery]] = field(default_factory=dict)

    def trajectories(self) -> list[Trajectory]:
        return [t for t, _ in self.members.values()]

    def oldest(self) -> int:
        return min(t.issued_version for t, _ in self.members.values())


class DropBook:
    """The dropped groups of the run: totals (continued from the ledger), the reason of each
    recently dropped group (its late members are acked on arrival), the ledger lines."""

    def __init__(self, ledger_dir: Path | None) -> None:
        """``ledger_dir``: where the drops go (`_ledger`); None keeps them in memory only."""
        self._path = ledger_dir / DROPPED_FILE if ledger_dir is not None else None
        earlier = [e for e in read_lines(self._path) if "members" not in e] if self._path else []
        self.episodes = sum(int(e["episodes"]) for e in earlier)  # over the run
        self.groups = len(earlier)
        self._by_reason: Counter[str] = Counter(e["reason"] for e in earlier)
        self._reasons: OrderedDict[str, str] = OrderedDict()  # group -> reason

    def reason(self, group: str) -> str | None:
        """Why ``group`` was dropped, if it was (among the last `_REMEMBERED_DROPS`)."""
        return self._reasons.get(group)

    def add(self, group: str, episodes: int, reason: str, version: int) -> None:
        """Count a dropped group of ``episodes`` and write its ledger line (before any ack)."""
        self._reasons[group] = reason
        if len(self._reasons) > _REMEMBERED_DROPS:
            self._reasons.popitem(last=False)
        self.groups += 1
        self._by_reason[reason] += 1
        self.episodes += episodes
        if self._path is not None:  # on disk before the acks
            entry = {"group": group, "episodes": episodes, "reason": reason,
                     "version": version}  # fmt: skip
            append_lines(self._path, [entry])

    def left_out(self, entries: list[dict], version: int) -> None:
        """Ledger lines for members acked with a trained batch but not trained."""
        if self._path is not None:
            append_lines(self._path, [{**u, "version": version} for u in entries])

    def metrics(self) -> dict[str, float]:
        return {
            "learner/dropped_episodes_total": float(self.episodes),
            "learner/dropped_groups_total": float(self.groups),
            **{
                f"learner/groups_dropped_total/{r}": float(self._by_reason[r]) for r in DROP_REASONS
            },
        }


class FlatGroups:
    """Groups dropped for having no reward spread, per task since the last update."""

    def __init__(self) -> None:
        self._dropped: Counter[str] = Counter()
        self._succeeded: Counter[str] = Counter()

    def add(self, members: list[Trajectory]) -> None:
        task = members[0].task
        self._dropped[task] += 1
        self._succeeded[task] += all(is_success(t) for t in members)

    def warning(self, groups_per_batch: int) -> dict | None:
        """Dynamic sampling never trains while no group has spread (a policy that fails, or
        succeeds, at everything): the warning's fields every ``4 * groups_per_batch`` flat
        groups in a row, else None."""
        flat = sum(self._dropped.values())
        if flat % (4 * groups_per_batch):
            return None
        return {
            "flat_groups": flat,
            "by_task": dict(self._dropped),
            "all_success": dict(self._succeeded),
        }

    def metrics(self, tasks: set[str]) -> dict[str, float]:
        """Per task of ``tasks`` and of the flat ones: the counts since the last update,
        which then restart."""
        out = {}
        for task in tasks | set(self._dropped):
            out[f"env/{task}/flat_groups_dropped"] = float(self._dropped[task])
            out[f"env/{task}/flat_groups_succeeded"] = float(self._succeeded[task])
        self._dropped.clear()
        self._succeeded.clear()
        return out


@dataclass
class Batch:
    """The groups of the next update, as `GroupBuffer.next_batch` chose them."""

    trajectories: list[Trajectory]
    """Their trainable members, oldest group first."""
    deliveries: list[Delivery]
    """Every member's delivery, the untrained ones' too: acked with the update."""
    untrained: list[dict]
    """Ledger lines of the members left out (`DropBook.left_out`)."""
    left_out: list[tuple[Trajectory, str]]
    """The members left out, each with why (``infra_failure``, ``sample_error``)."""


Drop = Callable[[str, Group, str], None]
"""``drop(group_id, group, reason)``: the learner's part of dropping a group that has left
the buffer (its ledger line, then `GroupBuffer.release` acks its members)."""


class GroupBuffer:
    """The learner's buffer: the groups whose members arrived, and the choice of what trains.

    A member is buffered under its group (`add`); a redelivery or a second copy of one
    buffered keeps the newest delivery handle, the old one acked with the next update.
    `sweep` and `next_batch` take out the groups the module doc drops and hand them to
    ``drop``; a batch is the `groups_per_batch` complete groups with the oldest
    ``issued_version`` (then the earliest first member) that may train."""

    def __init__(
        self,
        *,
        group_size: int,
        groups_per_batch: int,
        hard_staleness: int,
        group_timeout: float,
        drop_flat_groups: bool,
        clock: Callable[[], float],
        drop: Drop,
        log,
    ) -> None:
        """``log``: the learner's."""
        self.groups: dict[str, Group] = {}
        self.flat = FlatGroups()  # per task, flat groups dropped since the update
        self._seen: set[str] = set()
        self._to_ack: list[Delivery] = []
        self._group_size = group_size
        self._groups_per_batch = groups_per_batch
        self._hard = hard_staleness
        self._group_timeout = group_timeout
        self._drop_flat = drop_flat_groups
        self._clock = clock
        self._drop = drop
        self._log = log

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, traj: Trajectory, delivery: Delivery) -> bool:
        """Buffer a member; False (nothing new) for a redelivery of one buffered."""
        if traj.episode_id in self._seen:
            # A redelivery (after a reconnect) or a second copy of something buffered:
            # keep the newest delivery handle; the old one is acked with the next update
            # (settling a delivery of a dead channel is a no-op).
            group = self.groups.get(traj.group_id)
            if group is not None and traj.episode_id in group.members:
                self._to_ack.append(group.members[traj.episode_id][1])
                group.members[traj.episode_id] = (traj, delivery)
            else:
                self._to_ack.append(delivery)
            return False
        self._seen.add(traj.episode_id)
        group = self.groups.setdefault(traj.group_id, Group(self._clock()))
        group.members[traj.episode_id] = (traj, delivery)
        return True

    def sweep(self, version: int) -> int:
        """Drop every buffered group that is stale or incomplete for too long; how many."""
        now, dropped = self._clock(), 0
        for gid, group in list(self.groups.items()):
            if version - group.oldest() > self._hard:
                self._take_out(gid, group, "stale")
            elif (
                len(group.members) < self._group_size
                and now - group.first_seen > self._group_timeout
            ):
                self._take_out(gid, group, "timeout")
            else:
                continue
            dropped += 1
        return dropped

    def prune(self, version: int) -> int:
        """Drop every complete group that may never train (stale, fewer than 2 trainable
        members, a value that is not finite, and with ``drop_flat_groups`` no reward
        spread); how many. The learner
        calls it on each arrival while an update runs, so these drops reach the controller's
        window at once rather than after the update."""
        dropped = 0
        for gid, group in self._complete_groups():
            members = [t for t in group.trajectories() if not is_untrained(t)]
            stale = version - group.oldest() > self._hard
            if stale or len(members) < 2:
                self._take_out(gid, group, "stale" if stale else "too_few_members")
            elif non_finite(members):
                self._take_out(gid, group, "non_finite")
            elif self._drop_flat and not has_spread(members):
                self.flat.add(members)
                self._warn_if_only_flat(version)  # before the drop's report, which tests wait on
                self._take_out(gid, group, "no_spread")
            else:
                continue
            dropped += 1
        return dropped

    def next_batch(self, version: int) -> Batch | None:
        """The groups of the next update, out of the buffer (complete groups that may not
        train are dropped first: `prune`); None while fewer than `groups_per_batch` may."""
        self.prune(version)
        ready = self._complete_groups()
        if len(ready) < self._groups_per_batch:
            return None
        batch: list[Trajectory] = []
        used: list[Delivery] = []
        untrained: list[dict] = []
        left_out: list[tuple[Trajectory, str]] = []
        for gid, group in ready[: self._groups_per_batch]:
            batch.extend(t for t in group.trajectories() if not is_untrained(t))
            used.extend(d for _, d in group.members.values())
            for reason in ("infra_failure", "sample_error"):
                lost = [t for t in group.trajectories() if t.metrics.get(reason)]
                if lost:
                    ids = [t.episode_id for t in lost]
                    untrained.append({"group": gid, "members": ids, "reason": reason})
                    left_out += [(t, reason) for t in lost]
            self.groups.pop(gid)
        return Batch(batch, used, untrained, left_out)

    def release(self, group: Group) -> None:
        """Ack the members of a dropped group (after its ledger line) and forget them."""
        for episode, (_, delivery) in group.members.items():
            self._seen.discard(episode)
            delivery.ack()

    def trained(self, batch: list[Trajectory], used: list[Delivery]) -> None:
        """Ack a trained batch's deliveries and those they superseded; forget its members."""
        for delivery in [*used, *self._to_ack]:
            delivery.ack()
        self._to_ack.clear()
        for t in batch:
            self._seen.discard(t.episode_id)

    def _complete_groups(self) -> list[tuple[str, Group]]:
        ready = [(gid, g) for gid, g in self.groups.items() if len(g.members) >= self._group_size]
        ready.sort(key=lambda item: (item[1].oldest(), item[1].first_seen))
        return ready

    def _warn_if_only_flat(self, version: int) -> None:
        """Dynamic sampling never trains while no group has spread (a policy that fails, or
        succeeds, at everything): say so every ``4 * groups_per_batch`` flat groups in a row."""
        fields = self.flat.warning(self._groups_per_batch)
        if fields is not None:
            self._log.warning(
                "only groups without reward spread since the last update: nothing to train on",
                **fields,
                version=version,
            )

    def _take_out(self, gid: str, group: Group, reason: str) -> None:
        self.groups.pop(gid)
        self._drop(gid, group, reason)
