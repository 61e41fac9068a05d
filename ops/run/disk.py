"""Disk as a resource of a run: will the next checkpoint fit?

Before each checkpoint the learner asks `DiskCheck`: the next checkpoint needs about what
the newest one took (its weights, and its learner state, the AdamW moments, when the run
keeps one), plus a margin. When the disk cannot take it, the run stops cleanly with one
line instead of failing halfway through the write (checkpoints are written to a
temporary directory and renamed, so a failed write leaves nothing that looks complete).
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["MARGIN_BYTES", "DiskCheck", "tree_bytes"]

MARGIN_BYTES = 64 << 20
"""Free space kept beyond the estimate of the next checkpoint (logs, ledger, metrics)."""


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _newest(root: Path | None) -> Path | None:
    if root is None or not root.is_dir():
        return None
    found = sorted(p for p in root.glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit())
    return found[-1] if found else None


class DiskCheck:
    """``problem()`` says, in one line, why the disk cannot take the next checkpoint (None
    when it can). The first checkpoint of a run is estimated from the model's directory
    (its weights, and twice that for the AdamW moments when a learner state is kept)."""

    def __init__(
        self,
        checkpoint_dir: Path,
        *,
        model_dir: Path | None = None,
        state_dir: Path | None = None,
        margin: int = MARGIN_BYTES,
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.model_dir = model_dir
        self.state_dir = state_dir
        self.margin = margin

    def needed(self) -> int:
        """Bytes the next checkpoint (weights and learner state) is expected to take."""
        newest = _newest(self.checkpoint_dir)
        weights = tree_bytes(newest) if newest else self._model_bytes()
        state = _newest(self.state_dir)
        if state is not None:
            moments = tree_bytes(state)
        else:
            moments = 2 * weights if self.state_dir is not None else 0
        return weights + moments + self.margin

    def _model_bytes(self) -> int:
        if self.model_dir is None or not self.model_dir.is_dir():
            return 0  # a hub name: nothing local to measure until the first checkpoint
        return sum(tree_bytes(p) for p in self.model_dir.glob("*.safetensors"))

    def problem(self) -> str | None:
        need = self.needed()
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.checkpoint_dir).free
        if free >= need:
            return None
        return (
            f"disk full: {_mib(free)} free on {self.checkpoint_dir}, the next checkpoint "
            f"needs about {_mib(need)}; the run stopped before writing it (free space, or "
            "lower learner.keep_checkpoints, then start again with --resume)"
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
