"""The learner's optimiser across restarts: the linear warmup and the torch backend's AdamW state.

Warmup (both backends): update k (k = AdamW updates already done, counted by
AdamW's own ``step``, so it resumes with the moments) runs at

    lr_k = lr · min(1, (k + 1) / warmup_steps)        (lr itself when warmup_steps = 0)

A learner resumed without a saved state starts its moments from zero and so
warms up again, which is what fresh moments want.

Torch backend state: ``<root>/v000012/optimizer.pt`` holds the AdamW moments
and step counts after update 12 (the same number as the HF checkpoint
``checkpoints/v000012``, whose safetensors hold the weights exactly) and the
learner's update count. It is written to ``v000012.partial`` and renamed, so a
directory named ``vN`` is complete. The param groups (lr, betas, weight decay)
are not restored: the run's config sets them. The Megatron backend keeps its
own format in the same layout (``trainer/megatron/_state.py``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import structlog
import torch

__all__ = [
    "OPTIMIZER_FILE",
    "load_optimizer_state",
    "remove_newer_states",
    "save_optimizer_state",
    "updates_done",
    "warmup_lr",
]

log = structlog.get_logger(__name__)

OPTIMIZER_FILE = "optimizer.pt"
"""In a state directory: the torch backend's AdamW state."""

_NAME = re.compile(r"^v(\d+)$")


def warmup_lr(lr: float, done: int, warmup_steps: int) -> float:
    """Learning rate of the update after ``done`` updates: linear warmup, then constant."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (done + 1) / warmup_steps)


def updates_done(optimizer: torch.optim.Optimizer) -> int:
    """AdamW updates the optimiser has taken (its per-parameter ``step``; 0 when fresh)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if state and "step" in state:
                return int(state["step"])
    return 0


def _path(root: Path, version: int) -> Path:
    return root / f"v{version:06d}"


def save_optimizer_state(
    root: str | Path, version: int, optimizer: torch.optim.Optimizer, steps: int, keep: int = 2
) -> Path:
    """Write the state after update ``version``; keep the ``keep`` newest (0 keeps all)."""
    root = Path(root)
    final = _path(root, version)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    state = {"version": version, "steps": steps, "state": optimizer.state_dict()["state"]}
    torch.save(state, partial / OPTIMIZER_FILE)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    if keep > 0:
        old = sorted(p for p in root.iterdir() if _NAME.match(p.name))
        for path in old[:-keep]:
            shutil.rmtree(path)
    log.info("learner_state_saved", path=str(final), version=version)
    return final


def load_optimizer_state(
    root: str | Path, version: int, optimizer: torch.optim.Optimizer
) -> int | None:
    """Load the AdamW state after update ``version`` into ``optimizer``; the learner's
    update count then, or None (moments stay zero) when there is no such state."""
    path = _path(Path(root), version) / OPTIMIZER_FILE
    if not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    current = optimizer.state_dict()
    optimizer.load_state_dict({"state": saved["state"], "param_groups": current["param_groups"]})
    log.info("learner_state_loaded", path=str(path), version=version, steps=saved["steps"])
    return int(saved["steps"])


def remove_newer_states(root: str | Path, version: int) -> None:
    """Delete states written after update ``version`` (orphans: their checkpoint was never
    announced, so those updates will be trained again)."""
    root = Path(root)
    if not root.is_dir():
        return
    for path in root.iterdir():
        match = re.match(r"^v(\d+)(\.partial)?$", path.name)
        if match and (match.group(2) or int(match.group(1)) > version):
            log.warning("orphan learner state removed", path=str(path))
            shutil.rmtree(path)
