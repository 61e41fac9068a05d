"""A checkpoint written whole or not at all, with the metrics row of its update inside.

The learner saves version N into ``checkpoints/.v00000N.partial``, writes the update's
metrics row there as ``METRICS.json`` and renames the directory to ``v00000N``: the
rename is the commit, so a crash or a full disk mid-write leaves a partial directory that
no reader takes for a checkpoint (`remove_partials` clears it at the next start), and a
committed checkpoint always carries its row. The run's ``metrics.jsonl`` gets the row
after the commit; a learner that died between the two has it appended at the next start
(`missing_rows`), once.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

__all__ = [
    "METRICS_FILE",
    "commit",
    "disk_full",
    "exc_line",
    "missing_rows",
    "partial_dir",
    "prune_checkpoints",
    "remove_partials",
]

METRICS_FILE = "METRICS.json"
"""In a checkpoint directory: the metrics row of the update that wrote it."""


def partial_dir(checkpoint_dir: Path, version: int) -> Path:
    """Where version ``version`` is written before its commit (hidden: not ``v[0-9]*``)."""
    return checkpoint_dir / f".v{version:06d}.partial"


def remove_partials(checkpoint_dir: Path) -> None:
    """Delete what saves cut short left (a crash, a full disk, an aborted stop)."""
    for path in checkpoint_dir.glob(".v*.partial"):
        log.warning("partial checkpoint removed", path=str(path))
        shutil.rmtree(path)


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (``keep`` <= 0 keeps all)."""
    if keep <= 0:
        return
    versions = sorted(p for p in checkpoint_dir.glob("v[0-9]*") if p.is_dir())
    for old in versions[:-keep]:
        shutil.rmtree(old)


def commit(partial: Path, final: Path, row: dict) -> None:
    """Write ``row`` into ``partial`` (fsynced) and rename it to ``final``."""
    path = partial / METRICS_FILE
    with path.open("w") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():  # an incomplete one (no DIGEST: never announced), or a retrained one
        shutil.rmtree(final)
    partial.rename(final)


def missing_rows(checkpoint_dir: Path, metrics_path: Path) -> list[dict]:
    """The rows of the checkpoints kept in ``checkpoint_dir`` that ``metrics_path`` lacks
    (by version), oldest first: the learner died after the commit, before writing them."""
    written: set[int] = set()
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write
            if "version" in row:
                written.add(int(row["version"]))
    rows = []
    for ckpt in sorted(checkpoint_dir.glob("v[0-9]*")):
        path = ckpt / METRICS_FILE
        if not path.is_file():
            continue
        row = json.loads(path.read_text())
        if int(row.get("version", -1)) not in written:
            rows.append(row)
    return rows


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_DISK_FULL_TEXT = ("No space left", "Disk quota exceeded", "StorageFull", "file write failed")
"""How a full disk reads in the errors of the writers a backend uses: an OSError, torch's
``PytorchStreamWriter failed writing file ...: file write failed``, safetensors'
``IoError(Os { code: 28, kind: StorageFull, ... })``."""


def disk_full(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) says the disk is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(current) for text in _DISK_FULL_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def exc_line(exc: BaseException) -> str:
    """``exc`` as one short line: its class and the first line of its text."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
