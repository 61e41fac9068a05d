"""Stopping a run through the control exchange: `stop_run`, and the learner's own at max_steps."""

from __future__ import annotations

import threading
import time
import uuid

import pykka

from agentrl.actors import TopologySpec, declare
from agentrl.messages import BrokerRefused, connect
from agentrl.ops import Supervisor, parse_config
from agentrl.ops.run.queues import stop_run
from tests.smoke_helpers import smoke_config


def test_stop_run_drains_a_running_supervisor(tmp_path):
    run = f"stop-{uuid.uuid4().hex[:6]}"
    broker = f"memory://{run}"
    cfg = parse_config(smoke_config(tmp_path, broker, run, steps=1000))
    supervisor = Supervisor(cfg, node="n1")
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("code", supervisor.run(install_signals=False))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 60
        heard = False
        while not heard and time.monotonic() < deadline:
            try:
                heard = stop_run(broker, run, "test asked")
            except BrokerRefused:  # the topology is not declared yet
                time.sleep(0.2)
        assert heard
        thread.join(60)
        assert not thread.is_alive() and result["code"] == 0
    finally:
        supervisor.done.set()
        thread.join(60)


def test_stop_run_says_when_no_node_listens():
    run = f"stop-{uuid.uuid4().hex[:6]}"
    broker = f"memory://{run}"
    transport = connect(broker, name="setup")
    try:
        declare(transport, TopologySpec(run, ("current",), 8))
        assert stop_run(broker, run, "nobody") is False
    finally:
        transport.close()


class _Busy(pykka.ThreadingActor):
    """Stands in for an actor in the middle of a long message (the learner's update)."""

    def busy(self, seconds: float) -> None:
        time.sleep(seconds)


def test_stop_waits_for_the_learner_mid_update_and_logs_an_actor_that_hangs(tmp_path, monkeypatch):
    run = f"stop-{uuid.uuid4().hex[:6]}"
    supervisor = Supervisor(parse_config(smoke_config(tmp_path, f"memory://{run}", run)))
    monkeypatch.setattr("agentrl.ops.run.supervisor.STOP_TIMEOUT", 0.2)
    monkeypatch.setattr("agentrl.ops.run.supervisor.LEARNER_STOP_TIMEOUT", 30.0)
    learner, rollout = _Busy.start(), _Busy.start()
    learner.proxy().busy(1.0)  # an update under way: the stop waits for it
    rollout.proxy().busy(2.0)  # longer than its 0.2 s: logged, not raised
    supervisor._refs = [("learner", learner), ("rollout-0", rollout)]
    supervisor.stop()  # no pykka.Timeout escapes
    assert not learner.is_alive()
    assert supervisor.stop_failed
    rollout.stop()


def test_a_stop_that_waits_says_so_on_the_console(tmp_path, monkeypatch, capsys):
    run = f"stop-{uuid.uuid4().hex[:6]}"
    supervisor = Supervisor(parse_config(smoke_config(tmp_path, f"memory://{run}", run)))
    monkeypatch.setattr("agentrl.ops.run.interrupt.STILL_WAITING", 0.3)
    learner = _Busy.start()
    learner.proxy().busy(1.0)  # an update under way: ~3 lines while the stop waits for it
    supervisor._refs = [("learner", learner)]
    supervisor.stop()
    assert not learner.is_alive()
    lines = [x for x in capsys.readouterr().err.splitlines() if "still waiting" in x]
    assert 2 <= len(lines) <= 4, lines
    assert lines[0].startswith("agentrl-supervisor: stopping: still waiting for the learner (")
    assert "Ctrl-C again to abort" in lines[0]
    assert not supervisor.stop_failed
