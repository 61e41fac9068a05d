"""A broker restart (``rabbitmqctl stop_app`` / ``start_app``) loses nothing of a run: its
queues are durable and every message persistent, so what waited in the episodes and
trajectories queues, and what a consumer held unacked, is there after the restart."""

from __future__ import annotations

import shutil
import subprocess
import threading
import uuid

import pytest

from agentrl.actors import TopologySpec, declare
from agentrl.messages import Topology, connect

pytestmark = pytest.mark.integration


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


@pytest.fixture
def restart_broker(amqp_url):
    if shutil.which("rabbitmqctl") is None or "127.0.0.1" not in amqp_url:
        pytest.skip("needs rabbitmqctl for the broker at 127.0.0.1")

    def restart() -> None:
        try:
            _rabbitmqctl("stop_app")
        finally:  # the broker is back whatever happened
            _rabbitmqctl("start_app")
            _rabbitmqctl("await_startup")

    yield restart


def test_waiting_and_unacked_messages_survive_a_broker_restart(amqp_url, restart_broker):
    run = f"restart-{uuid.uuid4().hex[:6]}"
    names = Topology(run)
    transport = connect(amqp_url, name="restart-test")
    try:
        declare(transport, TopologySpec(run=run, pools=("current",), trajectory_capacity=64))
        for i in range(20):
            transport.publish("", names.episodes, f"episode {i}".encode()).result(10)
        for i in range(5):
            transport.publish("", names.trajectories, f"trajectory {i}".encode()).result(10)
        held = threading.Event()
        got: list[bytes] = []

        def hold(delivery) -> None:  # a learner mid-update: never acks before the restart
            got.append(delivery.body)
            if len(got) == 5:
                held.set()

        consumer = transport.consume(names.trajectories, hold, prefetch=5)
        assert held.wait(10)
        # cancelled, so the reconnect does not subscribe it again; its 5 deliveries stay
        # unacked on the channel until the restart closes it
        consumer.cancel()
        restart_broker()
        # the transport reconnects and redeclares; the queues kept every message
        assert transport.queue_depth(names.episodes) == 20
        assert transport.queue_depth(names.trajectories) == 5  # the unacked ones, back
        bodies: list[bytes] = []
        done = threading.Event()

        def take(delivery) -> None:
            bodies.append(delivery.body)
            delivery.ack()
            if len(bodies) == 20:
                done.set()

        transport.consume(names.episodes, take, prefetch=50)
        assert done.wait(20)
        assert sorted(bodies) == sorted(f"episode {i}".encode() for i in range(20))
    finally:
        for queue in (names.episodes, names.trajectories, names.dead, names.control_rpc):
            transport.delete_queue(queue)
        transport.close()
