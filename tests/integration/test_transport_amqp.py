"""The Transport conformance suite on the real RabbitMQ, plus reconnect behaviour."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from agentrl.messages._amqp import AmqpTransport
from agentrl.messages._connect import connect
from agentrl.messages._transport import BrokerUnavailable
from tests.integration.conftest import BROKER_HOST, BROKER_PORT
from tests.unit.transport_suite import *  # noqa: F403  (the shared conformance tests)
from tests.unit.transport_suite import PENDING, WAIT, Bus, Inbox, settle_all

pytestmark = pytest.mark.integration


@pytest.fixture
def transport_factory(amqp_url: str):
    made = []

    def make(name: str = "t"):
        transport = connect(amqp_url, name=f"agentrl-test-{name}")
        made.append(transport)
        return transport

    yield make
    for transport in made:
        transport.close()


def close_connection_on_server(connection_name: str) -> None:
    """Have RabbitMQ itself close the named client connection (CONNECTION_FORCED)."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "-s", "pid", "client_properties"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    marker = f'{{"connection_name","{connection_name}"}}'
    pids = [line.split("\t")[0] for line in listed.stdout.splitlines() if marker in line]
    assert len(pids) == 1, f"expected one connection named {connection_name!r}, found {pids}"
    subprocess.run(
        ["rabbitmqctl", "close_connection", pids[0], "agentrl reconnect test"],
        capture_output=True,
        check=True,
        timeout=60,
    )


class Proxy:
    """A TCP forwarder to the broker that the test can cut and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut the open ones."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):  # already closed by the other pump
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # listener closed by stop()
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):  # either side cut: the connection is over
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_reconnects_after_the_server_closes_the_connection(
    bus: Bus, transport_factory, run: str
) -> None:
    name = f"reconnect-{run}"
    transport = transport_factory(name)
    queue = bus.queue("survivor", transport=transport)
    fanout = bus.exchange("fan", "fanout")
    private = transport.declare_queue("", exclusive=True)
    transport.bind(private, fanout)
    settle_all([bus.admin.publish("", queue, f"m{i}".encode()) for i in range(2)])
    inbox = Inbox()
    transport.consume(queue, inbox, prefetch=5)
    before = inbox.take(2)

    close_connection_on_server(f"agentrl-test-{name}")

    after = inbox.take(4)[2:]  # the consumer is back and gets both again
    assert sorted(d.body for d in after) == [b"m0", b"m1"]
    assert all(d.redelivered for d in after)
    before[0].ack()  # a delivery of the lost connection: a logged no-op
    for delivery in after:
        delivery.ack()
    transport.publish(fanout, "", b"after").result(WAIT)
    assert transport.queue_depth(private) == 1  # same name, re-declared and re-bound
    transport.publish("", queue, b"m2").result(WAIT)
    assert inbox.take(5)[4].body == b"m2"


def test_publish_during_an_outage_is_sent_after_reconnect(bus: Bus) -> None:
    queue = bus.queue("outage")
    proxy = Proxy((BROKER_HOST, BROKER_PORT))
    transport = AmqpTransport(
        f"amqp://guest:guest@127.0.0.1:{proxy.port}/", name="agentrl-test-outage"
    )
    try:
        transport.publish("", queue, b"before").result(WAIT)
        proxy.stop()
        during = transport.publish("", queue, b"during")
        with pytest.raises(FutureTimeout):
            during.result(timeout=PENDING)
        proxy.start()
        during.result(WAIT)
        assert bus.admin.queue_depth(queue) == 2
    finally:
        transport.close()
        proxy.stop()


def test_gives_up_when_the_broker_stays_away(bus: Bus) -> None:
    queue = bus.queue("gone")
    proxy = Proxy((BROKER_HOST, BROKER_PORT))
    transport = AmqpTransport(
        f"amqp://guest:guest@127.0.0.1:{proxy.port}/",
        name="agentrl-test-give-up",
        reconnect_timeout=0.5,
    )
    try:
        transport.publish("", queue, b"before").result(WAIT)
        proxy.stop()
        with pytest.raises(BrokerUnavailable):
            transport.publish("", queue, b"lost").result(WAIT)
        with pytest.raises(BrokerUnavailable):
            transport.queue_depth(queue)  # fails fast once given up
    finally:
        transport.close()
    assert bus.admin.queue_depth(queue) == 1


def test_connect_failures_raise_broker_unavailable(amqp_url: str) -> None:
    with pytest.raises(BrokerUnavailable, match="refused login") as refused:
        AmqpTransport(amqp_url.replace("guest:guest", "guest:not-the-password"), name="bad")
    assert "not-the-password" not in str(refused.value)
    with closed_port() as port, pytest.raises(BrokerUnavailable, match=r"within 0\.3s"):
        AmqpTransport(f"amqp://u:p@127.0.0.1:{port}/", name="nowhere", connect_timeout=0.3)


@contextlib.contextmanager
def closed_port():
    """A local port nothing listens on (bound but not listening, so it stays free)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]
