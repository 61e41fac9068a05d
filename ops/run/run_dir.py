"""What a run's directory says about its earlier starts (its newest checkpoint, whether
the run was started before) and the config each start leaves there."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import structlog

from ..config.schema import RunConfig

log = structlog.get_logger(__name__)

__all__ = ["earlier_start", "latest_checkpoint", "redacted_config", "write_config"]


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (one with a DIGEST file) under `ckpt_dir`."""
    found = [
        (int(p.name[1:]), p)
        for p in ckpt_dir.glob("v[0-9]*")
        if p.is_dir() and (p / "DIGEST").exists()
    ]
    return max(found) if found else None


def earlier_start(run_dir: Path) -> str | None:
    """What an earlier start of this run left (its config, newest checkpoint), or None for a
    run never started (a directory with only a warm start, ``agentrl sft``, counts as new)."""
    if not (run_dir / "config.yaml").exists():
        return None
    latest = latest_checkpoint(run_dir / "checkpoints")
    newest = f"newest checkpoint v{latest[0]}" if latest else "no checkpoint yet"
    return f"{run_dir}, {newest}"


def write_config(run_dir: Path, text: str) -> None:
    """``config.yaml``; a resumed run with another config keeps the earlier one as
    ``config.<n>.yaml`` (n = 1, 2, ... in order), so no config of the run is lost."""
    path = run_dir / "config.yaml"
    if path.exists() and path.read_text() != text:
        n = 1
        while (run_dir / f"config.{n}.yaml").exists():
            n += 1
        path.rename(run_dir / f"config.{n}.yaml")
        log.warning("resumed with another config; the earlier one kept", kept=f"config.{n}.yaml")
    path.write_text(text)


def redacted_config(cfg: RunConfig) -> dict:
    """`cfg` as plain data, the broker URL's credentials as ``***``."""
    data = asdict(cfg)
    if "@" in data["broker"]:
        scheme, rest = data["broker"].split("://", 1)
        data["broker"] = f"{scheme}://***@{rest.split('@', 1)[1]}"
    return data
