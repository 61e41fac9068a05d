"""The Transport conformance suite on `memory://`, plus memory-only details."""

from __future__ import annotations

import uuid

import pytest

from agentrl.messages._connect import connect
from agentrl.messages._memory import MemoryTransport, reset_memory_broker
from agentrl.messages._memory_state import topic_matches
from agentrl.messages._support import Backoff, BrokerRefused, redact_url
from agentrl.messages._transport import Topology, TransportClosed, dead_letter_exchange_for
from tests.unit.transport_suite import *  # noqa: F403  (the shared conformance tests)


@pytest.fixture
def transport_factory():
    broker = f"test-{uuid.uuid4().hex[:8]}"
    made = []

    def make(name: str = "t"):
        transport = connect(f"memory://{broker}", name=name)
        made.append(transport)
        return transport

    yield make
    for transport in made:
        transport.close()
    reset_memory_broker(broker)


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#.z", "x.y.z", True),
        ("*.y.#", "x.y", True),
        ("*.y.#", "y", False),
    ],
)
def test_topic_matches(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected


def test_same_url_shares_a_broker_and_reset_closes_it() -> None:
    url = f"memory://shared-{uuid.uuid4().hex[:8]}"
    first, second = connect(url, name="a"), connect(url, name="b")
    assert isinstance(first, MemoryTransport)
    first.declare_queue("r.q")
    assert second.queue_depth("r.q") == 0
    reset_memory_broker(first.broker_name)
    with pytest.raises(TransportClosed):
        second.publish("", "r.q", b"x")
    fresh = connect(url, name="c")
    with pytest.raises(BrokerRefused, match="404"):
        fresh.queue_depth("r.q")
    fresh.close()


def test_helpers() -> None:
    assert dead_letter_exchange_for("run1.generate.pool") == "run1.dlx"
    assert dead_letter_exchange_for("plain") is None
    assert redact_url("amqp://u:secret@h:5672/v") == "amqp://u:***@h:5672/v"
    assert redact_url("amqp://h/") == "amqp://h/"
    backoff = Backoff(0.05, 0.3)
    assert [backoff.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    assert Topology("r1").generate_queue("big") == "r1.generate.big"
    with pytest.raises(ValueError):
        Topology("has.dot")
    with pytest.raises(ValueError):
        connect("http://x", name="n")
