"""Environment workers over the broker: sessions, capacity, a dead worker, the rollout's retry."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from agentrl.actors import TopologySpec, declare
from agentrl.environments import make_task
from agentrl.environments._protocol import InfraError, Status
from agentrl.environments._worker import EnvWorker, RemoteEnvironment
from agentrl.messages import ChatMessage, ToolCall, connect


def _say(name: str, **args) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c1", name, json.dumps(args))])


@pytest.fixture
def run():
    run = f"envw-{uuid.uuid4().hex[:6]}"
    client = connect(f"memory://{run}", name="client")
    declare(client, TopologySpec(run, ("current",), 8))
    yield run, client
    client.close()


def _worker(run, wid, capacity=1, **kw):
    return EnvWorker(
        make_task("db"), broker=f"memory://{run}", run=run, task="db", capacity=capacity,
        worker_id=wid, heartbeat_interval=0.2, **kw,
    )  # fmt: skip


def test_a_remote_session_plays_like_a_local_one(run):
    run, client = run
    worker = _worker(run, "w1")
    try:
        env = RemoteEnvironment(client, run, "db", timeout=5)
        start = env.start(0)  # "How many planets have more than 20 moons?"
        assert start.session[1] == "w1" and "planets" in start.messages[-1].content
        assert [t["function"]["name"] for t in env.tools] == ["execute_sql", "commit_final_answer"]
        step = env.interact(
            start.session, _say("execute_sql", query="SELECT COUNT(*) FROM planets WHERE moons>20")
        )
        assert (step.status, step.messages[0].content) == (Status.RUNNING, "[(3,)]")
        step = env.interact(start.session, _say("commit_final_answer", answers=["3"]))
        assert (step.status, step.reward, step.finish) == (Status.COMPLETED, 1.0, True)
        assert step.metrics["env/success"] == 1.0
        assert worker.sessions == 0  # the slot is free again
    finally:
        worker.close()


def test_capacity_sends_new_sessions_to_the_worker_with_a_free_slot(run):
    run, client = run
    workers = [_worker(run, "w1"), _worker(run, "w2")]
    try:
        env = RemoteEnvironment(client, run, "db", timeout=5)
        first, second = env.start(0), env.start(1)
        assert {first.session[1], second.session[1]} == {"w1", "w2"}
        assert [w.sessions for w in workers] == [1, 1]
        env.cancel(first.session)
        deadline = time.monotonic() + 5
        while workers[0].sessions + workers[1].sessions > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        third = env.start(2)
        assert third.session[1] == first.session[1]  # the only free slot
    finally:
        for w in workers:
            w.close()


def test_a_dead_worker_is_an_infra_error_and_the_next_start_goes_elsewhere(run):
    run, client = run
    doomed, spare = _worker(run, "doomed", capacity=1), None
    try:
        env = RemoteEnvironment(client, run, "db", timeout=2)
        start = env.start(0)
        assert start.session[1] == "doomed"
        doomed.close()  # its own queue disappears with its connection
        with pytest.raises(InfraError):
            env.interact(start.session, _say("execute_sql", sql="SELECT 1"))
        spare = _worker(run, "spare", capacity=2, orphan_timeout=0.3)
        # the dead worker's unacked start was redelivered to the spare; its client gave
        # up, so the orphan session expires quickly and frees the slot
        deadline = time.monotonic() + 5
        while spare.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spare.sessions == 0
        again = env.start(0)
        assert again.session[1] == "spare"
        step = env.interact(again.session, _say("commit_final_answer", answers=["3"]))
        assert step.reward == 1.0
    finally:
        if spare is not None:
            spare.close()


def test_a_session_the_worker_does_not_hold_is_an_infra_error(run):
    run, client = run
    worker = _worker(run, "w1")
    try:
        env = RemoteEnvironment(client, run, "db", timeout=5)
        with pytest.raises(InfraError, match="no longer holds session"):
            env.interact(("no-such-session", "w1"), _say("execute_sql", sql="SELECT 1"))
    finally:
        worker.close()


def test_no_worker_at_all_is_an_infra_error(run):
    run, client = run
    client.declare_queue(f"{run}.env.db")
    env = RemoteEnvironment(client, run, "db", timeout=0.5)
    with pytest.raises(InfraError, match="no environment worker answered"):
        env.start(0)


def test_workers_heartbeat_to_the_controller_exchange(run):
    run, client = run
    beats = []
    got = threading.Event()

    def on_beat(delivery):
        from agentrl.messages import decode

        beats.append(decode(delivery.body).payload)
        got.set()
        delivery.ack()

    client.bind(client.declare_queue("beats"), f"{run}.control", "heartbeat.env")
    client.consume("beats", on_beat, prefetch=16)
    worker = _worker(run, "w1")
    try:
        assert got.wait(5)
        assert (beats[0].role, beats[0].labels["task"], beats[0].state["capacity"]) == (
            "env",
            "db",
            1.0,
        )
    finally:
        worker.close()


def test_the_worker_command_serves_sessions_until_stopped(run):
    from agentrl.ops.cli import agentrl_env as cli_env

    run, client = run
    stop = threading.Event()
    result = {}
    argv = ["--task", "db", "--broker", f"memory://{run}", "--run", run, "--capacity", "2",
            "--worker-id", "cli", "--option", "max_turns=3"]  # fmt: skip
    thread = threading.Thread(
        target=lambda: result.setdefault("code", cli_env.worker_main(argv, stop))
    )
    thread.start()
    try:
        client.declare_queue(f"{run}.env.db")  # the start waits there for the worker
        env = RemoteEnvironment(client, run, "db", timeout=10)
        start = env.start(1)
        assert start.session[1] == "cli"
        step = env.interact(start.session, _say("commit_final_answer", answers=["Jupiter"]))
        assert step.reward == 1.0
    finally:
        stop.set()
        thread.join(10)
    assert result["code"] == 0
    assert cli_env.worker_main([*argv[:8], "--option", "oops"], threading.Event()) == 2


def test_the_worker_command_reads_the_broker_from_the_environment(run, monkeypatch, capsys):
    from agentrl.ops.cli import agentrl_env as cli_env

    run, client = run
    argv = ["--task", "db", "--run", run, "--worker-id", "env", "--option", "max_turns=3"]
    monkeypatch.delenv("AGENTRL_BROKER_URL", raising=False)
    assert cli_env.worker_main(argv, threading.Event()) == 2
    assert "give --broker or set $AGENTRL_BROKER_URL" in capsys.readouterr().err
    monkeypatch.setenv("AGENTRL_BROKER_URL", f"memory://{run}")
    stop = threading.Event()
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("code", cli_env.worker_main(argv, stop))
    )
    thread.start()
    try:
        client.declare_queue(f"{run}.env.db")
        env = RemoteEnvironment(client, run, "db", timeout=10)
        start = env.start(1)
        assert start.session[1] == "env"
        env.cancel(start.session)
    finally:
        stop.set()
        thread.join(10)
    assert result["code"] == 0


def test_poison_on_the_worker_queues_is_dead_lettered_with_one_log_line_each(run):
    """Issue 50: poison on the env queues was dead-lettered without a word in the log."""
    import structlog

    from agentrl.environments._remote import task_queue, worker_queue
    from agentrl.messages import Topology

    run, client = run
    with structlog.testing.capture_logs() as logs:
        worker = _worker(run, "w1")
        try:
            client.publish("", task_queue(run, "db"), b"\xc1 not a start").result(5)
            client.publish("", worker_queue(run, "w1"), b"\xc1 not a message").result(5)
            dead, got = [], threading.Event()

            def take(delivery):
                dead.append(bytes(delivery.body))
                delivery.ack()
                if len(dead) == 2:
                    got.set()

            client.consume(Topology(run).dead, take, prefetch=10)
            assert got.wait(10), dead
        finally:
            worker.close()
    said = [e for e in logs if e["event"] == "malformed message dead-lettered"]
    assert sorted(e["queue"] for e in said) == sorted(
        [task_queue(run, "db"), worker_queue(run, "w1")]
    )
    assert all("not valid msgpack" in e["reason"] for e in said)
