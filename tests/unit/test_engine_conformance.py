"""The engine conformance suite on the torch engine (tiny model) and the scripted fake."""

import pytest

from agentrl.actors import TorchEngine
from agentrl.actors._fakes import ScriptedEngine
from agentrl.trainer import resolve_model
from tests.unit.engine_suite import *  # noqa: F403


def _script(prompt, version):
    return [(prompt[-1] * 7 + i * 3) % 50 for i in range(10)]


@pytest.fixture(params=["torch", "scripted"])
def engine_case(request, tmp_path):
    if request.param == "torch":
        model_dir = resolve_model("tiny")
        engine = TorchEngine(model_dir, max_batch=4)
        checkpoint = model_dir
    else:
        engine = ScriptedEngine(_script)
        checkpoint = tmp_path
    yield engine, checkpoint
    engine.close()
