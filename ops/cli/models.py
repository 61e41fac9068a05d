"""The model a command of ``agentrl`` names: a spec resolved (converted on first use, with
its progress on the console), or a checkpoint directory checked."""

from __future__ import annotations

from pathlib import Path

from agentrl.trainer import ModelError, resolve_model

from ..logs.configure import configure_logging

__all__ = ["checkpoint_dir", "resolve_loudly"]


def resolve_loudly(spec: str) -> Path:
    """`resolve_model` with its log lines on the console: a first use converts the model
    (a minute on a CPU), and its progress lines are info lines, which these commands'
    console (warnings only) would hide."""
    configure_logging("info")
    try:
        return resolve_model(spec)
    finally:
        configure_logging("warning")


def checkpoint_dir(spec: str) -> tuple[Path | None, str | None]:
    """The model directory of `spec`, or why there is none."""
    try:
        path = resolve_loudly(spec)
    except ModelError as exc:
        return None, f"--checkpoint: {exc}"
    if path.is_dir():
        if not (path / "config.json").exists():
            return None, f"--checkpoint {spec!r}: not a model directory (no config.json)"
        return path, None
    # resolve_model takes any other relative spec for a hub name (org/name); a longer
    # path, or one under an existing directory, is a checkpoint directory that is missing.
    parts = Path(spec).parts
    if len(parts) != 2 or Path(parts[0]).is_dir():
        return None, f"--checkpoint {spec!r}: no such directory"
    return path, None
