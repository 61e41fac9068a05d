"""LoRA RL (``learner.lora``): the policy is a frozen base model plus low-rank adapters.

Each target linear layer's weight W (``[out, in]``) acts as

    W' = W + (alpha / r) · B A,        A: [r, in] (random), B: [out, r] (zeros at the start)

(Hu et al. 2021, arXiv:2106.09685; built with ``peft``). Only A and B train, so the
optimiser holds the adapters' moments only, and the policy at the start is the base
exactly (B = 0). Three consequences the learner and the samplers rely on:

- **The KL reference is the base model itself**: the same modules with the adapters
  disabled (``peft``'s ``disable_adapter``), no second copy of the model in memory.
  The base is the run's KL reference (`ops.sft.warm_start.kl_reference`: the warm-started
  model after ``agentrl sft``, else the run's model), which outlives checkpoint pruning.
- **A checkpoint is the adapter only**: ``adapter_model.safetensors`` and
  ``adapter_config.json`` (``peft``'s format; ``base_model_name_or_path`` holds the
  base's absolute directory), the tokenizer files, ``DIGEST``: MBs, not the model.
- **Samplers merge**: `merge_adapter` adds (alpha / r) · B A to the base's weights in
  float32; `merged_state` reads the base from disk and merges, so an engine holds exactly
  base + adapter after every load, whatever it held before. ``load_causal_lm`` builds a
  model from an adapter directory the same way (engines started on one, ``agentrl eval``).

Simplified: plain LoRA only (no DoRA, rsLoRA, per-module ranks, biases): `merge_adapter`
refuses adapters that use them. The SFT warm start trains the whole model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "DEFAULT_TARGETS",
    "LoraError",
    "LoraSpec",
    "adapter_base",
    "is_adapter",
    "lora_problems",
    "merge_adapter",
    "merged_state",
    "read_weights",
    "spec_of",
]

ADAPTER_CONFIG = "adapter_config.json"
"""In an adapter checkpoint: peft's config (rank, alpha, targets, the base's directory)."""

ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""In an adapter checkpoint: the A and B matrices of every target module."""

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama/Qwen2/Mistral block."""

_UNSUPPORTED = ("use_dora", "use_rslora", "fan_in_fan_out", "lora_bias", "rank_pattern")
"""peft options `merge_adapter` does not implement (falsy in the adapters written here)."""


class LoraError(ValueError):
    """Raised when an adapter checkpoint cannot be used: unreadable, its base missing, or
    an adapter other than the one the run configures."""


def lora_problems(
    rank: int, alpha: float, dropout: float, target_modules: tuple[str, ...] | list[str]
) -> list[str]:
    """Each problem of a LoRA setting, one line each (field name first)."""
    problems = []
    if rank < 1:
        problems.append(f"rank: must be >= 1, got {rank}")
    if alpha <= 0:
        problems.append(f"alpha: must be > 0, got {alpha}")
    if not 0 <= dropout < 1:
        problems.append(f"dropout: must be in [0, 1), got {dropout}")
    if not target_modules or not all(isinstance(t, str) and t for t in target_modules):
        problems.append("target_modules: must be a non-empty list of module names")
    elif len(set(target_modules)) != len(target_modules):
        problems.append(f"target_modules: {list(target_modules)} names a module twice")
    return problems


@dataclass(frozen=True)
class LoraSpec:
    """The adapters a LoRA learner trains (``learner.lora``)."""

    rank: int = 16
    """r: the inner size of B A."""
    alpha: float = 32.0
    """The update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training (> 0 makes the learner's logprobs differ
    from the samplers', so `rollout/logprob_gap_current` is no longer ~0)."""
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    """Names of the linear layers that get adapters."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        problems = lora_problems(self.rank, self.alpha, self.dropout, self.target_modules)
        if problems:
            raise ValueError("lora: " + "; ".join(problems))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def is_adapter(directory: str | Path) -> bool:
    """Whether ``directory`` is an adapter checkpoint (it holds ``adapter_config.json``)."""
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def _config(directory: Path) -> dict:
    try:
        return json.loads((directory / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise LoraError(f"{directory / ADAPTER_CONFIG}: unreadable: {exc}") from exc


def adapter_base(directory: str | Path) -> Path:
    """The base model directory an adapter checkpoint sits on; LoraError if it is gone."""
    directory = Path(directory)
    base = _config(directory).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise LoraError(f"{directory}: its base model {base!r} is not a model directory")
    return Path(base)


def spec_of(directory: Path) -> LoraSpec:
    """The adapter's own setting, refusing what `merge_adapter` does not implement."""
    config = _config(directory)
    used = [key for key in _UNSUPPORTED if config.get(key)]
    if used or config.get("peft_type", "LORA") != "LORA" or config.get("alpha_pattern"):
        raise LoraError(f"{directory}: only plain LoRA adapters load here (it uses {used})")
    try:
        return LoraSpec(
            rank=config["r"],
            alpha=config["lora_alpha"],
            dropout=config.get("lora_dropout", 0.0),
            target_modules=tuple(sorted(config["target_modules"])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LoraError(f"{directory}: not a LoRA adapter config: {exc}") from exc


def read_weights(directory: str | Path, keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the ``*.safetensors`` files of ``directory`` (only ``keys`` if given),
    as stored (a float32 checkpoint stays float32)."""
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise LoraError(f"no *.safetensors files in {directory}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if keys is None or key in keys:
                    state[key] = fh.get_tensor(key)
    return state


_PREFIX = "base_model.model."
"""peft's prefix of the base model's module names in the adapter file."""


def _adapter_pairs(directory: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Base weight name (``model.layers.0.self_attn.q_proj.weight``) -> (A, B)."""
    tensors = read_weights(directory)
    pairs = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")].removeprefix(_PREFIX)
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise LoraError(f"{directory}: {key} has no lora_B")
        pairs[f"{module}.weight"] = (a, b)
    if not pairs:
        raise LoraError(f"{directory}: no LoRA matrices in {ADAPTER_WEIGHTS}")
    return pairs


def merge_adapter(base: dict[str, torch.Tensor], directory: str | Path) -> dict[str, torch.Tensor]:
    """The adapted weights W + (alpha / r) · B A of the adapter in ``directory`` over the
    ``base`` tensors (a state dict holding at least the target weights), computed in
    float32 and returned in each base tensor's dtype; only the adapted weights."""
    directory = Path(directory)
    spec = spec_of(directory)
    merged = {}
    for name, (a, b) in _adapter_pairs(directory).items():
        if name not in base:
            raise LoraError(f"{directory}: adapts {name}, which the base model does not have")
        weight = base[name]
        delta = spec.scale * (b.float() @ a.float())
        if delta.shape != weight.shape:
            shapes = f"B A {tuple(delta.shape)}, W {tuple(weight.shape)}"
            raise LoraError(f"{directory}: {name} does not fit: {shapes}")
        merged[name] = (weight.float() + delta.to(weight.device)).to(weight.dtype)
    return merged


def merged_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the adapter's base model as stored, the adapted ones merged."""
    state = read_weights(adapter_base(directory))
    state.update(merge_adapter(state, directory))
    return state
