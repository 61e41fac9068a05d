"""Run configuration: one YAML file, parsed once into typed dataclasses (`schema.py`).

Every problem in a file is collected and reported together in one
:class:`ConfigError`, so a user fixes a config in one pass.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import yaml

from .schema import RunConfig, TaskConfig
from .typed import build_dataclass

__all__ = [
    "BROKER_ENV",
    "ConfigError",
    "load_config",
    "parse_config",
    "read_broker",
]


class ConfigError(ValueError):
    """Raised when a run configuration has one or more problems; lists them all."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


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
    except IsADirectoryError as exc:
        raise ConfigError([f"a directory, not a config file: {path}"], str(path)) from exc
    except PermissionError as exc:
        raise ConfigError([f"cannot be read: {exc.strerror}"], str(path)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"not text (UTF-8): {exc.reason} at byte {exc.start}"], str(path)
        ) from exc
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
    low_high = cfg.serve.reward_range
    if len(low_high) != 2 or not all(map(math.isfinite, low_high)) or low_high[0] > low_high[1]:
        problems.append(f"serve.reward_range: {low_high} is not [low, high], finite, low <= high")
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
    if r.task_timeout <= 0 or r.failure_window < 1:
        problems.append("rollout.task_timeout: must be > 0; rollout.failure_window: >= 1")
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
    if not isinstance(ln.autocast, bool) and ln.autocast != "auto":
        problems.append(f"learner.autocast: must be true, false or auto, got {ln.autocast!r}")
    if ln.autocast is True and (ln.dtype != "float32" or ln.backend != "torch"):
        problems.append(
            "learner.autocast: needs dtype float32 (its master weights) and backend torch"
        )
    if ln.bf16_compute:
        if ln.dtype != "float32" or ln.backend != "torch":
            problems.append(
                "learner.bf16_compute: needs dtype float32 (its master weights) and backend torch"
            )
        if ln.autocast is not False:
            problems.append("learner.bf16_compute: replaces learner.autocast: set one of them")
        if ln.lora is not None:
            problems.append("learner.bf16_compute: trains the whole model: unset learner.lora")
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
