"""The network-namespace harness: nodes in their own namespaces reach RabbitMQ via the relay."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.netns import (
    LINK_RE,
    NS_RE,
    STATE_DIR,
    NetnsCluster,
    Relay,
    _netns_problem,
    namespaces,
    require_netns,
    state_lock,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 10.0

# A node: one AMQP connection and an exclusive queue; each stdin line is published to the
# queue and consumed back, and answered on stdout as "got <line>".
NODE = r"""
import sys
import pika

connection = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
channel = connection.channel()
queue = channel.queue_declare("", exclusive=True).method.queue
print("ready", flush=True)
for line in sys.stdin:
    channel.basic_publish("", queue, line.strip().encode())
    method, _, body = next(channel.consume(queue, inactivity_timeout=5))
    if method is None:
        sys.exit("no message came back within 5 s")
    channel.basic_ack(method.delivery_tag)
    channel.cancel()
    print("got", body.decode(), flush=True)
"""

PROBE = r"""
import socket
import sys

for host in sys.argv[1:]:
    try:
        socket.create_connection((host, 5672), timeout=2).close()
        print(host, "connected")
    except OSError as exc:
        print(host, type(exc).__name__)
"""


class Node:
    """A NODE process in a namespace, driven line by line."""

    def __init__(self, cluster: NetnsCluster, ns: str) -> None:
        self.cluster = cluster
        self.proc = cluster.popen(
            ns,
            [sys.executable, "-c", NODE, cluster.broker_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.read() == "ready"

    def read(self) -> str:
        """The next stdout line, failing with the node's stderr if none comes within WAIT."""
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        line = self.proc.stdout.readline() if readable else ""
        if not line:
            err = self.cluster.log_paths(self.proc)[1].read_text()
            raise AssertionError(f"node said nothing (exit {self.proc.poll()}); stderr:\n{err}")
        return line.strip()

    def round_trip(self, text: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.read()


def wait_until(predicate: Any, what: str, timeout: float = WAIT) -> None:
    """Poll `predicate` (set by another thread or process) until true; no fixed sleeps."""
    step, waited = 0.01, 0.0
    while not predicate():
        if waited > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(step)
        waited += step


def leftovers(k: int) -> tuple[set[str], set[str]]:
    """Namespaces and links of generation `k` that exist now (read independently of netns.py)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    all_namespaces = {line.split()[0] for line in names.stdout.splitlines()}
    interfaces = {line.split(": ")[1].split("@")[0] for line in links.stdout.splitlines()}
    return (
        {ns for ns in all_namespaces if (m := NS_RE.match(ns)) and m["k"] == str(k)},
        {i for i in interfaces if (m := LINK_RE.match(i)) and str(k) in (m["bridge"], m["veth"])},
    )


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def veths(k: int, n: int) -> set[str]:
    return {f"agentrl{k}v{i}" for i in range(n)}


@pytest.fixture
def cluster(amqp_url: str, tmp_path: Path) -> Iterator[NetnsCluster]:
    with namespaces(3, log_dir=tmp_path) as made:
        k = made.generation
        assert leftovers(k) == (set(made.namespaces), {"agentrl-br" + str(k)} | veths(k, 3))
        yield made
    assert leftovers(k) == (set(), set())


def test_each_namespace_round_trips_through_the_relay(cluster: NetnsCluster) -> None:
    nodes = [Node(cluster, ns) for ns in cluster.namespaces]
    for i, node in enumerate(nodes):
        assert node.round_trip(f"hello-{i}") == f"got hello-{i}"
    assert cluster.relay.accepted == 3
    assert cluster.broker_url == f"amqp://guest:guest@{cluster.bridge_address}:5672/"
    assert len({cluster.address(ns) for ns in cluster.namespaces}) == 3


def test_a_namespace_cannot_reach_the_root_loopback(cluster: NetnsCluster) -> None:
    ns = cluster.namespaces[0]
    probe = cluster.popen(
        ns,
        [sys.executable, "-c", PROBE, "127.0.0.1", cluster.bridge_address],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = probe.communicate(timeout=WAIT)
    assert out.splitlines() == [
        "127.0.0.1 ConnectionRefusedError",  # its own loopback: nothing listens there
        f"{cluster.bridge_address} connected",  # the relay
    ]


def test_a_sigkilled_node_leaves_the_relay_working(cluster: NetnsCluster) -> None:
    doomed, *others = [Node(cluster, ns) for ns in cluster.namespaces]
    assert cluster.relay.active == 3
    os.killpg(doomed.proc.pid, signal.SIGKILL)
    assert doomed.proc.wait(timeout=WAIT) == -signal.SIGKILL
    wait_until(lambda: cluster.relay.active == 2, "the relay to drop the killed connection")
    for i, node in enumerate(others):  # connections opened before the kill still work
        assert node.round_trip(f"after-{i}") == f"got after-{i}"
    again = Node(cluster, cluster.namespaces[0])  # and so does a new one from the same namespace
    assert again.round_trip("again") == "got again"
    assert cluster.relay.active == 3


def test_teardown_runs_when_the_body_fails(amqp_url: str) -> None:
    require_netns()
    with pytest.raises(ZeroDivisionError), NetnsCluster(2) as made:
        k, relay = made.generation, made.relay
        sleeper = made.popen(made.namespaces[0], ["sleep", "60"])
        1 / 0  # noqa: B018
    assert sleeper.returncode == -signal.SIGKILL
    assert leftovers(k) == (set(), set())
    assert not (STATE_DIR / str(k)).exists()
    assert not relay.running


def test_a_crashed_runs_leftovers_are_removed(amqp_url: str, tmp_path: Path) -> None:
    require_netns()
    crash = (
        "import pathlib, sys\n"
        "from tests.integration.netns import NetnsCluster\n"
        "cluster = NetnsCluster(2, log_dir=pathlib.Path(sys.argv[1])).__enter__()\n"
        "sleeper = cluster.popen(cluster.namespaces[1], ['sleep', '60'])\n"
        "print(cluster.generation, sleeper.pid, flush=True)\n"
        "sys.stdin.read()\n"  # until killed
    )
    child = subprocess.Popen(
        [sys.executable, "-c", crash, str(tmp_path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        k, sleeper = map(int, child.stdout.readline().split())
        with state_lock():  # no harness starting elsewhere cleans up while we look
            child.kill()
            assert child.wait(timeout=WAIT) == -signal.SIGKILL
            crashed_namespaces, links = leftovers(k)
            assert len(crashed_namespaces) == 2 and links == {f"agentrl-br{k}"} | veths(k, 2)
            assert (STATE_DIR / str(k)).read_text().split()[0] == str(child.pid)
            assert running(sleeper)  # an orphan left running in its namespace
    finally:
        child.kill()
        child.wait()
    with NetnsCluster(1) as made, state_lock():  # it cleaned up on its way in
        namespaces_now, links_now = leftovers(k)
        assert not namespaces_now & crashed_namespaces
        assert not running(sleeper)
        owner = STATE_DIR / str(k)
        if made.generation == k:  # generation k was free again and we took it
            assert links_now == {f"agentrl-br{k}"} | veths(k, 1)
        elif not owner.exists():  # nobody holds generation k, nothing of it is left
            assert links_now == set()
        else:  # a harness starting elsewhere took it
            assert owner.read_text().split()[0] != str(child.pid)


def test_the_relay_carries_many_concurrent_connections_and_resets() -> None:
    echo = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = echo.accept()
            except OSError:  # closed at the end of the test
                return
            threading.Thread(target=pump, args=(conn,), daemon=True).start()

    def pump(conn: socket.socket) -> None:
        with conn, contextlib.suppress(ConnectionResetError):  # the reset clients
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    relay = Relay(("127.0.0.1", 0), echo.getsockname())
    relay.start()
    try:
        clients = [socket.create_connection(relay.address, timeout=WAIT) for _ in range(200)]
        for i, client in enumerate(clients):
            client.sendall(f"{i:04d}".encode() * 1000)
        for i, client in enumerate(clients):
            got = b""
            while len(got) < 4000:
                got += client.recv(65536)
            assert got == f"{i:04d}".encode() * 1000
        for client in clients[::2]:  # half of them vanish abruptly (RST)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        for client in clients[1::2]:
            client.close()
        wait_until(lambda: relay.active == 0, "the relay to drop every connection")
        late = socket.create_connection(relay.address, timeout=WAIT)
        late.sendall(b"late")
        assert late.recv(4) == b"late"
        late.close()
        assert relay.accepted == 201 and relay.errors == []
    finally:
        relay.stop()
        stop.set()
        echo.close()


@pytest.mark.parametrize(
    ("required", "outcome"), [("1", pytest.fail.Exception), ("0", pytest.skip.Exception)]
)
def test_require_netns_fails_only_when_required(
    monkeypatch: pytest.MonkeyPatch, required: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("AGENTRL_REQUIRE_BROKER", required)
    _netns_problem.cache_clear()
    try:
        with pytest.raises(outcome, match=r"need root \(euid 1000\)"):
            require_netns()
    finally:
        _netns_problem.cache_clear()
