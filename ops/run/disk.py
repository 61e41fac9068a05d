"""Disk as a resource of a run: will the next checkpoint fit?

Before each checkpoint the learner asks `DiskCheck`: the next checkpoint needs about what
the newest one took (its weights, and its learner state, the AdamW moments, when the run
keeps one), plus a margin. When the disk cannot take it, the run stops cleanly with one
line instead of failing halfway through the write (checkpoints are written to a
temporary directory and renamed, so a failed write leaves nothing that looks complete).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

__all__ = ["MARGIN_BYTES", "PARAM_BYTES", "DiskCheck", "safetensors_params", "tree_bytes"]

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


PARAM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per parameter of a learner checkpoint, by ``learner.dtype``."""

_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


def safetensors_params(path: Path) -> tuple[int, int]:
    """(elements, bytes) of the tensors in a ``.safetensors`` file, from its header alone."""
    with path.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        if size > min(path.stat().st_size - 8, 100 << 20):
            raise ValueError(f"{path}: not a safetensors header ({size} bytes)")
        header = json.loads(fh.read(size))
    elements = nbytes = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        elements += count
        nbytes += count * _DTYPE_BYTES.get(entry["dtype"], 4)
    return elements, nbytes


class DiskCheck:
    """``problem()`` says, in one line, why the disk cannot take the next checkpoint (None
    when it can). The first checkpoint of a run is estimated from the model's directory:
    its parameters in the learner's dtype (``param_bytes`` each: a bfloat16 model trained
    in float32 writes twice its own size), and twice that for the AdamW moments when a
    learner state is kept."""

    def __init__(
        self,
        checkpoint_dir: Path,
        *,
        model_dir: Path | None = None,
        state_dir: Path | None = None,
        margin: int = MARGIN_BYTES,
        param_bytes: int | None = None,
    ) -> None:
        """``param_bytes``: bytes per parameter of the learner's checkpoints (4 for float32);
        None = as the model's files store them."""
        self.checkpoint_dir = checkpoint_dir
        self.model_dir = model_dir
        self.state_dir = state_dir
        self.margin = margin
        self.param_bytes = param_bytes

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
        total = 0
        for path in self.model_dir.glob("*.safetensors"):
            try:
                elements, stored = safetensors_params(path)
            except (OSError, ValueError, KeyError, TypeError, struct.error):
                elements, stored = 0, tree_bytes(path)  # unreadable header: its size
            total += (
                stored
                if self.param_bytes is None or not elements
                else (elements * self.param_bytes)
            )
        return total

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
