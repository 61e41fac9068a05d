"""Run a function in N fresh local processes wired for torch.distributed (tests, CPU demos).

:func:`run_workers` starts ``world_size`` spawned processes with the torchrun
environment (``MASTER_ADDR``, ``MASTER_PORT`` on a free port, ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``), so :func:`agentrl.trainer.megatron.init_parallel`
takes the env:// path exactly as under torchrun. Each worker's return value
comes back serialised with ``torch.save`` (tensors included); a worker's
exception fails the whole run with its traceback.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ._model import _free_port


class WorkerError(RuntimeError):
    """Raised when a worker process raises, dies or does not finish in time."""


def _entry(fn: Callable, rank: int, world_size: int, port: int, args: tuple, results) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)  # the workers share the machine's cores
    try:
        value = fn(rank, world_size, *args)
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise


def run_workers(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0
) -> list[Any]:
    """``[fn(rank, world_size, *args) for rank in range(world_size)]``, one process per rank.

    ``fn`` must be importable (module level) since workers are spawned. Raises
    :class:`WorkerError` naming the rank when a worker fails or the run exceeds
    ``timeout`` seconds (then the workers are terminated).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, rank, world_size, port, args, results), daemon=True)
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            rank, ok, payload = _next_result(results, procs, values, deadline, timeout)
            if not ok:
                raise WorkerError(f"worker {rank} failed:\n{payload}")
            values[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        for proc in procs:
            proc.join(timeout=30.0)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()
    return [values[rank] for rank in range(world_size)]


def _next_result(results, procs, values: dict, deadline: float, timeout: float) -> tuple:
    """The next ``(rank, ok, payload)`` from the workers; raises when one died silently."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(set(range(len(procs))) - set(values))
            raise WorkerError(f"workers {missing} did not finish in {timeout:.0f} s")
        try:
            return results.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            pass
        dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in values]
        if dead:
            try:  # a failing worker reports before exiting; give its message a moment to arrive
                return results.get(timeout=5.0)
            except queue.Empty:
                code = procs[dead[0]].exitcode
                raise WorkerError(f"worker {dead[0]} exited ({code}) without a result") from None
