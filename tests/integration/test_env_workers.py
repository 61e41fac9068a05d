"""Environment workers as processes on RabbitMQ: SIGKILL one mid-episode, nothing is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from agentrl.actors import TopologySpec, declare
from agentrl.environments._protocol import InfraError
from agentrl.environments._worker import RemoteEnvironment
from agentrl.messages import ChatMessage, ToolCall, connect

pytestmark = pytest.mark.integration


def _say(name: str, **args) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c1", name, json.dumps(args))])


def _worker(amqp_url: str, run: str, wid: str, capacity: int = 1) -> subprocess.Popen:
    argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_env", "worker", "--task", "db",
            "--broker", amqp_url, "--run", run, "--capacity", str(capacity),
            "--worker-id", wid]  # fmt: skip
    return subprocess.Popen(argv, start_new_session=True)


def test_a_killed_worker_becomes_an_infra_error_and_another_worker_takes_over(amqp_url):
    run = f"envk-{uuid.uuid4().hex[:6]}"
    client = connect(amqp_url, name=f"{run}-client")
    declare(client, TopologySpec(run, ("current",), 8))
    client.declare_queue(f"{run}.env.db")
    procs = []
    try:
        procs.append(_worker(amqp_url, run, "first"))
        env = RemoteEnvironment(client, run, "db", timeout=60)
        start = env.start(0)
        assert start.session[1] == "first"
        step = env.interact(
            start.session, _say("execute_sql", query="SELECT COUNT(*) FROM planets")
        )
        assert step.messages[0].content == "[(8,)]"
        os.killpg(procs[0].pid, signal.SIGKILL)  # mid-episode
        procs[0].wait(10)
        env_fast = RemoteEnvironment(client, run, "db", timeout=10)
        began = time.monotonic()
        with pytest.raises(InfraError):
            env_fast.interact(start.session, _say("commit_final_answer", answers=["3"]))
        assert time.monotonic() - began < 15
        # a second worker; the first one's unacked start is redelivered to it (an orphan
        # session, expired after 30 s), so it gets a slot for the retried episode too
        procs.append(_worker(amqp_url, run, "second", capacity=2))
        again = env.start(0)
        assert again.session[1] == "second"
        step = env.interact(again.session, _say("commit_final_answer", answers=["3"]))
        assert step.reward == 1.0
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
        for queue in (f"{run}.env.db",):
            client.delete_queue(queue)
        client.close()
