"""The learner's side of LoRA (`._lora`): the peft model over the base, and its checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from ._digest import checkpoint_digest
from ._lora import LoraError, LoraSpec, adapter_base, is_adapter, spec_of
from ._models import load_causal_lm

__all__ = ["load_policy", "lora_policy", "save_adapter"]

_INSTALL = "pip install -e '.[lora]'"


def _peft():
    try:
        import peft
    except ImportError as exc:
        raise ImportError(f"learner.lora needs the peft package: {_INSTALL}") from exc
    return peft


def _same_model(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve() or checkpoint_digest(a) == checkpoint_digest(b)


def lora_policy(model_dir: Path, spec: LoraSpec, base: Path | None, *, dtype: torch.dtype):
    """``(peft model, base directory)``: adapters over the base, trainable.

    ``model_dir`` is either an adapter checkpoint of this setting (a resume: its adapters
    load) or a full model equal to ``base`` (fresh adapters; the warm start's checkpoint
    beside its reference copy counts as equal). ``base``: the KL reference the run names,
    None = ``model_dir``. A full checkpoint that is not the base is refused: a full
    fine-tune cannot continue as LoRA without losing its updates.
    """
    peft = _peft()
    if is_adapter(model_dir):
        found, recorded = spec_of(model_dir), adapter_base(model_dir)
        wanted = LoraSpec(spec.rank, spec.alpha, spec.dropout, tuple(sorted(spec.target_modules)))
        if found != wanted:
            raise LoraError(f"{model_dir}: the adapter is {found}; learner.lora asks {wanted}")
        if base is not None and base.resolve() != recorded.resolve():
            raise LoraError(f"{model_dir}: adapter of {recorded}, not of the KL reference {base}")
        model = load_causal_lm(recorded, dtype=dtype)
        policy = peft.PeftModel.from_pretrained(model, str(model_dir), is_trainable=True)
        return policy, recorded
    base = model_dir if base is None else base
    if not (base / "config.json").is_file():
        raise LoraError(f"learner.lora needs a local base model directory, got {str(base)!r}")
    if not _same_model(model_dir, base):
        raise LoraError(
            f"{model_dir} is a full checkpoint, not the base {base}: a full fine-tune cannot "
            "be continued with learner.lora"
        )
    model = load_causal_lm(base, dtype=dtype)
    config = peft.LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    policy = peft.get_peft_model(model, config)
    policy.peft_config["default"].base_model_name_or_path = str(base.resolve())
    return policy, base.resolve()


def load_policy(
    model_dir: Path, lora: LoraSpec | None, reference_dir: str | Path | None, *, dtype: torch.dtype
) -> tuple[torch.nn.Module, object | None, Path | None]:
    """The learner's model: ``(model, peft wrapper, base directory)``. With ``lora`` the
    model is the base with the adapters in its modules (HF's own forward, so
    ``logits_to_keep`` and the shared prompt work), the wrapper is peft's (saving,
    ``disable_adapter``); else the model of ``model_dir`` and two Nones. An adapter
    checkpoint without ``lora`` is refused (its AdamW state holds the adapters only)."""
    if lora is not None:
        base = None if reference_dir is None else Path(reference_dir)
        policy, base_dir = lora_policy(model_dir, lora, base, dtype=dtype)
        return policy.get_base_model(), policy, base_dir
    if is_adapter(model_dir):
        raise ValueError(f"{model_dir} is a LoRA adapter checkpoint: set learner.lora")
    return load_causal_lm(model_dir, dtype=dtype), None, None


def save_adapter(policy, out: Path) -> None:
    """Write the adapters only (``ADAPTER_WEIGHTS``, ``ADAPTER_CONFIG``) into ``out``."""
    policy.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # peft's model card template
