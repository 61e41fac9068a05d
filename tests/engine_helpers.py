"""Helpers shared by the engine conformance suites (unit, and the vLLM tox env).

`EngineCase` is what a suite module's `engine_case` fixture returns. `hf_teacher`
scores tokens with a teacher-forced forward pass of the Hugging Face model, and
`perturbed_checkpoint` writes a full HF model directory whose weights differ
from the original, for the weight-reload tests.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

Teacher = Callable[[Path | None, list[int], list[int], float], list[float]]
"""teacher(checkpoint or None for the initial weights, prompt_ids, token_ids, temperature)
-> logprob of each token (temperature 0 scores with T = 1)."""


@dataclass
class EngineCase:
    engine: object
    """The SamplerEngine under test, at version 0 with its initial weights."""
    checkpoint: Path
    """Weights different from the initial ones, loadable by ``engine.load``."""
    teacher: Teacher


def hf_teacher(initial_dir: Path) -> Teacher:
    """A teacher from the HF model in ``initial_dir`` (and any checkpoint of it), fp32."""
    from agentrl.trainer._models import load_causal_lm

    models: dict[Path | None, torch.nn.Module] = {}

    def teacher(checkpoint, prompt_ids, token_ids, temperature):
        if checkpoint not in models:
            source = initial_dir if checkpoint is None else checkpoint
            models[checkpoint] = load_causal_lm(source, dtype=torch.float32).eval()
        ids = torch.tensor([list(prompt_ids) + list(token_ids)])
        with torch.inference_mode():
            logits = models[checkpoint](ids).logits[0, len(prompt_ids) - 1 : -1].float()
        temp = temperature if temperature > 0 else 1.0
        logp = torch.log_softmax(logits / temp, -1)
        return logp.gather(1, torch.tensor(token_ids)[:, None])[:, 0].tolist()

    return teacher


def perturbed_checkpoint(model_dir: Path, out_dir: Path, *, scale: float = 0.5) -> Path:
    """Copy the HF model in ``model_dir`` to ``out_dir`` with seeded noise on every weight."""
    from safetensors.torch import save_file

    from agentrl.trainer._models import load_causal_lm

    out_dir.mkdir(parents=True, exist_ok=True)
    for item in Path(model_dir).iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name != "DIGEST":
            shutil.copy(item, out_dir / item.name)
    model = load_causal_lm(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    seen: set[int] = set()
    state = {}
    for name, param in model.named_parameters():  # tied weights appear once
        if id(param) in seen:
            continue
        seen.add(id(param))
        state[name] = (param + scale * torch.randn(param.shape, generator=gen)).detach()
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"))
    return out_dir
