"""The GPU suite (`pytest -m gpu`, `tox -e gpu`): agentrl's device paths on a real GPU.

Every test here runs on ``AGENTRL_GPU_TEST_DEVICE`` (default ``cuda``) and is
skipped, with the reason, where torch sees no CUDA device. The same suite runs
on the CPU with ``AGENTRL_GPU_TEST_DEVICE=cpu`` (a check of the suite itself,
not of a GPU).

The model is a randomly initialised one of SmolLM2-135M-Instruct's shape and
tokenizer (`write_random_model`): its config and tokenizer files come from
``AGENTRL_GPU_MODEL_SOURCE`` (a directory holding them; the weights are not
read) or, by default, from the converted ``smollm2`` model of this machine.
``AGENTRL_GPU_MODEL_LAYERS`` makes it shallower (quick CPU checks).
Measured figures (logprob gaps, update differences) are printed and, with
``AGENTRL_GPU_REPORT=FILE``, appended to FILE as JSON lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

DEVICE_ENV = "AGENTRL_GPU_TEST_DEVICE"
SOURCE_ENV = "AGENTRL_GPU_MODEL_SOURCE"
LAYERS_ENV = "AGENTRL_GPU_MODEL_LAYERS"
REPORT_ENV = "AGENTRL_GPU_REPORT"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def device() -> str:
    """The device the suite runs on; skips the suite where it is CUDA and none is visible."""
    name = os.environ.get(DEVICE_ENV, "cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(
            f"no CUDA device visible (torch {torch.__version__}, torch.cuda.is_available() is "
            f"False): the GPU suite needs one; {DEVICE_ENV}=cpu runs it on the CPU"
        )
    return name


@pytest.fixture(scope="session")
def model_dir(device, tmp_path_factory) -> Path:
    """A random SmolLM2-shaped model (float32 safetensors) with SmolLM2's tokenizer."""
    from agentrl.trainer import resolve_model
    from agentrl.trainer._models import write_random_model

    source = os.environ.get(SOURCE_ENV) or resolve_model("smollm2")
    layers = os.environ.get(LAYERS_ENV)
    out = tmp_path_factory.mktemp("model") / "smollm2-random"
    return write_random_model(
        source, out, seed=0, num_hidden_layers=int(layers) if layers else None
    )


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from agentrl.trainer import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture
def report(request, device):
    """``report(**figures)``: print the test's measured figures and append them to the report."""

    def write(**figures) -> None:
        line = {"test": request.node.name, "device": _device_name(device), **figures}
        print("GPU-REPORT " + json.dumps(line))
        path = os.environ.get(REPORT_ENV)
        if path:
            with open(path, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    return write


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
