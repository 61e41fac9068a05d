"""Transport conformance suite: the same tests for every Transport implementation.

A test module runs it with `from tests.unit.transport_suite import *` and a
`transport_factory` fixture: `make(name) -> Transport`, closing what it made
on teardown. Nothing here sleeps to wait; waits are on futures and conditions
with timeouts (a wait that *should* time out proves something stays pending).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait

import pytest
import structlog

from agentrl.messages._transport import (
    QUEUE_HEADER,
    REASON_HEADER,
    Delivery,
    Topology,
    Transport,
    TransportClosed,
    TransportError,
    Unroutable,
)

log = structlog.get_logger(__name__)

WAIT = 10.0
"""Upper bound for anything that should happen (a failing test waits this long)."""
PENDING = 0.4
"""How long something that must *not* happen is given to happen anyway."""


class Inbox:
    """A consumer callback that records deliveries; optionally acks each one."""

    def __init__(self, *, ack: bool = False, on: Callable[[Delivery], None] | None = None) -> None:
        self.items: list[Delivery] = []
        self._ack = ack
        self._on = on
        self._cond = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        if self._on is not None:
            self._on(delivery)
        if self._ack:
            delivery.ack()
        with self._cond:
            self.items.append(delivery)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = WAIT) -> bool:
        """True once `count` deliveries arrived, False after `timeout`."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.items) >= count, timeout)

    def take(self, count: int) -> list[Delivery]:
        assert self.wait_for(count), f"expected {count} deliveries, got {len(self.items)}"
        return self.items[:count]

    @property
    def bodies(self) -> list[bytes]:
        with self._cond:
            return [d.body for d in self.items]


class Bus:
    """Per-test names under a unique run prefix, an admin transport, and cleanup."""

    def __init__(self, factory: Callable[[str], Transport], run: str) -> None:
        self.factory = factory
        self.topology = Topology(run)
        self.admin = factory("admin")
        self._queues: list[str] = []
        self._exchanges: list[str] = []

    def queue(self, suffix: str, transport: Transport | None = None, **options: object) -> str:
        name = (transport or self.admin).declare_queue(f"{self.topology.run}.{suffix}", **options)
        self._queues.append(name)
        return name

    def exchange(self, suffix: str, kind: str) -> str:
        name = f"{self.topology.run}.{suffix}"
        self.admin.declare_exchange(name, kind)
        self._exchanges.append(name)
        return name

    def dead_letters(self) -> str:
        """Declare `<run>.dlx` + `<run>.dead`; return the dead queue."""
        self.admin.declare_exchange(self.topology.dlx, "fanout")
        self._exchanges.append(self.topology.dlx)
        dead = self.queue("dead", dead_letter=False)
        self.admin.bind(dead, self.topology.dlx)
        return dead

    def cleanup(self) -> None:
        for queue in self._queues:
            self.admin.delete_queue(queue)
        for exchange in self._exchanges:
            self.admin.delete_exchange(exchange)


@pytest.fixture
def run() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def bus(transport_factory: Callable[[str], Transport], run: str):
    bus = Bus(transport_factory, run)
    yield bus
    bus.cleanup()


def settle_all(futures: list) -> None:
    done, pending = wait(futures, timeout=WAIT)
    assert not pending, f"{len(pending)} publishes not confirmed within {WAIT}s"
    for future in done:
        future.result()


def test_publish_consume_ack(bus: Bus) -> None:
    queue = bus.queue("work")
    consumer_side = bus.factory("consumer")
    settle_all([bus.admin.publish("", queue, f"m{i}".encode(), headers={"i": i}) for i in range(3)])
    inbox = Inbox(ack=True)
    consumer_side.consume(queue, inbox, prefetch=10)
    deliveries = inbox.take(3)
    assert [d.body for d in deliveries] == [b"m0", b"m1", b"m2"]
    assert [d.headers["i"] for d in deliveries] == [0, 1, 2]
    first = deliveries[0]
    assert (first.queue, first.exchange, first.routing_key) == (queue, "", queue)
    assert not first.redelivered and first.settled
    with pytest.raises(TransportError):
        first.ack()  # settled twice
    consumer_side.close()  # acked messages are not requeued on close
    assert bus.admin.queue_depth(queue) == 0


def test_many_publishes_in_flight(bus: Bus) -> None:
    queue = bus.queue("many")
    count = 2000
    started = time.perf_counter()
    futures = [bus.admin.publish("", queue, b"x" * 100) for _ in range(count)]
    settle_all(futures)
    elapsed = time.perf_counter() - started
    log.info(
        "confirmed publishes", count=count, seconds=round(elapsed, 3), rate=int(count / elapsed)
    )
    assert bus.admin.queue_depth(queue) == count


def test_bounded_queue_holds_publisher_until_room(bus: Bus) -> None:
    queue = bus.queue("bounded", max_length=3)
    settle_all([bus.admin.publish("", queue, f"m{i}".encode()) for i in range(3)])
    held = bus.admin.publish("", queue, b"m3")
    with pytest.raises(FutureTimeout):
        held.result(timeout=PENDING)  # full: neither confirmed nor dropped
    assert bus.admin.queue_depth(queue) == 3
    inbox = Inbox(ack=True)
    bus.factory("consumer").consume(queue, inbox, prefetch=1)
    held.result(timeout=WAIT)  # a delivery made room (only ready messages count)
    assert inbox.wait_for(4)
    assert inbox.bodies == [b"m0", b"m1", b"m2", b"m3"]


def test_prefetch_limits_unacked_deliveries(bus: Bus) -> None:
    queue = bus.queue("prefetch")
    settle_all([bus.admin.publish("", queue, f"m{i}".encode()) for i in range(6)])
    inbox = Inbox()
    bus.factory("consumer").consume(queue, inbox, prefetch=2)
    assert inbox.wait_for(2)
    assert not inbox.wait_for(3, timeout=PENDING)
    assert bus.admin.queue_depth(queue) == 4
    inbox.items[0].ack()
    assert inbox.wait_for(3)
    assert not inbox.wait_for(4, timeout=PENDING)
    assert bus.admin.queue_depth(queue) == 3


def test_round_robin_between_consumers(bus: Bus) -> None:
    queue = bus.queue("rr")
    first, second = Inbox(ack=True), Inbox(ack=True)
    bus.factory("c1").consume(queue, first, prefetch=10)
    bus.factory("c2").consume(queue, second, prefetch=10)
    settle_all([bus.admin.publish("", queue, f"m{i}".encode()) for i in range(4)])
    assert first.wait_for(2) and second.wait_for(2)
    assert sorted(first.bodies + second.bodies) == [b"m0", b"m1", b"m2", b"m3"]


def test_nack_requeue_marks_redelivered(bus: Bus) -> None:
    queue = bus.queue("nack")
    seen: list[Delivery] = []

    def nack_first(delivery: Delivery) -> None:
        seen.append(delivery)
        if len(seen) == 1:
            delivery.nack(requeue=True)
        else:
            delivery.ack()

    inbox = Inbox(on=nack_first)
    bus.factory("consumer").consume(queue, inbox, prefetch=1)
    bus.admin.publish("", queue, b"again").result(WAIT)
    first, second = inbox.take(2)
    assert (first.body, first.redelivered) == (b"again", False)
    assert (second.body, second.redelivered) == (b"again", True)


def test_closing_transport_redelivers_unacked(bus: Bus) -> None:
    queue = bus.queue("handover")
    settle_all([bus.admin.publish("", queue, f"m{i}".encode()) for i in range(3)])
    doomed, heir = bus.factory("doomed"), bus.factory("heir")
    lost = Inbox()
    doomed.consume(queue, lost, prefetch=5)
    assert lost.wait_for(3)
    found = Inbox(ack=True)
    heir.consume(queue, found, prefetch=5)
    assert not found.wait_for(1, timeout=PENDING)  # all three are unacked at `doomed`
    doomed.close()
    redelivered = found.take(3)
    assert sorted(d.body for d in redelivered) == [b"m0", b"m1", b"m2"]
    assert all(d.redelivered for d in redelivered)
    lost.items[0].ack()  # settling a delivery of a closed transport is a no-op


def test_cancel_stops_deliveries(bus: Bus) -> None:
    queue = bus.queue("cancel")
    inbox = Inbox(ack=True)
    consumer = bus.factory("consumer").consume(queue, inbox, prefetch=1)
    assert consumer.queue == queue
    consumer.cancel()
    consumer.cancel()  # idempotent
    bus.admin.publish("", queue, b"after").result(WAIT)
    assert not inbox.wait_for(1, timeout=PENDING)
    assert bus.admin.queue_depth(queue) == 1


def test_fanout_reaches_every_bound_queue(bus: Bus) -> None:
    exchange = bus.exchange("fan", "fanout")
    queues = [bus.queue("fan-a"), bus.queue("fan-b")]
    for queue in queues:
        bus.admin.bind(queue, exchange)
    bus.admin.publish(exchange, "ignored", b"all").result(WAIT)
    assert [bus.admin.queue_depth(q) for q in queues] == [1, 1]


def test_topic_routing(bus: Bus) -> None:
    exchange = bus.exchange("topic", "topic")
    one_word = bus.queue("t1")
    tail = bus.queue("t2")
    prefix = bus.queue("t3")
    bus.admin.bind(one_word, exchange, "control.*")
    bus.admin.bind(tail, exchange, "#.heartbeat")
    bus.admin.bind(prefix, exchange, "a.#")
    keys = ["control.pause", "node1.heartbeat", "a", "a.b.c", "control.x.heartbeat"]
    settle_all([bus.admin.publish(exchange, key, key.encode()) for key in keys])
    # control.* takes control.pause only; #.heartbeat takes node1.heartbeat and
    # control.x.heartbeat; a.# takes a (# = zero words) and a.b.c.
    assert [bus.admin.queue_depth(q) for q in (one_word, tail, prefix)] == [1, 2, 2]
    with pytest.raises(Unroutable):
        bus.admin.publish(exchange, "nobody.listens", b"x").result(WAIT)


def test_topology_declare_is_idempotent(bus: Bus) -> None:
    topology = bus.topology
    for _ in range(2):
        topology.declare(bus.admin, pools=["a", "b"], trajectory_capacity=2)
    bus._queues += [
        topology.dead,
        topology.episodes,
        topology.trajectories,
        topology.control_rpc,
        topology.generate_queue("a"),
        topology.generate_queue("b"),
    ]
    bus._exchanges += [topology.dlx, topology.generate, topology.checkpoints, topology.control]
    bus.admin.publish(topology.generate, "b", b"gen").result(WAIT)
    bus.admin.publish("", topology.episodes, b"ep").result(WAIT)
    depths = [bus.admin.queue_depth(topology.generate_queue(p)) for p in ("a", "b")]
    assert depths == [0, 1]
    assert bus.admin.queue_depth(topology.episodes) == 1
    settle_all([bus.admin.publish("", topology.trajectories, b"t") for _ in range(2)])
    with pytest.raises(FutureTimeout):
        bus.admin.publish("", topology.trajectories, b"t").result(timeout=PENDING)


def test_redeclare_with_other_arguments_fails(bus: Bus) -> None:
    queue = bus.queue("args", max_length=3)
    with pytest.raises(TransportError):
        bus.admin.declare_queue(queue, max_length=4)
    exchange = bus.exchange("kind", "direct")
    with pytest.raises(TransportError):
        bus.admin.declare_exchange(exchange, "fanout")
    assert bus.queue("still-usable") == f"{bus.topology.run}.still-usable"
    bus.admin.publish("", queue, b"ok").result(WAIT)


def test_named_queues_are_durable_and_a_transient_redeclaration_fails(bus: Bus) -> None:
    """Shared queues are durable by default (their messages survive a broker restart), so
    declaring one transient is refused; a queue declared transient stays transient."""
    queue = bus.queue("durable")
    with pytest.raises(TransportError):
        bus.admin.declare_queue(queue, durable=False)
    assert bus.admin.declare_queue(queue, durable=True) == queue
    transient = bus.queue("transient", durable=False)
    with pytest.raises(TransportError):
        bus.admin.declare_queue(transient)
    bus.admin.publish("", queue, b"ok").result(WAIT)
    assert bus.admin.queue_depth(queue) == 1


def test_unroutable_publish_fails(bus: Bus) -> None:
    direct = bus.exchange("direct", "direct")
    with pytest.raises(Unroutable):
        bus.admin.publish("", f"{bus.topology.run}.missing", b"x").result(WAIT)
    with pytest.raises(Unroutable):
        bus.admin.publish(direct, "unbound", b"x").result(WAIT)
    with pytest.raises(Unroutable):
        bus.admin.publish(f"{bus.topology.run}.no-exchange", "k", b"x").result(WAIT)
    queue = bus.queue("fine")
    bus.admin.publish("", queue, b"still works").result(WAIT)


def test_rpc_concurrent_calls_get_their_own_replies(bus: Bus) -> None:
    queue = bus.queue("rpc")
    server = bus.factory("server")

    def answer(request: Delivery) -> None:
        server.reply(request, b"re:" + request.body)
        request.ack()

    server.consume(queue, answer, prefetch=4)
    client = bus.factory("client")
    calls = {i: client.call("", queue, f"q{i}".encode(), timeout=WAIT) for i in range(20)}
    replies = {i: call.result(WAIT) for i, call in calls.items()}
    assert {i: r.body for i, r in replies.items()} == {i: f"re:q{i}".encode() for i in range(20)}
    assert len({r.correlation_id for r in replies.values()}) == 20


def test_rpc_timeout(bus: Bus) -> None:
    queue = bus.queue("rpc-silent")
    call = bus.factory("client").call("", queue, b"anyone?", timeout=0.2)
    with pytest.raises(TimeoutError):
        call.result(WAIT)


def test_rpc_to_missing_queue_is_unroutable(bus: Bus) -> None:
    call = bus.admin.call("", f"{bus.topology.run}.nobody", b"?", timeout=WAIT)
    with pytest.raises(Unroutable):
        call.result(WAIT)


def test_dead_letter_keeps_body_headers_and_reason(bus: Bus) -> None:
    dead = bus.dead_letters()
    queue = bus.queue("poison")
    inbox = Inbox(on=lambda d: d.dead_letter("cannot decode"))
    bus.factory("consumer").consume(queue, inbox, prefetch=1)
    bus.admin.publish("", queue, b"\x00bad", headers={"k": "v"}).result(WAIT)
    graveyard = Inbox(ack=True)
    bus.admin.consume(dead, graveyard, prefetch=1)
    (corpse,) = graveyard.take(1)
    assert corpse.body == b"\x00bad"
    assert corpse.headers["k"] == "v"
    assert corpse.headers[REASON_HEADER] == "cannot decode"
    assert corpse.headers[QUEUE_HEADER] == queue


def test_nack_without_requeue_dead_letters(bus: Bus) -> None:
    dead = bus.dead_letters()
    queue = bus.queue("rejects")
    bus.factory("consumer").consume(queue, Inbox(on=lambda d: d.nack(requeue=False)), prefetch=1)
    bus.admin.publish("", queue, b"no").result(WAIT)
    graveyard = Inbox(ack=True)
    bus.admin.consume(dead, graveyard, prefetch=1)
    (corpse,) = graveyard.take(1)
    assert corpse.body == b"no"
    assert corpse.headers["x-first-death-reason"] == "rejected"
    assert corpse.headers["x-first-death-queue"] == queue


def test_failing_callback_dead_letters_the_message(bus: Bus) -> None:
    dead = bus.dead_letters()
    queue = bus.queue("crash")

    def crash(delivery: Delivery) -> None:
        raise ValueError("boom")

    bus.factory("consumer").consume(queue, crash, prefetch=1)
    bus.admin.publish("", queue, b"trigger").result(WAIT)
    graveyard = Inbox(ack=True)
    bus.admin.consume(dead, graveyard, prefetch=1)
    (corpse,) = graveyard.take(1)
    assert corpse.body == b"trigger"
    assert "ValueError: boom" in corpse.headers[REASON_HEADER]


def test_queue_depth_and_missing_queue(bus: Bus) -> None:
    queue = bus.queue("depth")
    assert bus.admin.queue_depth(queue) == 0
    settle_all([bus.admin.publish("", queue, b"d") for _ in range(5)])
    assert bus.admin.queue_depth(queue) == 5
    with pytest.raises(TransportError):
        bus.admin.queue_depth(f"{bus.topology.run}.missing")
    assert bus.admin.queue_depth(queue) == 5  # the transport survived the error


def test_exclusive_generated_queue_is_deleted_on_close(bus: Bus) -> None:
    owner = bus.factory("owner")
    name = owner.declare_queue("", exclusive=True)
    assert name and owner.queue_depth(name) == 0
    with pytest.raises(TransportError):
        bus.admin.queue_depth(name)  # RESOURCE_LOCKED: exclusive to `owner`
    owner.close()
    with pytest.raises(TransportError):
        bus.admin.queue_depth(name)


def test_blocking_call_from_callback_thread_is_refused(bus: Bus) -> None:
    queue = bus.queue("reentrant")
    consumer_side = bus.factory("consumer")
    errors: list[BaseException] = []

    def reenter(delivery: Delivery) -> None:
        try:
            consumer_side.queue_depth(queue)
        except TransportError as error:
            errors.append(error)
        delivery.ack()

    inbox = Inbox(on=reenter)
    consumer_side.consume(queue, inbox, prefetch=1)
    bus.admin.publish("", queue, b"x").result(WAIT)
    assert inbox.wait_for(1)
    assert len(errors) == 1


def test_closed_transport_refuses_work(bus: Bus) -> None:
    transport = bus.factory("short-lived")
    transport.close()
    transport.close()  # idempotent
    with pytest.raises(TransportClosed):
        transport.publish("", "anything", b"x")
    with pytest.raises(TransportClosed):
        transport.declare_queue(f"{bus.topology.run}.late")


__all__ = ["Bus", "Inbox", "bus", "run", *[n for n in dir() if n.startswith("test_")]]
