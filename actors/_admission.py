"""The controller's admission window: what it issued, and what the window allows now.

Admission rule (DESIGN "Staleness"): with policy version v, episodes-per-batch B
and maximum staleness eta, the controller keeps

    issued <= (v + eta + 1) * B + retired_without_training

where the last term counts episodes the learner reported as dropped (stale
groups, groups with too few survivors). Without it a dropped group would leave
the learner waiting for episodes the controller will never issue.
eta = 0 is synchronous training: the next batch is issued only after the
update that consumes the previous one. v counts RL versions, from the version RL
began at (the warm start's).

`IssueBook` keeps the count (episodes and groups, per task too) and draws each new
group's task and instance from the task mixer (`_mix`); a controller restarted on a run
restores both from the ledger's ``issued.jsonl`` (`_ledger`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path

from ._groups import DropBook
from ._ledger import read_lines
from ._mix import TaskMixer

__all__ = ["IssueBook"]


class IssueBook:
    """What the controller issued (module doc): ``issued`` episodes, ``groups``, per task
    ``by_task``, and the groups journaled but not confirmed by the broker (``unconfirmed``)."""

    def __init__(
        self,
        tasks: Iterable[str],
        mixer: TaskMixer,
        *,
        group_size: int,
        episodes_per_batch: int,
        max_staleness: int,
        first_version: int,
        version: int,
        ledger: Path | None,
        log,
    ) -> None:
        """``version``: the policy version the controller starts at; ``ledger``: the
        ``issued.jsonl`` to restore from (None: no ledger); ``log``: the controller's."""
        self._mixer = mixer
        self._group_size = group_size
        self._batch = episodes_per_batch
        self._eta = max_staleness
        self._first = first_version
        self._ledger = ledger
        self._log = log
        self.unconfirmed: list[dict] = []
        self.groups = 0
        self.by_task: dict[str, int] = {t: 0 for t in tasks}
        # Resuming at version v without a ledger: batches first+1..v were issued and trained.
        self.issued = max(0, version - first_version) * episodes_per_batch
        self._restore()

    def _restore(self) -> None:
        """Replay the ledger's issued groups: the counts, and the mixer's position (its
        picks are deterministic given the seed and the version at each pick)."""
        lines = list(read_lines(self._ledger)) if self._ledger is not None else []
        entries = [e for e in lines if "group" in e]
        confirmed = {g for e in lines for g in e.get("confirmed", [])}
        # journaled, then the controller died before the broker confirmed them: they may or
        # may not be in the queue, so on_start publishes them again under the same ids (a
        # copy of an episode is skipped by the learner)
        self.unconfirmed = [e for e in entries if e["group"] not in confirmed]
        if not entries:
            return
        disagree = 0
        for entry in entries:
            task, index = self._mixer.next(int(entry["version"]))
            disagree += (task, index) != (entry["task"], entry["index"])
            self.by_task[entry["task"]] = self.by_task.get(entry["task"], 0) + entry["episodes"]
        self.groups = len(entries)
        self.issued = sum(int(e["episodes"]) for e in entries)
        if disagree:  # tasks, weights or seed changed since: counts hold, the order is new
            self._log.warning("ledger and task mixer disagree", groups=disagree)
        self._log.info("issue count restored from the ledger", groups=self.groups,
                       issued=self.issued)  # fmt: skip

    def forget_untrained(self, ledger_dir: Path, version: int) -> None:
        """Count as never issued what the ledger shows issued but neither trained (a batch
        per version since the first, up to ``version``) nor dropped by the learner
        (`DropBook`)."""
        trained = max(0, version - self._first) * self._batch
        lost = self.issued - trained - DropBook(ledger_dir).episodes
        self.unconfirmed = []  # nothing to publish again: the broker is new
        if lost > 0:
            self._log.warning("episodes issued before this start are gone with the broker; "
                              "issuing anew", episodes=lost)  # fmt: skip
            self.issued -= lost

    def allowance(self, version: int, dropped: int) -> int:
        """Episodes the window admits at policy ``version`` with ``dropped`` episodes
        retired without training (the rule above)."""
        rl_version = version - self._first
        budget = (rl_version + self._eta + 1) * self._batch + dropped
        return budget - self.issued

    def next_group(self, version: int) -> dict:
        """Issue the next group (counted here): its ledger entry, as published."""
        task, index = self._mixer.next(version)
        group = {
            "group": uuid.uuid4().hex[:12],
            "task": task,
            "index": index,
            "episodes": self._group_size,
            "version": version,
        }
        self.groups += 1
        self.issued += self._group_size
        self.by_task[task] += self._group_size
        self._log.debug("group issued", task=task, index=index, group=group["group"])
        return group
