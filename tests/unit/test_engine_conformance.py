"""The engine conformance suite on the torch engine (tiny model) and the scripted fake."""

import pytest

from agentrl.actors import TorchEngine
from agentrl.actors._fakes import ScriptedEngine
from agentrl.trainer import resolve_model
from tests.engine_helpers import EngineCase, hf_teacher, perturbed_checkpoint
from tests.unit.engine_suite import *  # noqa: F403

SCRIPTED_LOGPROB = -1.0


def _script(prompt, version):
    return [(prompt[-1] * 7 + i * 3 + version) % 50 for i in range(10)]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return perturbed_checkpoint(resolve_model("tiny"), tmp_path_factory.mktemp("perturbed"))


@pytest.fixture(params=["torch-slot", "torch-hf", "scripted"])
def engine_case(request, tmp_path):
    if request.param.startswith("torch"):
        model_dir = resolve_model("tiny")
        engine = TorchEngine(model_dir, max_batch=4, executor=request.param.split("-")[1])
        case = EngineCase(engine, request.getfixturevalue("tiny_checkpoint"), hf_teacher(model_dir))
    else:
        # The fake's "model" is its script: every token has logprob SCRIPTED_LOGPROB.
        engine = ScriptedEngine(_script, logprob=SCRIPTED_LOGPROB)
        case = EngineCase(engine, tmp_path, lambda ckpt, p, toks, t: [SCRIPTED_LOGPROB] * len(toks))
    yield case
    case.engine.close()
