"""The trained-groups journal: which GRPO groups each update trained.

The learner appends one fsynced JSON line per update to
``checkpoints/trained.jsonl`` before it saves the checkpoint, and a learner
resumed from checkpoint N skips the redeliveries of N's groups (their acks may
have been lost when the previous learner died between the checkpoint and the
acks), so no trajectory is trained twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

__all__ = [
    "TRAINED_JOURNAL",
    "TrainedIndex",
    "journal_groups",
    "trained_episodes",
    "trained_groups",
]

TRAINED_JOURNAL = "trained.jsonl"
"""In the checkpoint directory: one JSON line per update, the groups it trained."""


def journal_groups(
    path: Path, version: int, groups: set[str], episodes: list[str] | None = None
) -> None:
    """Append the groups (and episodes) trained into ``version``, fsynced before returning.
    The episodes make this file the ledger's record of what was trained (`_ledger`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"version": version, "groups": sorted(groups), "episodes": sorted(episodes or [])}
    with path.open("a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def trained_groups(path: Path, version: int) -> set[str]:
    """Groups trained into checkpoint ``version`` (the one a resumed learner starts from).

    Only that version's groups can still be unacked on the queue: every earlier
    batch was acked before the next update began. Entries for later versions are
    from updates whose checkpoint did not survive; their groups are trained again.
    """
    if version == 0 or not path.exists():
        return set()
    groups: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            log.warning("unreadable line in the trained journal", path=str(path), line=number)
            continue  # a line cut by a crash mid-write: its update never completed
        if entry.get("version") == version:
            groups.update(entry.get("groups", []))
    return groups


def trained_episodes(path: Path, first: int, last: int) -> dict[str, int]:
    """Episode -> version for the episodes trained into versions ``first..last`` (the last
    entry of a version counts; entries after ``last`` are from updates whose checkpoint did
    not survive). A resumed learner skips a second copy of any of them: a rollout that died
    after publishing a trajectory but before acking its episode plays the episode again."""
    if not path.exists():
        return {}
    by_version: dict[int, list[str]] = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash mid-write (`trained_groups` logs it)
        version = int(entry.get("version", -1))
        if first <= version <= last:
            by_version[version] = list(entry.get("episodes", []))
    return {e: v for v, episodes in sorted(by_version.items()) for e in episodes}


class TrainedIndex:
    """What the learner has trained, for its intake: the groups of the version it resumed
    from (their redeliveries are replays: the checkpoint holds them already) and the
    episodes trained within the staleness window (a second copy of one is skipped: its
    rollout died after publishing it and before acking the episode); both skips counted."""

    def __init__(self, path: Path, start_version: int, hard_staleness: int) -> None:
        """``path``: the journal; ``hard_staleness``: older copies are dropped as stale."""
        self._hard = hard_staleness
        self._groups = trained_groups(path, start_version)
        # episodes trained within the staleness window (older copies are stale anyway)
        self._episodes = trained_episodes(path, start_version - hard_staleness - 1, start_version)
        self.replays_skipped = 0
        self.duplicates_skipped = 0

    def replay(self, group: str) -> bool:
        """True (and counted) for a group trained into the version resumed from."""
        if group not in self._groups:
            return False
        self.replays_skipped += 1
        return True

    def copy(self, episode: str) -> bool:
        """True (and counted) for an episode trained within the staleness window."""
        if episode not in self._episodes:
            return False
        self.duplicates_skipped += 1
        return True

    def trained(self, version: int, episodes: list[str]) -> None:
        """``episodes`` were trained into ``version``; copies older than the window go."""
        for episode in episodes:
            self._episodes[episode] = version
        horizon = version - self._hard - 1  # older copies would be dropped as stale
        self._episodes = {e: v for e, v in self._episodes.items() if v >= horizon}
