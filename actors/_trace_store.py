"""The trace store: every episode the learner trained or dropped, kept for `agentrl trace`.

One SQLite file in the run directory, ``trace.sqlite``, in WAL mode. Its one writer is the
run's learner, the process that holds the run lock (``runs/<run>/LOCK``, `ops.run.run_lock`),
so a second start of the run never writes it; any number of viewers read it while it is
written (WAL: a reader never blocks the writer, and sees whole updates only).

What a row holds (table ``episodes``, one row per episode, keyed by its id):

- the trajectory's identity and outcome: task, index, group, status, reward, metrics;
- ``outcome``: ``trained`` (``version`` is the version it was trained into) or
  ``dropped`` (``version`` is the learner's version at the drop, ``reason`` why: the
  learner's drop reasons, or ``infra_failure`` / ``sample_error`` for a member of a
  trained group that had nothing to learn from);
- the token arrays, zlib-compressed little-endian: token ids (int32), the rollout's
  loss mask (uint8), the sampling version of each token (int32), the rollout logprob
  (float32), and for a trained episode the advantage each token was trained with and
  the update's own loss mask (a token older than ``max_token_lag`` is out of it), both
  aligned to ``token_ids`` (`build_batch` aligns them to the targets: shifted by one here).

Text is decoded at view time with the run's tokenizer (``meta.tokenizer``). A version
trained again after its checkpoint was lost replaces its episodes' rows, as the journal's
last entry does (`_ledger.read_ledger`): the rows describe what the surviving checkpoint
holds. The trained rows of an update go in one transaction, written after its journal
entry and before its checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from agentrl.messages import Trajectory
    from agentrl.trainer import TrainBatch

__all__ = [
    "TRACE_FILE",
    "EpisodeFilter",
    "EpisodeSummary",
    "EpisodeTrace",
    "TraceError",
    "TraceReader",
    "TraceWriter",
]

TRACE_FILE = "trace.sqlite"
SCHEMA = 1
"""``PRAGMA user_version`` of the store; a store of another version is refused."""

_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    episode_id TEXT PRIMARY KEY, group_id TEXT NOT NULL, task TEXT NOT NULL,
    idx INTEGER NOT NULL, sample_idx INTEGER NOT NULL, issued_version INTEGER NOT NULL,
    version INTEGER NOT NULL, outcome TEXT NOT NULL, reason TEXT,
    status TEXT NOT NULL, reward REAL NOT NULL, env_reward REAL NOT NULL,
    num_turns INTEGER NOT NULL, num_tokens INTEGER NOT NULL,
    min_sampled INTEGER, max_sampled INTEGER,
    pools TEXT NOT NULL, metrics TEXT NOT NULL, timings TEXT NOT NULL,
    token_ids BLOB NOT NULL, loss_mask BLOB NOT NULL, versions BLOB NOT NULL,
    logprobs BLOB NOT NULL, advantages BLOB, trained_mask BLOB, written_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_version ON episodes (version);
CREATE INDEX IF NOT EXISTS episodes_task ON episodes (task, status);
"""

_SUMMARY_COLUMNS = (
    "episode_id, group_id, task, idx, sample_idx, issued_version, version, outcome, reason, "
    "status, reward, env_reward, num_turns, num_tokens, min_sampled, max_sampled"
)


class TraceError(RuntimeError):
    """Raised when the store cannot be opened or read: missing, of another schema, broken."""


@dataclass(frozen=True, slots=True)
class EpisodeSummary:
    """One episode as the list shows it."""

    episode_id: str
    group_id: str
    task: str
    index: int
    """The task instance."""
    sample_idx: int
    """The episode's place in its GRPO group."""
    issued_version: int
    version: int
    """Trained into this version, or the learner's version when it was dropped."""
    outcome: str
    """``trained`` or ``dropped``."""
    reason: str | None
    """Why it was dropped; None when trained."""
    status: str
    reward: float
    env_reward: float
    num_turns: int
    num_tokens: int
    min_sampled: int | None
    """The oldest policy version that sampled one of its tokens (None: no sampled token)."""
    max_sampled: int | None
    """The newest."""


@dataclass(frozen=True, slots=True)
class EpisodeTrace:
    """One episode with its tokens, as the episode page shows it."""

    summary: EpisodeSummary
    token_ids: list[int]
    loss_mask: list[int]
    """1 on the tokens the policy sampled (the rollout's mask)."""
    versions: list[int]
    """Sampling version per token, -1 off the mask."""
    logprobs: list[float]
    advantages: list[float] | None
    """The advantage each token was trained with (0 off the update's mask); None if dropped."""
    trained: list[int] | None
    """1 on the tokens the update trained; None if dropped."""
    pools: list[str]
    """The sampler pool of each assistant turn."""
    metrics: dict[str, float]
    timings: dict[str, float]


@dataclass(frozen=True, slots=True)
class EpisodeFilter:
    """Which episodes to list; None matches everything."""

    task: str | None = None
    group: str | None = None
    status: str | None = None
    outcome: str | None = None
    version: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition and its parameters."""
        terms, params = [], []
        for column, value in (
            ("task = ?", self.task),
            ("group_id = ?", self.group),
            ("status = ?", self.status),
            ("outcome = ?", self.outcome),
            ("version = ?", self.version),
            ("reward >= ?", self.min_reward),
            ("reward <= ?", self.max_reward),
        ):
            if value is not None:
                terms.append(column)
                params.append(value)
        return (" AND ".join(terms) or "1"), params


def _pack(values: Sequence[float] | np.ndarray, dtype: str) -> bytes:
    return zlib.compress(np.asarray(values, dtype=dtype).tobytes(), 1)


def _unpack(blob: bytes | None, dtype: str) -> list | None:
    if blob is None:
        return None
    return np.frombuffer(zlib.decompress(blob), dtype=dtype).tolist()


class TraceWriter:
    """The learner's side: opened in the learner's thread, used there only, closed on stop.

    Opening an existing store appends to it (a resumed run); ``tokenizer`` (the directory
    or name the viewer decodes with) is recorded in ``meta``.
    """

    def __init__(self, path: Path, *, tokenizer: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA):
                raise TraceError(f"{self.path}: trace store schema {version}, expected {SCHEMA}")
            self._db.executescript(_SCHEMA_SQL)  # idempotent; commits by itself
            with self._transaction():
                self._db.execute(f"PRAGMA user_version = {SCHEMA}")
                self._db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('tokenizer', ?)", (str(tokenizer),)
                )
        except BaseException:
            self._db.close()
            raise

    def _transaction(self):
        return _Transaction(self._db)

    def trained(
        self,
        version: int,
        batch: Sequence[Trajectory],
        train: TrainBatch,
        left_out: Iterable[tuple[Trajectory, str]] = (),
    ) -> None:
        """The update into ``version`` in one transaction: ``batch`` (row b of ``train`` is
        ``batch[b]``) trained, and the members of its groups ``left_out`` (with why) dropped."""
        advantages = train.advantages.numpy()  # [B, L], aligned to the targets
        mask = train.loss_mask.numpy()  # [B, L]
        rows = []
        for b, t in enumerate(batch):
            n = len(t.token_ids)
            adv = np.zeros(n, dtype=np.float32)
            kept = np.zeros(n, dtype=np.uint8)
            adv[1:] = advantages[b, : n - 1]  # target t holds token t + 1
            kept[1:] = mask[b, : n - 1]
            rows.append(_row(t, version, "trained", None, adv, kept))
        rows += [_row(t, version, "dropped", reason, None, None) for t, reason in left_out]
        self._insert(rows)

    def dropped(self, version: int, reason: str, trajectories: Iterable[Trajectory]) -> None:
        """Episodes left out of training for ``reason`` while the learner was at ``version``."""
        self._insert([_row(t, version, "dropped", reason, None, None) for t in trajectories])

    def _insert(self, rows: list[tuple]) -> None:
        if not rows:
            return
        marks = ", ".join("?" * len(rows[0]))
        with self._transaction():
            self._db.executemany(f"INSERT OR REPLACE INTO episodes VALUES ({marks})", rows)

    def close(self) -> None:
        self._db.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on an exception (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, value, tb) -> None:
        self._db.execute("COMMIT" if kind is None else "ROLLBACK")


def _row(t: Trajectory, version: int, outcome: str, reason, adv, kept) -> tuple:
    sampled = [v for v, m in zip(t.versions, t.loss_mask, strict=True) if m]
    return (
        t.episode_id, t.group_id, t.task, t.index, t.sample_idx, t.issued_version,
        version, outcome, reason, t.status, float(t.reward), float(t.env_reward),
        t.num_turns, len(t.token_ids), min(sampled, default=None), max(sampled, default=None),
        json.dumps(list(t.pools)), json.dumps(t.metrics), json.dumps(t.timings),
        _pack(t.token_ids, "<i4"), _pack(t.loss_mask, "u1"), _pack(t.versions, "<i4"),
        _pack(t.logprobs, "<f4"),
        None if adv is None else _pack(adv, "<f4"),
        None if kept is None else _pack(kept, "u1"),
        time.time(),
    )  # fmt: skip


class TraceReader:
    """The viewer's side: a read-only connection per reader (open one per thread)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise TraceError(
                f"{self.path} does not exist (the learner writes it at its first update)"
            )
        try:
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise TraceError(f"{self.path}: not a readable trace store: {exc}") from exc
        if version != SCHEMA:
            self._db.close()
            raise TraceError(f"{self.path}: trace store schema {version}, expected {SCHEMA}")

    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def facets(self) -> dict[str, list]:
        """The values each filter can take: tasks, statuses, outcomes, versions (sorted)."""
        out: dict[str, list] = {}
        for name, column in (
            ("task", "task"),
            ("status", "status"),
            ("outcome", "outcome"),
            ("version", "version"),
        ):
            query = f"SELECT DISTINCT {column} FROM episodes ORDER BY {column}"
            out[name] = [value for (value,) in self._db.execute(query)]
        return out

    def count(self, where: EpisodeFilter | None = None) -> int:
        condition, params = (where or EpisodeFilter()).where()
        query = f"SELECT COUNT(*) FROM episodes WHERE {condition}"
        return int(self._db.execute(query, params).fetchone()[0])

    def episodes(
        self, where: EpisodeFilter | None = None, *, limit: int = 200, offset: int = 0
    ) -> list[EpisodeSummary]:
        """Matching episodes, newest version first, then by task, instance and group place."""
        condition, params = (where or EpisodeFilter()).where()
        query = (
            f"SELECT {_SUMMARY_COLUMNS} FROM episodes WHERE {condition} "
            "ORDER BY version DESC, task, idx, group_id, sample_idx LIMIT ? OFFSET ?"
        )
        return [EpisodeSummary(*row) for row in self._db.execute(query, [*params, limit, offset])]

    def episode(self, episode_id: str) -> EpisodeTrace | None:
        query = (
            f"SELECT {_SUMMARY_COLUMNS}, pools, metrics, timings, token_ids, loss_mask, "
            "versions, logprobs, advantages, trained_mask FROM episodes WHERE episode_id = ?"
        )
        row = self._db.execute(query, (episode_id,)).fetchone()
        if row is None:
            return None
        summary = EpisodeSummary(*row[:16])
        pools, metrics, timings, ids, mask, versions, logprobs, adv, kept = row[16:]
        return EpisodeTrace(
            summary=summary,
            token_ids=_unpack(ids, "<i4") or [],
            loss_mask=_unpack(mask, "u1") or [],
            versions=_unpack(versions, "<i4") or [],
            logprobs=_unpack(logprobs, "<f4") or [],
            advantages=_unpack(adv, "<f4"),
            trained=_unpack(kept, "u1"),
            pools=json.loads(pools),
            metrics=json.loads(metrics),
            timings=json.loads(timings),
        )

    def close(self) -> None:
        self._db.close()
