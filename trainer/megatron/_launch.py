"""The learner's process group: rank 0 in the learner's process, ranks 1.. as workers.

Rank 0 runs inside the normal learner actor (it alone talks to the broker).
The other ranks are ``python -m agentrl.trainer.megatron._worker`` processes
started here, one per rank, on this node. They join a gloo (CPU) or NCCL
(GPU: rank r on GPU r, ``rank_device``) process group over TCP on
``127.0.0.1:<free port>``, build their model shard from the same
:class:`MegatronSpec` (passed as JSON in the environment) and then carry out
each :class:`Command` of rank 0, received by a torch.distributed broadcast,
until ``stop``. All ranks are on one node.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._batch import TrainBatch
from .._device import rank_device

__all__ = [
    "SPEC_ENV",
    "Command",
    "MegatronSpec",
    "WorkerDied",
    "init_process_group",
    "receive_command",
    "send_command",
    "spawn_workers",
]

SPEC_ENV = "AGENTRL_MEGATRON_SPEC"
"""Environment variable carrying a worker's MegatronSpec as JSON."""

TIMEOUT = datetime.timedelta(minutes=30)
"""How long a collective waits for the other ranks (rank 0 may wait that long for a batch)."""


class WorkerDied(RuntimeError):
    """Raised on rank 0 when a worker process has exited (its rank and exit code)."""


@dataclass(frozen=True)
class MegatronSpec:
    """Everything a rank needs to build its shard of the learner; crosses to workers as JSON."""

    model_dir: str
    """HF model directory the run starts from (or resumes weights from)."""
    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    dp: int = 1
    """Data-parallel size; world = tp * pp * dp."""
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    temperature: float = 0.8
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    kl_coef: float = 1e-4
    is_cap: float | None = 2.0
    """C of the truncated importance weight (``ppo_clip_loss``)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup over the first N AdamW updates."""
    micro_batch_tokens: int = 4096
    dtype: str = "float32"
    seed: int = 0
    version: int = 0
    """Policy version of the weights in ``model_dir``."""
    reference_dir: str | None = None
    """HF model of the frozen KL reference (the run's initial policy, also after a resume);
    None = ``model_dir``."""
    state_dir: str | None = None
    """Root of the resumable states (``runs/<run>/learner_state``); None = none written."""
    state_every: int = 1
    """Write a state after every N-th update."""
    keep_states: int = 2
    """States kept on disk (0 keeps all)."""
    threads: int = 0
    """torch intra-op threads per rank; 0 leaves torch's default."""
    device: str = "cpu"
    """The learner's device name (``agentrl.trainer._device``): ``cpu`` runs every rank on
    the CPU over gloo; ``cuda`` (or ``cuda:N``, ``auto`` with a GPU) puts rank r on GPU r
    of the node (``rank_device``) over NCCL."""
    objective: str = "grpo"
    """``grpo``, or ``sft``: the warm start's NLL (``agentrl.trainer._sft``)."""
    master_port: int = 0
    """TCP port of the process group's rendezvous on 127.0.0.1 (set by rank 0)."""

    @property
    def world(self) -> int:
        """Number of ranks: tp * pp * dp."""
        return self.tp * self.pp * self.dp

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MegatronSpec:
        raw = json.loads(text)
        raw["betas"] = tuple(raw["betas"])
        return cls(**raw)


@dataclass(frozen=True)
class Command:
    """What rank 0 asks every rank to do next."""

    kind: str
    """``step`` (train on ``batch``), ``save`` (export to ``path``) or ``stop``."""
    batch: TrainBatch | None = None
    """The whole batch of a ``step`` (every rank picks its micro-batches)."""
    path: str | None = None
    """Checkpoint directory of a ``save``."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_workers(spec: MegatronSpec) -> list[subprocess.Popen]:
    """Start ranks 1 .. world-1 as worker processes (they wait for rank 0 to join)."""
    procs = []
    for rank in range(1, spec.world):
        env = dict(os.environ)
        env[SPEC_ENV] = spec.to_json()
        env["AGENTRL_MEGATRON_RANK"] = str(rank)
        env["AGENTRL_MEGATRON_PARENT"] = str(os.getpid())
        if spec.threads:
            env["OMP_NUM_THREADS"] = str(spec.threads)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "agentrl.trainer.megatron._worker"], env=env, cwd=os.getcwd()
            )
        )
    return procs


def init_process_group(spec: MegatronSpec, rank: int) -> torch.device:
    """Join the learner's process group as ``rank``; return the rank's device.

    gloo on the CPU; NCCL on CUDA, with the rank's GPU made current first.
    """
    device = rank_device(spec.device, rank)
    backend = "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        backend = "nccl"
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{spec.master_port}",
        rank=rank,
        world_size=spec.world,
        timeout=TIMEOUT,
    )
    return device


def check_workers(procs: list[subprocess.Popen]) -> None:
    """Raise WorkerDied if any worker process has exited."""
    for rank, proc in enumerate(procs, start=1):
        code = proc.poll()
        if code is not None:
            raise WorkerDied(f"megatron worker rank {rank} exited with code {code}")


def send_command(command: Command) -> None:
    """Rank 0: broadcast ``command`` to every rank."""
    dist.broadcast_object_list([command], src=0)


def receive_command() -> Command:
    """Ranks 1..: block until rank 0 broadcasts the next command."""
    box: list[Command | None] = [None]
    dist.broadcast_object_list(box, src=0)
    command = box[0]
    if not isinstance(command, Command):
        raise TypeError(f"expected a Command from rank 0, got {type(command).__name__}")
    return command
