"""Where tensors live: the one place a device name becomes a ``torch.device``.

Every component that computes (the torch learner, the Megatron ranks, the
torch sampler engine) takes a device *name* from the run config and calls
:func:`resolve_device` once, at construction; everything it allocates later
follows the device of its own weights. Names:

- ``cpu``: the CPU (the default everywhere).
- ``cuda`` / ``cuda:N``: a CUDA GPU (``cuda`` = the current one, ``cuda:0`` unless set).
- ``auto``: ``cuda`` when torch sees a CUDA device, else ``cpu``.

:func:`device_problem` checks a name's *spelling* (config validation: a node
without a GPU may validate a config whose GPU roles run elsewhere);
:func:`resolve_device` also checks that the device is there and raises
:class:`DeviceUnavailable` with one clear line when it is not.

:func:`rank_device` is the device of one distributed rank: ``cuda:LOCAL_RANK``
(modulo the GPUs visible) for a CUDA learner, the CPU otherwise.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEVICE_NAMES",
    "DeviceUnavailable",
    "device_problem",
    "rank_device",
    "resolve_device",
]

DEVICE_NAMES = "cpu, cuda, cuda:N or auto"
"""How the accepted names are listed in error messages."""

_PATTERN = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


class DeviceUnavailable(RuntimeError):
    """Raised when a config asks for a device this process cannot see (no CUDA, bad index)."""


def device_problem(name: object) -> str | None:
    """Why ``name`` is not a device name agentrl accepts, or None (spelling only)."""
    if not isinstance(name, str) or not _PATTERN.match(name):
        return f"{name!r} is not a device (use {DEVICE_NAMES})"
    return None


def resolve_device(name: str | torch.device) -> torch.device:
    """The ``torch.device`` for ``name``; raises ValueError (spelling) or DeviceUnavailable."""
    import torch

    if isinstance(name, torch.device):
        name = str(name)
    problem = device_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = torch.__version__
        raise DeviceUnavailable(
            f"device {name!r}: torch {build} sees no CUDA device "
            "(a CPU build of torch, no GPU, or CUDA_VISIBLE_DEVICES empty); use cpu or auto"
        )
    device = torch.device(name)
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceUnavailable(f"device {name!r}: only {count} CUDA device(s) visible")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def rank_device(name: str, local_rank: int) -> torch.device:
    """The device of distributed rank ``local_rank`` on its node for a learner on ``name``.

    CPU learners: the CPU. CUDA learners: GPU ``local_rank`` modulo the GPUs
    visible (one rank per GPU is the intended layout; an explicit ``cuda:N``
    puts rank 0 on N and the others after it).
    """
    import torch

    base = resolve_device(name)
    if base.type != "cuda":
        return base
    count = torch.cuda.device_count()
    return torch.device("cuda", (base.index + local_rank) % count)
