"""Resumable learner state: model and AdamW shards in Megatron's ``dist_checkpointing`` format.

Layout: ``<root>/v000012/`` holds the state after update 12 (the same number
as the HF checkpoint ``checkpoints/v000012``). Every rank writes its shards;
the tensors are keyed by their *global* shape and offset, so a state saved
with one TP/PP/DP layout loads into another (TP=2 -> TP=1 and back).

A state is written to ``v000012.partial`` and renamed when every rank is done,
so a directory named ``vN`` is always complete. The AdamW moments are stored
as sharded tensors shaped like their parameters (``optimizer.state.exp_avg.*``);
the step count, common to every parameter, as ``common_step``; the param
groups (lr, betas, ...) are not stored: the run's config sets them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import structlog
import torch
import torch.distributed as dist

__all__ = ["latest_state", "load_state", "save_state", "state_path"]

log = structlog.get_logger(__name__)

_NAME = re.compile(r"^v(\d+)$")


def state_path(root: str | Path, version: int) -> Path:
    """The directory of the state after update ``version``."""
    return Path(root) / f"v{version:06d}"


def latest_state(root: str | Path, at_most: int | None = None) -> tuple[int, Path] | None:
    """The newest complete state under ``root`` (at most version ``at_most``), or None."""
    found = []
    for path in Path(root).glob("v*"):
        match = _NAME.match(path.name)
        if match and path.is_dir() and (path / "metadata.json").exists():
            version = int(match.group(1))
            if at_most is None or version <= at_most:
                found.append((version, path))
    return max(found) if found else None


def _sync_strategy():
    """``torch_dist`` saving without its async writer (which starts a multiprocessing
    Manager and forks writer processes: not safe in the learner's threaded process).

    Same on-disk format: torch.distributed.checkpoint with Megatron's save planner.
    """
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    class SyncTorchDistSave(TorchDistSaveShardedStrategy):
        def save(self, sharded_state_dict, checkpoint_dir) -> None:
            by_key, _, _ = _replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica
            )
            dcp_save(
                mcore_to_pyt_state_dict(by_key, False),
                storage_writer=FileSystemWriter(str(checkpoint_dir), thread_count=1),
                planner=MCoreSavePlanner(flatten_state_dict=False),
            )

    return SyncTorchDistSave("torch_dist", 1, keep_only_main_replica=True)


def _sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, loading: bool) -> dict:
    """The sharded state dict of model + optimizer (Megatron's FP32Optimizer recipe)."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if loading:  # the moments must exist to be loaded into
        for p in params:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    model_sd = model.sharded_state_dict()
    optim_sd = optimizer.state_dict()
    steps = {float(s["step"]) for s in optim_sd["state"].values() if "step" in s}
    if len(steps) > 1:
        raise ValueError(f"AdamW steps differ between parameters: {sorted(steps)}")
    optim_state_to_sharding_state(
        optim_sd, get_param_id_to_sharded_param_map(model_sd, params), exclude_keys=("step",)
    )
    optim_sd["state"]["common_step"] = steps.pop() if steps else 0.0
    return {"model": model_sd, "optimizer": optim_sd}


def save_state(
    root: str | Path,
    version: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    keep: int = 2,
) -> Path:
    """Write the state after update ``version`` (collective: every rank calls it).

    Keeps the ``keep`` newest states (0 keeps all). Returns the final directory.
    """
    from megatron.core import dist_checkpointing

    final = state_path(root, version)
    partial = final.with_name(final.name + ".partial")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    state = _sharded(model, optimizer, loading=False)
    state["version"] = version
    dist_checkpointing.save(state, str(partial), sharded_strategy=_sync_strategy())
    dist.barrier()
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        if keep > 0:
            old = sorted(p for p in Path(root).glob("v*") if _NAME.match(p.name))
            for path in old[:-keep]:
                shutil.rmtree(path)
        log.info("learner_state_saved", path=str(final), version=version)
    dist.barrier()
    return final


def load_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load a state into this rank's model shard and optimizer (collective); its version.

    The layout may differ from the one that saved it: each rank reads the
    slices of the global tensors its shard covers.
    """
    from megatron.core import dist_checkpointing

    state = _sharded(model, optimizer, loading=True)
    state["version"] = -1
    loaded = dist_checkpointing.load(state, str(path))
    model.load_state_dict(loaded["model"])
    optim_sd = loaded["optimizer"]
    step = float(optim_sd["state"].pop("common_step"))
    for param_state in optim_sd["state"].values():
        param_state["step"] = torch.tensor(step, dtype=torch.float32)
    optimizer.load_state_dict(optim_sd)
    version = int(loaded["version"])
    log.info("learner_state_loaded", path=str(path), version=version, optimizer_step=step)
    return version
