"""Shared unit-test fixtures."""

from __future__ import annotations

import uuid

import pykka
import pytest

from agentrl.actors import TopologySpec
from agentrl.messages import Topology, connect
from agentrl.messages._memory import reset_memory_broker


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (with its ChatML chat template).

    Taken from the ``tiny`` model directory, built once into the model cache.
    """
    from agentrl.trainer._models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("tiny"))


@pytest.fixture
def broker():
    """A fresh in-process broker's URL, reset afterwards."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}"
    reset_memory_broker(name)


@pytest.fixture
def spec():
    """A run topology under a unique name: one `current` pool."""
    return TopologySpec(run=f"r{uuid.uuid4().hex[:6]}", pools=("current",), trajectory_capacity=64)


@pytest.fixture
def client(broker, spec):
    """A transport on ``broker`` with ``spec``'s topology declared."""
    transport = connect(broker, name="test-client")
    Topology(spec.run).declare(transport, list(spec.pools), spec.trajectory_capacity)
    yield transport
    transport.close()


@pytest.fixture
def stop_actors():
    """Stops every pykka actor a test left running."""
    yield
    pykka.ActorRegistry.stop_all()
