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
import shutil
import subprocess
from pathlib import Path

import structlog
import torch
import torch.distributed as dist

from .._backend import DIGEST_FILE, TOKENIZER_FILES
from .._batch import TrainBatch
from .._device import rank_device, resolve_device
from .._digest import checkpoint_digest
from .._learner_state import updates_done, warmup_lr
from .._sft import check_objective
from ._convert import gather_hf_state, load_hf_into
from ._launch import (
    Command,
    MegatronSpec,
    check_workers,
    free_port,
    init_process_group,
    send_command,
    spawn_workers,
)
from ._model import UnsupportedModelError, build_gpt_model, destroy_parallel, init_parallel
from ._state import latest_state, load_state, save_state, state_path
from ._update import LossSettings, MegatronUpdate

__all__ = ["MegatronLearner", "RankTrainer"]

log = structlog.get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

CONFIG_FILES = ("config.json", "generation_config.json")
"""HF files copied from the source model directory into each checkpoint."""


def read_hf_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files of an HF model directory."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


def _recompute_core_attention(model: torch.nn.Module) -> None:
    """Megatron's selective recompute of core attention, on every attention layer.

    The local (unfused) attention keeps its ``[b, heads, s, s]`` scores and
    probabilities for backward: ~4 GB per rank for SmolLM2 on a 4096-token
    micro-batch, most of the learner's memory. Recomputing them in backward
    (``recompute_granularity="selective"``, which layers read at build time)
    costs one more attention forward and changes no number.
    """
    from megatron.core.transformer.attention import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.checkpoint_core_attention = True


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


class RankTrainer:
    """One rank's model shard, frozen reference, AdamW and update (every rank has one).

    Expects the process group to exist; sets up Megatron's model-parallel groups.
    """

    def __init__(self, spec: MegatronSpec) -> None:
        from transformers import AutoConfig

        if spec.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {spec.dtype!r}")
        if spec.threads:
            torch.set_num_threads(spec.threads)
        self.spec = spec
        self.model_dir = Path(spec.model_dir)
        self.version = spec.version
        self.steps = 0
        torch.manual_seed(spec.seed)
        self.device = rank_device(spec.device, dist.get_rank())
        init_parallel(spec.tp, spec.pp, seed=spec.seed, device=str(self.device))
        self.hf_config = AutoConfig.from_pretrained(self.model_dir)
        dtype = _DTYPES[spec.dtype]
        hf_state = read_hf_state(self.model_dir)
        self.model = build_gpt_model(self.hf_config, dtype=dtype, device=self.device)
        load_hf_into(self.model, hf_state, self.hf_config)
        self.model.train()
        _recompute_core_attention(self.model)
        reference = None
        if spec.kl_coef > 0 and spec.objective == "grpo":  # the SFT loss has no KL term
            if spec.reference_dir is not None and Path(spec.reference_dir) != self.model_dir:
                hf_state = read_hf_state(Path(spec.reference_dir))
            reference = build_gpt_model(self.hf_config, dtype=dtype, device=self.device)
            load_hf_into(reference, hf_state, self.hf_config)
            reference.eval().requires_grad_(False)
        del hf_state
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=spec.lr,
            betas=spec.betas,
            weight_decay=spec.weight_decay,
        )
        self.update = MegatronUpdate(
            self.model,
            reference,
            self.optimizer,
            LossSettings(
                temperature=spec.temperature,
                clip_low=spec.clip_low,
                clip_high=spec.clip_high,
                dual_clip=spec.dual_clip,
                kl_coef=spec.kl_coef,
                vocab_size=self.hf_config.vocab_size,
                objective=spec.objective,
                is_cap=spec.is_cap,
            ),
            grad_clip=spec.grad_clip,
            micro_batch_tokens=spec.micro_batch_tokens,
        )
        self._resume()

    def _resume(self) -> None:
        """Load the state of update ``version`` if there is one; drop newer (orphan) states."""
        if self.spec.state_dir is None:
            return
        root = Path(self.spec.state_dir)
        if dist.get_rank() == 0:
            root.mkdir(parents=True, exist_ok=True)
            for path in root.glob("v*"):
                newer = path.name[1:].split(".")[0]
                if newer.isdigit() and int(newer) > self.version:
                    # Written after the last HF checkpoint: that update was never
                    # announced, so its trajectories will be trained again.
                    log.warning("orphan learner state removed", path=str(path))
                    shutil.rmtree(path)
        dist.barrier()
        path = state_path(root, self.version)
        if (path / "metadata.json").exists():
            load_state(path, self.model, self.optimizer)
            return
        older = latest_state(root, at_most=self.version)
        if self.version > 0:
            log.warning(
                "no learner state for this version: AdamW moments start from zero",
                version=self.version,
                newest_state=older[0] if older else None,
            )

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """The GRPO update (collective); metrics are the same on every rank.

        An empty batch changes no weight but advances the version, as in TorchLearner.
        """
        lr = warmup_lr(self.spec.lr, updates_done(self.optimizer), self.spec.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics, stepped = self.update.step(batch, self.version)
        self.version += 1
        if stepped:
            self.steps += 1
            metrics["learner/lr"] = lr
        else:
            log.warning("empty_batch", rows=batch.num_rows)
        return metrics

    def save(self, out_dir: str | Path) -> str | None:
        """HF checkpoint on rank 0 (+ the resumable state when due); digest on rank 0."""
        hf_state = gather_hf_state(self.model, self.hf_config)
        digest = None
        if hf_state is not None:
            digest = self._write_hf(Path(out_dir), hf_state)
        dist.barrier()
        spec = self.spec
        if spec.state_dir is not None and self.version % spec.state_every == 0:
            save_state(
                spec.state_dir, self.version, self.model, self.optimizer, keep=spec.keep_states
            )
        return digest

    def _write_hf(self, out: Path, state: dict[str, torch.Tensor]) -> str:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        tensors = {key: value.contiguous() for key, value in state.items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        for name in (*CONFIG_FILES, *TOKENIZER_FILES):
            source = self.model_dir / name
            if source.is_file() and not (out / name).exists():
                shutil.copy2(source, out / name)
        digest = checkpoint_digest(out)
        (out / DIGEST_FILE).write_text(digest + "\n")
        log.info("checkpoint_saved", out_dir=str(out), digest=digest, steps=self.steps)
        return digest

    def close(self) -> None:
        """Tear down Megatron's groups and this process's process group."""
        destroy_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


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
