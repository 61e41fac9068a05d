"""The episode ledger: which episodes a run issued, trained (into which version) and dropped.

Two append-only JSON-lines files in the run directory, each written by the one role that
knows the facts, fsynced before the fact becomes visible to anyone else:

- ``ledger/issued.jsonl`` (the controller): one line per GRPO group, written before the
  group is published: ``{"group", "task", "index", "episodes", "version"}`` (the group's
  episode ids are ``<group>-0 .. <group>-<n-1>``), and after the broker confirmed an
  admission's groups a line ``{"confirmed": [group, ...]}``. A restarted controller
  publishes the unconfirmed groups again under the same ids (if they had reached the queue
  after all, the learner skips the second copies).
- ``checkpoints/trained.jsonl`` (the learner's journal, `_journal`): per update the
  groups and episodes it trained; and ``ledger/dropped.jsonl`` (the learner): a group
  dropped whole (``{"group", "episodes", "reason", "version"}``, every episode of the
  group), or members of a trained group that had nothing to learn from
  (``{"group", "members", "reason"}``: ``infra_failure``, ``sample_error``).

A restarted controller reads ``issued.jsonl`` to restore its issue count and its task
mixer's position (no replay of the task order, no over-issue); a restarted learner reads
``dropped.jsonl`` for its dropped-episode total (the controller's admission counts it).
`read_ledger` folds the files into a `LedgerSummary`: an episode issued but neither
trained nor dropped is *open* (in a queue, being played or buffered, or lost if the run
has ended), one trained into two versions is *trained twice*.

Both files need the controller's and the learner's
run directory to be the same directory (one node, or a shared file system) to be read
together; each role only reads its own.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

__all__ = [
    "DROPPED_FILE",
    "ISSUED_FILE",
    "LEDGER_DIR",
    "SERVED_FILE",
    "LedgerSummary",
    "append_lines",
    "dropped_episodes",
    "read_ledger",
    "read_lines",
]

LEDGER_DIR = "ledger"
ISSUED_FILE = "issued.jsonl"
SERVED_FILE = "served.jsonl"
"""Groups opened by outside agents through the endpoint (`agentrl.ops.serve`), as issued."""
DROPPED_FILE = "dropped.jsonl"


def append_lines(path: Path, entries: list[dict]) -> None:
    """Append ``entries`` as JSON lines, fsynced before returning."""
    if not entries:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
        f.flush()
        os.fsync(f.fileno())


def read_lines(path: Path) -> Iterator[dict]:
    """The entries of a JSON-lines file; a line cut by a crash mid-write is skipped."""
    if not path.exists():
        return
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            log.warning("unreadable ledger line skipped", path=str(path), line=number)


def dropped_episodes(path: Path) -> int:
    """Episodes dropped whole with their groups, over the run (the learner's total)."""
    return sum(int(e.get("episodes", 0)) for e in read_lines(path) if "members" not in e)


@dataclass
class LedgerSummary:
    """What `read_ledger` found (episode ids throughout)."""

    issued: dict[str, str] = field(default_factory=dict)
    """Episode -> task, for every episode the controller recorded as issued."""
    trained: dict[str, int] = field(default_factory=dict)
    """Episode -> the version it was trained into (the last journal entry of a version)."""
    dropped: dict[str, str] = field(default_factory=dict)
    """Episode -> why it was dropped."""
    trained_twice: dict[str, list[int]] = field(default_factory=dict)
    """Episodes trained into more than one version, with the versions."""
    groups: int = 0
    """Groups issued."""
    last_version: int = 0
    """The newest version the journal records."""

    @property
    def open(self) -> list[str]:
        """Issued, neither trained nor dropped (in flight, or lost once the run ended)."""
        return sorted(e for e in self.issued if e not in self.trained and e not in self.dropped)

    @property
    def unissued(self) -> list[str]:
        """Trained or dropped without an issue line (never expected: a sign of a bug)."""
        return sorted(e for e in (*self.trained, *self.dropped) if e not in self.issued)

    def counts(self) -> dict[str, int]:
        return {
            "groups": self.groups,
            "issued": len(self.issued),
            "trained": len(self.trained),
            "dropped": len(self.dropped),
            "open": len(self.open),
            "trained_twice": len(self.trained_twice),
            "unissued": len(self.unissued),
        }

    def drop_reasons(self) -> Counter[str]:
        return Counter(self.dropped.values())


def newest_committed(run_dir: Path) -> int:
    """The newest version whose checkpoint was committed: the newest complete checkpoint
    (one with a DIGEST file) or metrics row, whichever is newer (older checkpoints may have
    been pruned, and the row of each committed version reaches ``metrics.jsonl``)."""
    checkpoints = [
        int(p.name[1:])
        for p in (run_dir / "checkpoints").glob("v[0-9]*")
        if p.name[1:].isdigit() and (p / "DIGEST").exists()
    ]
    rows = [int(r["version"]) for r in read_lines(run_dir / "metrics.jsonl") if "version" in r]
    return max([0, *checkpoints, *rows])


def read_ledger(run_dir: Path) -> LedgerSummary:
    """Fold a run's ledger files and the learner's journal into a `LedgerSummary`."""
    from ._journal import TRAINED_JOURNAL

    out = LedgerSummary()
    issued = read_lines(run_dir / LEDGER_DIR / ISSUED_FILE)
    served = read_lines(run_dir / LEDGER_DIR / SERVED_FILE)
    for entry in (*issued, *served):
        if "group" not in entry:  # a {"confirmed": [...]} line
            continue
        out.groups += 1
        for i in range(int(entry["episodes"])):
            out.issued[f"{entry['group']}-{i}"] = entry["task"]
    by_version: dict[int, list[str]] = {}
    committed = newest_committed(run_dir)
    for entry in read_lines(run_dir / "checkpoints" / TRAINED_JOURNAL):
        # a version journaled again was trained again after its checkpoint was lost: the
        # last entry is the one the surviving checkpoint holds; one past the newest
        # committed checkpoint never completed (its write failed, or is under way)
        if int(entry["version"]) <= committed:
            by_version[int(entry["version"])] = list(entry.get("episodes", []))
    seen: dict[str, list[int]] = {}
    for version in sorted(by_version):
        for episode in by_version[version]:
            seen.setdefault(episode, []).append(version)
    out.trained = {e: versions[-1] for e, versions in seen.items()}
    out.trained_twice = {e: v for e, v in seen.items() if len(v) > 1}
    out.last_version = max(by_version, default=0)
    for entry in read_lines(run_dir / LEDGER_DIR / DROPPED_FILE):
        if "members" in entry:  # members of a trained group with nothing to learn from
            for episode in entry["members"]:
                out.dropped.setdefault(episode, entry["reason"])
        else:  # the whole group, also members that never arrived
            for i in range(int(entry["episodes"])):
                out.dropped.setdefault(f"{entry['group']}-{i}", entry["reason"])
    return out
