"""The whole loop on the real RabbitMQ: two learner updates, queues visible to rabbitmqctl."""

import shutil
import subprocess
import uuid

import pytest

from agentrl.messages import Topology, connect
from tests.smoke_helpers import run_smoke

pytestmark = pytest.mark.integration


def test_two_learner_steps_on_rabbitmq(tmp_path, amqp_url):
    run = f"smoke-{uuid.uuid4().hex[:6]}"
    run_smoke(tmp_path, amqp_url, run)
    names = Topology(run)
    queues = [
        names.episodes,
        names.trajectories,
        names.dead,
        names.control_rpc,
        names.generate_queue("current"),
        names.generate_queue("stale"),
    ]
    transport = connect(amqp_url, name="smoke-check")
    try:
        if shutil.which("rabbitmqctl"):
            listed = subprocess.run(
                ["rabbitmqctl", "list_queues", "name", "--quiet"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert set(queues) <= set(listed), sorted(set(queues) - set(listed))
        else:  # another host's broker: ask it directly (raises for a missing queue)
            for queue in queues:
                transport.queue_depth(queue)
    finally:
        for queue in queues:
            transport.delete_queue(queue)
        for exchange in (names.generate, names.checkpoints, names.control, names.dlx):
            transport.delete_exchange(exchange)
        transport.close()
