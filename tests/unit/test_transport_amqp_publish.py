"""The AMQP publish pipeline against a fake channel and a fake ioloop (no broker).

Deterministic checks of what is hard to force on a real broker: the order of
held messages after nacks, the back-off schedule, replay after a lost channel.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pika
import pytest
from pika import spec

from agentrl.messages._amqp_publish import Outgoing, Publisher
from agentrl.messages._transport import BrokerUnavailable, Unroutable


class FakeChannel:
    def __init__(self) -> None:
        self.is_open = True
        self.sent: list[bytes] = []

    def basic_publish(self, exchange, routing_key, body, properties, mandatory):
        assert mandatory
        self.sent.append(body)


class FakeLoop:
    """call_later records timers; `fire()` runs the earliest one."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, object]] = []

    def call_later(self, delay, callback):
        handle = (delay, callback)
        self.timers.append(handle)
        return handle

    def remove_timeout(self, handle) -> None:
        self.timers.remove(handle)

    def fire(self) -> float:
        delay, callback = self.timers.pop(0)
        callback()
        return delay


def confirm(publisher: Publisher, tag: int, *, ack: bool = True, multiple: bool = False) -> None:
    method = spec.Basic.Ack if ack else spec.Basic.Nack
    publisher.on_confirm(SimpleNamespace(method=method(delivery_tag=tag, multiple=multiple)))


def outgoing(order: int, key: str = "q") -> Outgoing:
    properties = pika.BasicProperties(message_id=str(order))
    return Outgoing(order, "", key, f"m{order}".encode(), properties, Future())


@pytest.fixture
def wired():
    loop, channel = FakeLoop(), FakeChannel()
    publisher = Publisher(loop, lambda exchange, then: then(None), retry_max=0.2)
    publisher.channel_opened(channel)
    return publisher, loop, channel


def test_many_in_flight_and_multiple_ack(wired) -> None:
    publisher, _, channel = wired
    outs = [outgoing(i) for i in range(1, 6)]
    for out in outs:
        publisher.submit(out)
    assert publisher.in_flight == 5 and len(channel.sent) == 5  # nobody waited for a confirm
    confirm(publisher, 3, multiple=True)  # tags 1..3
    assert [o.future.done() for o in outs] == [True, True, True, False, False]
    confirm(publisher, 5, multiple=True)
    assert all(o.future.done() for o in outs) and publisher.in_flight == 0


def test_nack_holds_the_key_and_probes_with_backoff(wired) -> None:
    publisher, loop, channel = wired
    first, second, third = outgoing(1), outgoing(2), outgoing(3)
    other = outgoing(4, key="elsewhere")
    publisher.submit(first)
    confirm(publisher, 1, ack=False)  # queue full
    publisher.submit(second)  # same key: held behind `first`, not sent
    publisher.submit(other)  # other key: unaffected
    assert channel.sent == [b"m1", b"m4"]
    assert loop.fire() == 0.05  # probe `first` again (delivery tag 3)
    confirm(publisher, 3, ack=False)
    assert loop.fire() == 0.1  # back-off doubles
    confirm(publisher, 4, ack=False)
    assert loop.fire() == 0.2
    confirm(publisher, 5, ack=False)
    assert loop.fire() == 0.2  # capped at retry_max
    publisher.submit(third)
    confirm(publisher, 6)  # the probe got in: held messages follow in order
    assert first.future.done() and not second.future.done()
    assert channel.sent[-2:] == [b"m2", b"m3"]
    assert not loop.timers


def test_return_then_ack_fails_with_unroutable(wired) -> None:
    publisher, _, _ = wired
    out = outgoing(1)
    publisher.submit(out)
    publisher.on_return(
        None, SimpleNamespace(reply_code=312, reply_text="NO_ROUTE"), out.properties, b""
    )
    confirm(publisher, 1)
    with pytest.raises(Unroutable, match="NO_ROUTE"):
        out.future.result(0)


def test_lost_channel_replays_unconfirmed_in_order(wired) -> None:
    publisher, _, _ = wired
    outs = [outgoing(i) for i in range(1, 4)]
    for out in outs[:2]:
        publisher.submit(out)
    confirm(publisher, 1)
    publisher.channel_lost()
    publisher.submit(outs[2])  # while down: waits in the outbox
    fresh = FakeChannel()
    publisher.channel_opened(fresh)
    assert fresh.sent == [b"m2", b"m3"]  # m1 was confirmed; tags restart at 1
    confirm(publisher, 2, multiple=True)
    assert all(o.future.done() for o in outs)


def test_fail_all_and_unknown_exchange() -> None:
    checks: list[str] = []
    publisher = Publisher(FakeLoop(), lambda exchange, then: checks.append(exchange))
    publisher.channel_opened(FakeChannel())
    out = Outgoing(1, "ex", "k", b"x", pika.BasicProperties(message_id="1"), Future())
    publisher.submit(out)
    assert checks == ["ex"] and not out.future.done()  # waits for the passive check
    publisher.fail_all(BrokerUnavailable("gone"))
    with pytest.raises(BrokerUnavailable):
        out.future.result(0)
