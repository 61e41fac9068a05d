"""The learner's GRPO groups: the buffered group, which members train, and the books of
what was dropped.

Groups: a group is complete when all `group_size` members have arrived. Members
lost to infrastructure (`metrics.infra_failure`) or whose instance the task could
not set up (`metrics.sample_error`) are left out (`is_untrained`). A group is
dropped whole, complete or not, when

- it is older than the hard staleness bound (v - issued_version > hard): `stale`;
- it has been incomplete for longer than `group_timeout` seconds since its first
  member arrived (a member lost for good must not hold the rest forever): `timeout`;
- it is complete with fewer than 2 trainable members: `too_few_members`;
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

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.messages import Delivery, Trajectory

from ._ledger import DROPPED_FILE, append_lines, read_lines
from ._metrics import is_success

__all__ = ["DROP_REASONS", "DropBook", "FlatGroups", "Group", "is_untrained"]

DROP_REASONS = ("stale", "timeout", "too_few_members", "no_spread")
"""Why a group is dropped (`learner/groups_dropped_total/<reason>`, module doc)."""

_REMEMBERED_DROPS = 10_000
"""Dropped group ids remembered so that their late members are acked on arrival."""


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
