"""Poison on the broadcast exchanges (``<run>.checkpoints``, ``<run>.control``): every
consumer treats a bad message as the work queues do. It goes to ``<run>.dead`` with the
reason and the exchange it came from, and the consumer goes on. A consumer of a broadcast
reads from a server-named queue of its own, which has no dead-letter exchange of its own;
before, ``dead_letter`` raised there and the controller and every sampler crashed."""

from __future__ import annotations

import math
import threading

import msgpack
import pytest

from agentrl.actors import ControllerActor, SamplerActor, TaskEntry
from agentrl.actors._fakes import FakeBackend, ScriptedEngine
from agentrl.messages import CheckpointReady, Heartbeat, Topology, encode
from agentrl.messages._transport import QUEUE_HEADER, REASON_HEADER
from tests.unit.test_actors import wait_for

pytestmark = pytest.mark.usefixtures("stop_actors")


def _start_both(broker, spec):
    controller = ControllerActor.start(
        broker=broker,
        topology=spec,
        tasks={"a": TaskEntry(weight=1.0, num_instances=5)},
        group_size=2,
        episodes_per_batch=4,
        max_staleness=0,
        initial=CheckpointReady(version=0, uri="/nonexistent", digest="", created_at=0.0),
    )
    engine = ScriptedEngine(lambda p, v: [7])
    sampler = SamplerActor.start(
        broker=broker,
        topology=spec,
        pool="current",
        every=1,
        engine_factory=lambda: engine,
        sampler_id="s0",
        query_timeout=0.2,
    )
    controller.proxy().stats().get()  # answered after on_start: its queues are bound
    sampler.proxy().stats().get()
    return controller, sampler, engine


def _drain_dead(client, names, n: int) -> list:
    dead: list = []
    got = threading.Event()

    def take(delivery) -> None:
        dead.append(delivery)
        delivery.ack()
        if len(dead) >= n:
            got.set()

    client.consume(names.dead, take, prefetch=50)
    assert got.wait(10), [(d.body, d.headers) for d in dead]
    return dead


def test_garbage_on_the_broadcast_exchanges_is_dead_lettered_and_no_consumer_stops(
    broker, spec, client, tmp_path
):
    names = Topology(spec.run)
    controller, sampler, engine = _start_both(broker, spec)
    poison = [  # (exchange, routing key, body)
        (names.checkpoints, "", b"\xc1 not msgpack"),
        (names.checkpoints, "", msgpack.packb({"hello": "world"})),
        (names.control, "heartbeat.sampler", b"\x00\xff\xfe"),
        (names.control, "metrics.learner", msgpack.packb([1, 2, 3])),
    ]
    for exchange, key, body in poison:
        client.publish(exchange, key, body).result(5)
    # each consumer dead-letters what it got: the controller all 4, the sampler the 2
    # checkpoint ones (it does not listen on the control exchange)
    dead = _drain_dead(client, names, len(poison) + 2)
    got = {bytes(d.body): d.headers for d in dead}
    for exchange, _, body in poison:
        assert body in got, f"{body!r} was not dead-lettered"
        assert got[body][REASON_HEADER]  # says why
        assert got[body][QUEUE_HEADER] == exchange  # and where it was published
    # both still work: a good checkpoint after the poison is followed
    path = tmp_path / "v1"
    digest = FakeBackend().save(path)
    ready = CheckpointReady(version=1, uri=str(path), digest=digest, created_at=0.0)
    client.publish(names.checkpoints, "", encode(ready, run=spec.run)).result(5)
    wait_for(lambda: engine.version == 1, what="the sampler at v1")
    wait_for(lambda: controller.proxy().stats().get()["version"] == 1, what="controller at v1")
    assert controller.is_alive() and sampler.is_alive()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300])
def test_a_heartbeat_with_a_gauge_out_of_range_does_not_stop_the_controller(
    broker, spec, client, value
):
    """A well-formed heartbeat whose ``dropped_episodes`` gauge is no count (NaN, inf,
    past any int64) is dead-lettered with the reason; the controller goes on."""
    names = Topology(spec.run)
    controller, _, _ = _start_both(broker, spec)
    beat = Heartbeat("n", "learner", "l0", 0.0, {"dropped_episodes": value})
    body = encode(beat, run=spec.run)
    client.publish(names.control, "heartbeat.learner", body).result(5)
    dead = _drain_dead(client, names, 1)
    assert bytes(dead[0].body) == body
    assert "dropped_episodes" in dead[0].headers[REASON_HEADER]
    assert controller.is_alive()
    assert controller.proxy().stats().get()["dropped"] == 0
