"""The Megatron-core learner backend: TP x PP x DP ranks, the torch backend's GRPO update.

Metrics: exactly those of the torch backend (:mod:`agentrl.trainer._backend`
documents them), computed over the whole batch whatever the layout; ``learner/entropy``
is computed vocab-parallel.

Processes: :class:`MegatronLearner` is rank 0 and lives in the learner actor's
process; it starts ranks 1.. as worker processes (:mod:`._launch`) and, for
each ``step`` and ``save``, broadcasts the command (and the whole batch) to
them. Every rank runs a :class:`RankTrainer` on its shard.

Checkpoints: ``save`` writes the HF safetensors checkpoint the samplers load
(gathered to rank 0; same layout and DIGEST as ``TorchLearner.save``), then,
every ``state_every`` updates, the resumable model + AdamW state with
``dist_checkpointing`` (:mod:`._state`). On start at version N the state of
update N is loaded when it exists, in whatever TP/PP/DP layout it was saved.

Optimiser: ``torch.optim.AdamW`` on each rank's shard (elementwise, so sharding
does not change it). Megatron's distributed optimizer does not run on CPU;
on GPU it could replace AdamW here (see docs/megatron.md).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import structlog
import torch.distributed as dist

from .._batch import TrainBatch
from .._device import resolve_device
from .._sft import check_objective
from ._launch import (
    Command,
    MegatronSpec,
    check_workers,
    free_port,
    init_process_group,
    send_command,
    spawn_workers,
)
from ._model import UnsupportedModelError
from ._rank import RankTrainer

__all__ = ["MegatronLearner"]

log = structlog.get_logger(__name__)


def check_layout(model_dir: str | Path, tp: int, pp: int) -> None:
    """Raise UnsupportedModelError (listing every problem) if the model cannot be split so.

    TP splits attention heads, KV heads and the MLP width; PP splits the layers.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    heads = config.num_attention_heads
    sizes = {
        "attention heads": heads,
        "KV heads": getattr(config, "num_key_value_heads", None) or heads,
        "intermediate size": config.intermediate_size,
    }
    problems = [f"{n} {name} do not split over tp={tp}" for name, n in sizes.items() if n % tp]
    if config.num_hidden_layers % pp:
        problems.append(f"{config.num_hidden_layers} layers do not split over pp={pp}")
    if problems:
        raise UnsupportedModelError(f"{model_dir}: " + "; ".join(problems))


class MegatronLearner:
    """GRPO learner on a megatron-core GPTModel over ``tp * pp * dp`` processes.

    Implements ``LearnerBackend`` (``step``, ``save``) with the torch
    backend's loss and metrics; the constructor takes the torch backend's
    hyper-parameters plus the layout and the resumable-state settings
    (see :class:`MegatronSpec`). Call :meth:`close` to stop the workers.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tp: int = 1,
        pp: int = 1,
        dp: int = 1,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        temperature: float = 0.8,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = 3.0,
        kl_coef: float = 1e-4,
        is_cap: float | None = 2.0,
        warmup_steps: int = 0,
        micro_batch_tokens: int = 4096,
        dtype: str = "float32",
        seed: int = 0,
        version: int = 0,
        reference_dir: str | Path | None = None,
        state_dir: str | Path | None = None,
        state_every: int = 1,
        keep_states: int = 2,
        threads: int = 0,
        objective: str = "grpo",
        device: str = "cpu",
    ) -> None:
        """``device``: ``cpu`` (gloo) or ``cuda``/``cuda:N``/``auto`` (rank r on GPU r, NCCL);
        weights, reference and AdamW state live there (`MegatronSpec.device`)."""
        if min(tp, pp, dp) < 1 or state_every < 1:
            raise ValueError(
                f"tp, pp, dp, state_every must be >= 1 (got {tp}, {pp}, {dp}, {state_every})"
            )
        if temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (greedy tokens cannot be trained on), got {temperature}"
            )
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group already exists in this process")
        check_layout(model_dir, tp, pp)
        resolve_device(device)  # a device this node lacks is refused before any worker starts
        self.spec = MegatronSpec(
            model_dir=str(model_dir),
            tp=tp,
            pp=pp,
            dp=dp,
            lr=lr,
            weight_decay=weight_decay,
            betas=tuple(betas),
            grad_clip=grad_clip,
            temperature=temperature,
            clip_low=clip_low,
            clip_high=clip_high,
            dual_clip=dual_clip,
            kl_coef=kl_coef,
            is_cap=is_cap,
            warmup_steps=warmup_steps,
            micro_batch_tokens=micro_batch_tokens,
            dtype=dtype,
            seed=seed,
            version=version,
            reference_dir=None if reference_dir is None else str(reference_dir),
            state_dir=None if state_dir is None else str(state_dir),
            state_every=state_every,
            keep_states=keep_states,
            threads=threads,
            objective=check_objective(objective),
            device=device,
            master_port=free_port(),
        )
        self._procs: list[subprocess.Popen] = spawn_workers(self.spec)
        self._rank: RankTrainer | None = None
        self._broken = False  # a command failed mid-way: the ranks may be out of step
        try:
            init_process_group(self.spec, 0)
            self._rank = RankTrainer(self.spec)
        except BaseException:
            self._kill_workers()
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        log.info(
            "megatron_learner_loaded",
            model_dir=str(model_dir),
            tp=tp,
            pp=pp,
            dp=dp,
            device=str(self._rank.device),
            version=version,
            workers=[p.pid for p in self._procs],
        )

    @property
    def version(self) -> int:
        """Policy version of the current weights (+1 per update)."""
        return self._trainer().version

    @property
    def steps(self) -> int:
        """Optimiser updates done by this learner."""
        return self._trainer().steps

    def _trainer(self) -> RankTrainer:
        if self._rank is None:
            raise RuntimeError("the megatron learner is closed")
        return self._rank

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW update on the whole batch over every rank; the torch backend's metrics."""
        trainer = self._trainer()
        check_workers(self._procs)
        try:
            send_command(Command("step", batch=batch))
            return trainer.step(batch)
        except BaseException:
            self._broken = True
            raise

    def save(self, out_dir: str | Path) -> str:
        """HF safetensors checkpoint + DIGEST in ``out_dir`` (and the resumable state when due)."""
        trainer = self._trainer()
        check_workers(self._procs)
        try:
            send_command(Command("save", path=str(out_dir)))
            digest = trainer.save(out_dir)
        except BaseException:
            self._broken = True
            raise
        if digest is None:
            raise RuntimeError("rank 0 did not write the checkpoint")
        return digest

    def close(self, timeout: float = 60.0) -> None:
        """Stop the workers and leave the process group (idempotent).

        After a failed command the workers may be inside a collective that rank 0
        left: they are killed rather than sent ``stop``.
        """
        if self._rank is None:
            return
        try:
            if not self._broken and all(p.poll() is None for p in self._procs):
                send_command(Command("stop"))
                for proc in self._procs:
                    proc.wait(timeout=timeout)
        finally:
            self._kill_workers()
            self._rank.close()
            self._rank = None

    def _kill_workers(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        bad = {p.pid: p.returncode for p in self._procs if p.returncode not in (0, None)}
        if bad:
            log.warning("megatron workers exited with errors", exit_codes=bad, pid=os.getpid())
