"""`queue_stats` against the real RabbitMQ management API, checked with `rabbitmqctl`."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

import pytest

from agentrl.messages import Topology, connect
from agentrl.ops.report.status import ManagementUnavailable, QueueStat, client_for

pytestmark = pytest.mark.integration

STATS_REFRESH_TIMEOUT = 15.0  # the management API refreshes its statistics every ~5 s


def rabbitmqctl_queues() -> dict[str, tuple[int, int, int]]:
    """name -> (messages_ready, messages_unacknowledged, consumers) for every queue of `/`."""
    listed = subprocess.run(
        [
            "rabbitmqctl",
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "consumers",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    out = {}
    for line in listed.stdout.splitlines()[1:]:  # the first line is the column header
        name, ready, unacked, consumers = line.split("\t")
        out[name] = (int(ready), int(unacked), int(consumers))
    return out


def as_counts(stats: list[QueueStat]) -> dict[str, tuple[int, int, int]]:
    return {s.name: (s.depth, s.unacked, s.consumers) for s in stats}


def test_queue_stats_match_rabbitmqctl(amqp_url: str) -> None:
    client = client_for(amqp_url)
    try:
        client.overview()
    except ManagementUnavailable as exc:
        if os.environ.get("AGENTRL_REQUIRE_BROKER") == "1":
            pytest.fail(f"{exc} and AGENTRL_REQUIRE_BROKER=1")
        pytest.skip(str(exc))

    run = f"statustest{uuid.uuid4().hex[:8]}"
    topology = Topology(run)
    transport = connect(amqp_url, name=f"{run}-status-test")
    queues = [
        topology.dead,
        topology.episodes,
        topology.trajectories,
        topology.generate_queue("current"),
        topology.control_rpc,
    ]
    consumer = None
    try:
        topology.declare(transport, ["current"], 16)
        # an auto-named exclusive queue of the run, like a sampler's checkpoint queue
        queues.append(transport.declare_queue("", exclusive=True, dead_letter=False))
        sent = [transport.publish("", topology.episodes, b"e%d" % i) for i in range(7)]
        sent += [transport.publish("", topology.trajectories, b"t%d" % i) for i in range(3)]
        for future in sent:
            future.result(timeout=30)

        received = []
        two_held = threading.Event()

        def hold(delivery) -> None:  # never acked: 2 stay unacknowledged (prefetch 2)
            received.append(delivery)
            if len(received) == 2:
                two_held.set()

        consumer = transport.consume(topology.episodes, hold, prefetch=2)
        assert two_held.wait(30), "the consumer did not get its 2 deliveries"

        listed = rabbitmqctl_queues()
        expected = {name: counts for name, counts in listed.items() if name in queues}
        assert set(expected) == set(queues), f"rabbitmqctl lists {sorted(listed)}"
        assert expected[topology.episodes] == (5, 2, 1)
        assert expected[topology.trajectories] == (3, 0, 0)

        # poll until the management API's statistics caught up (or the timeout passed)
        tick = threading.Event()
        deadline = time.monotonic() + STATS_REFRESH_TIMEOUT
        got = as_counts(client.queue_stats(run))
        while got != expected and time.monotonic() < deadline:
            tick.wait(0.5)
            got = as_counts(client.queue_stats(run))
        assert got == expected
    finally:
        if consumer is not None:
            consumer.cancel()
        for name in queues:
            transport.delete_queue(name)
        for exchange in (topology.dlx, topology.generate, topology.checkpoints, topology.control):
            transport.delete_exchange(exchange)
        transport.close()
