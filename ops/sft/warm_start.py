"""The record of a run's supervised warm start, and the KL reference it implies.

``agentrl sft`` ends by writing checkpoint ``v<N>`` (N = its steps) into the
run's checkpoint directory, a copy of it in ``runs/<run>/sft_reference/``
(hard links where the file system allows: no extra space) and this record,
``runs/<run>/sft.json``. The RL run started afterwards resumes from ``v<N>``
like from any checkpoint, and its frozen KL reference is the warm-started
model, not the base model: the KL term should hold the policy near where RL
began. The copy survives ``learner.keep_checkpoints`` pruning ``v<N>``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agentrl.trainer import checkpoint_digest

__all__ = [
    "RECORD_FILE",
    "REFERENCE_DIR",
    "WarmStart",
    "WarmStartError",
    "kl_reference",
    "read_warm_start",
    "write_warm_start",
]

RECORD_FILE = "sft.json"
"""In the run directory: the warm start's record (absent for a run without one)."""

REFERENCE_DIR = "sft_reference"
"""In the run directory: the warm-started model, kept as the RL run's KL reference."""


class WarmStartError(RuntimeError):
    """Raised when a run's warm-start record is unreadable or its reference model is damaged."""


@dataclass(frozen=True)
class WarmStart:
    """What ``sft.json`` holds."""

    version: int
    """Checkpoint version the warm start wrote (= its optimiser steps)."""
    checkpoint: str
    """That checkpoint's directory, relative to the run directory."""
    reference: str
    """The KL reference copy's directory, relative to the run directory."""
    digest: str
    """The checkpoint's digest (``checkpoint_digest``); the reference has the same."""
    base_model: str
    """The run's ``model`` the warm start began from."""
    created_at: float
    """Unix time the record was written."""


def write_warm_start(
    run_dir: Path, version: int, checkpoint: Path, digest: str, base_model: str
) -> WarmStart:
    """Copy ``checkpoint`` to the reference directory and write the record (last)."""
    reference = run_dir / REFERENCE_DIR
    if reference.exists():
        shutil.rmtree(reference)
    reference.mkdir(parents=True)
    for path in sorted(checkpoint.iterdir()):
        if path.is_file():
            try:
                os.link(path, reference / path.name)
            except OSError:  # another file system, or no hard links: copy
                shutil.copy2(path, reference / path.name)
    record = WarmStart(
        version=version,
        checkpoint=str(checkpoint.relative_to(run_dir)),
        reference=REFERENCE_DIR,
        digest=digest,
        base_model=base_model,
        created_at=time.time(),
    )
    tmp = run_dir / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(record), indent=1) + "\n")
    tmp.replace(run_dir / RECORD_FILE)
    return record


def read_warm_start(run_dir: Path) -> WarmStart | None:
    """The run's warm-start record, or None when the run has none."""
    path = run_dir / RECORD_FILE
    if not path.exists():
        return None
    try:
        return WarmStart(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise WarmStartError(f"{path}: not a warm-start record: {exc}") from exc


def kl_reference(run_dir: Path, base: Path) -> Path:
    """The KL reference of the RL run in ``run_dir``: the warm-started model if the run
    has one (checked against its digest), else ``base`` (the run's initial model)."""
    record = read_warm_start(run_dir)
    if record is None:
        return base
    reference = run_dir / record.reference
    try:
        digest = checkpoint_digest(reference)
    except FileNotFoundError as exc:
        raise WarmStartError(f"{reference}: the warm start's reference model is missing") from exc
    if digest != record.digest:
        raise WarmStartError(
            f"{reference}: digest {digest[:12]} is not the warm start's {record.digest[:12]}"
        )
    return reference
