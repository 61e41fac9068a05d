"""``agentrl sft``: a supervised warm start of a run's policy on its tasks' oracles.

A small model that never completes a task gives GRPO groups of equal rewards,
hence zero advantages and no signal. The warm start trains the run's model for
``steps`` AdamW updates on oracle episodes of the run's tasks (their train
split, mixed by the tasks' weights, `sft.data`), with the token-mean NLL of
the assistant tokens (`agentrl.trainer._sft`), through the run's own learner
backend (``learner.backend``: torch or megatron) and its grad clipping. It ends
with checkpoint ``runs/<run>/checkpoints/v<steps>`` written by the backend's
``save`` and the warm-start record (`sft.warm_start`): ``agentrl-supervisor start``
then resumes the RL run at that version, with the warm-started model as the
KL reference.

``runs/<run>/sft.jsonl`` gets one line per update: ``step``, ``loss`` (the
NLL before the update), ``grad_norm``, ``tokens``, ``episodes`` and ``skipped``
(per task, cumulative; skips by reason) and ``time``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from agentrl.actors import EpisodeLimits
from agentrl.environments import ChatFormat
from agentrl.trainer import LearnerBackend, TorchLearner, build_batch, load_tokenizer, resolve_model

from ..config.schema import RunConfig
from ..run.run_dir import latest_checkpoint
from .data import OracleMix, make_train_task
from .warm_start import WarmStart, write_warm_start

log = structlog.get_logger(__name__)

__all__ = ["METRICS_FILE", "SFTError", "run_sft"]

METRICS_FILE = "sft.jsonl"
"""In the run directory: one JSON line per warm-start update."""

MakeBackend = Callable[[Path, float], LearnerBackend]
"""``make_backend(model_dir, lr)``: the learner backend, built with ``objective="sft"``."""


class SFTError(RuntimeError):
    """Raised when a warm start cannot run (the run already has checkpoints, bad sizes)."""


@dataclass(frozen=True)
class SFTResult:
    """What a warm start produced."""

    record: WarmStart
    """The warm-start record (checkpoint, version, digest)."""
    losses: list[float]
    """NLL of each update's batch, before the update."""
    episodes: dict[str, int]
    """Oracle episodes trained on, per task."""
    skipped: dict[str, dict[str, int]]
    """Instances skipped per task, by reason."""


def run_sft(
    cfg: RunConfig,
    *,
    steps: int,
    batch_episodes: int | None = None,
    lr: float | None = None,
    make_backend: MakeBackend | None = None,
) -> SFTResult:
    """Warm-start ``cfg``'s model (module doc); ``batch_episodes`` defaults to the run's
    episodes per batch and ``lr`` to ``learner.lr``."""
    episodes = cfg.episodes_per_batch if batch_episodes is None else batch_episodes
    lr = cfg.learner.lr if lr is None else lr
    if steps < 1 or episodes < 1 or lr <= 0:
        raise SFTError(
            f"steps and batch episodes must be >= 1 and lr > 0: {steps}, {episodes}, {lr}"
        )
    ckpt_dir = cfg.run_dir / "checkpoints"
    latest = latest_checkpoint(ckpt_dir) if ckpt_dir.exists() else None
    if latest is not None:
        raise SFTError(
            f"run {cfg.run!r} already has checkpoint {latest[1]}; a warm start begins a fresh "
            "run (choose another --run)"
        )
    model_dir = resolve_model(cfg.model)
    tokenizer = load_tokenizer(model_dir)
    mix = _oracle_mix(cfg, ChatFormat(tokenizer), tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    torch.set_num_threads(cfg.torch_threads or max(1, (os.cpu_count() or 1) // _ranks(cfg)))
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = cfg.run_dir / METRICS_FILE
    backend = (make_backend or _backend_factory(cfg))(model_dir, lr)
    losses: list[float] = []
    try:
        for step in range(1, steps + 1):
            batch = build_batch(mix.sample(episodes), pad_id=pad_id)
            stats = backend.step(batch)
            losses.append(stats["learner/loss"])
            line = {
                "time": time.time(),
                "step": step,
                "loss": stats["learner/loss"],
                "grad_norm": stats["learner/grad_norm"],
                "tokens": stats["learner/tokens"],
                "episodes": dict(mix.counts),
                "skipped": {t: dict(c) for t, c in mix.skipped.items()},
            }
            with metrics_path.open("a") as fh:
                fh.write(json.dumps(line) + "\n")
            log.info("sft update", step=step, loss=round(line["loss"], 4), tokens=line["tokens"])
        path = ckpt_dir / f"v{steps:06d}"
        digest = backend.save(path)
    finally:
        close = getattr(backend, "close", None)
        if close is not None:  # the megatron backend's worker ranks
            close()
    record = write_warm_start(cfg.run_dir, steps, path, digest, cfg.model)
    log.info("sft checkpoint", path=str(path), version=steps, digest=digest[:12])
    return SFTResult(
        record=record,
        losses=losses,
        episodes=dict(mix.counts),
        skipped={t: dict(c) for t, c in mix.skipped.items()},
    )


def _oracle_mix(cfg: RunConfig, fmt: ChatFormat, tokenizer) -> OracleMix:
    """The run's tasks on their train split, weighted as configured, within the rollout's
    limits (an episode the rollout could not sample is skipped)."""
    envs, factories, splits, r = {}, {}, {}, cfg.rollout
    for name, task in cfg.tasks.items():
        factory = getattr(task, "task", None) or name  # an entry may name another task
        envs[name], splits[name] = make_train_task(factory, task.options)
        factories[name] = factory
    log.info("sft data", splits=splits, instances={n: e.num_instances for n, e in envs.items()})
    return OracleMix(
        envs=envs,
        weights={name: task.weight for name, task in cfg.tasks.items()},
        fmt=fmt,
        tokenizer=tokenizer,
        limits=EpisodeLimits(
            max_turns=r.max_turns, max_tokens=r.max_tokens, max_new_tokens=r.max_new_tokens
        ),
        seed=cfg.seed,
        factories=factories,
    )


def _ranks(cfg: RunConfig) -> int:
    ln = cfg.learner
    return ln.megatron.world if ln.backend == "megatron" else 1


def _backend_factory(cfg: RunConfig) -> MakeBackend:
    """The run's learner backend with the SFT objective, no KL, fresh AdamW."""
    ln = cfg.learner

    def torch_backend(model_dir: Path, lr: float) -> LearnerBackend:
        bf16 = ln.bf16_compute_on()  # warns where bfloat16 is slow, as for the RL learner
        return TorchLearner(
            model_dir,
            lr=lr,
            weight_decay=ln.weight_decay,
            grad_clip=ln.grad_clip,
            kl_coef=0.0,  # the NLL has no KL term: no reference model
            micro_batch_tokens=ln.micro_batch_tokens,
            gradient_checkpointing=ln.gradient_checkpointing,
            # bf16_compute: RL updates only; its warm start runs under autocast
            autocast=ln.autocast_on() or bf16,
            device=ln.device,
            dtype=ln.dtype,
            seed=cfg.seed,
            objective="sft",
        )

    def megatron_backend(model_dir: Path, lr: float) -> LearnerBackend:
        from agentrl.trainer.megatron import MegatronLearner

        # No resumable state: the RL run starts its AdamW moments afresh at v<steps>.
        return MegatronLearner(
            model_dir,
            tp=ln.megatron.tp,
            pp=ln.megatron.pp,
            dp=ln.megatron.dp,
            lr=lr,
            weight_decay=ln.weight_decay,
            grad_clip=ln.grad_clip,
            kl_coef=0.0,  # the NLL has no KL term: no reference model
            micro_batch_tokens=ln.micro_batch_tokens,
            dtype=ln.dtype,
            seed=cfg.seed,
            threads=cfg.torch_threads or max(1, (os.cpu_count() or 1) // ln.megatron.world),
            objective="sft",
            device=ln.device,
        )

    return megatron_backend if ln.backend == "megatron" else torch_backend
