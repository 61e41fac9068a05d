"""A broker that refuses the login (wrong password, missing vhost) stops a start in
seconds, with one line and exit code 2: no role is started, nothing retries."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

LOCAL = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (("guest:guest", "guest:not-the-password"), "ACCESS_REFUSED"),
        (("5672/", "5672/no-such-vhost"), "vhost no-such-vhost not found"),
    ],
    ids=["password", "vhost"],
)
@pytest.mark.parametrize("in_process", [False, True], ids=["node", "in-process"])
def test_a_refused_login_fails_the_start_at_once(tmp_path, amqp_url, change, reason, in_process):
    url = amqp_url if amqp_url.endswith("/") else amqp_url + "/"
    broker = url.replace(*change)
    argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
    argv += ["start", "--config", str(LOCAL)]
    argv += ["--model", "tiny", "--broker", broker, "--run", "refused"]
    argv += ["--output-dir", str(tmp_path), "--max-steps", "1"]
    argv += ["--in-process"] if in_process else []
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert done.returncode == 2, done.stderr[-2000:]
    assert seconds < 30
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("agentrl-supervisor: broker at ") and reason in lines[-1]
    assert "refused login" in lines[-1] and "not-the-password" not in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "role started" not in done.stdout + done.stderr  # the node started no role


def test_the_learner_lock_holds_across_processes_and_dies_with_its_holder(amqp_url):
    import signal
    import uuid

    from agentrl.ops.run.run_lock import RunLocked, take_learner_lock

    run = f"lock-{uuid.uuid4().hex[:6]}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from agentrl.ops.run.run_lock import take_learner_lock; "
            f"lock = take_learner_lock({amqp_url!r}, {run!r}, 'a'); print('held', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in holder.stdout:  # its log lines come first
            if line.strip() == "held":
                break
        with pytest.raises(RunLocked, match=f"run '{run}' already has a learner"):
            take_learner_lock(amqp_url, run, "b")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 30  # the broker drops the queue with the dead connection
    while True:
        try:
            take_learner_lock(amqp_url, run, "b").close()
            break
        except RunLocked:
            assert time.monotonic() < deadline, "the lock outlived its holder"
            time.sleep(0.5)


def _leftover(amqp_url: str, run: str) -> None:
    """An earlier same-named run's episode, still in its queue."""
    from agentrl.actors import TopologySpec, declare
    from agentrl.messages import Topology, connect

    transport = connect(amqp_url, name="leftover")
    try:
        declare(transport, TopologySpec(run=run, pools=("current",), trajectory_capacity=64))
        transport.publish("", Topology(run).episodes, b"an earlier run's episode").result(5)
        assert transport.queue_depth(Topology(run).episodes) == 1
    finally:
        transport.close()


def _depth(amqp_url: str, queue: str) -> int | None:
    from agentrl.messages import BrokerRefused, connect

    transport = connect(amqp_url, name="depth")
    try:
        return transport.queue_depth(queue)
    except BrokerRefused:
        return None
    finally:
        transport.close()


def test_a_second_learner_node_is_refused_and_changes_nothing(tmp_path, amqp_url):
    import uuid

    from agentrl.messages import Topology
    from agentrl.ops.run.run_lock import take_learner_lock

    run = f"second-{uuid.uuid4().hex[:6]}"
    _leftover(amqp_url, run)
    lock = take_learner_lock(amqp_url, run, "first")  # the run's learner, elsewhere
    try:
        argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
        argv += ["start", "--config", str(LOCAL)]
        argv += ["--model", "tiny", "--broker", amqp_url, "--run", run]
        argv += ["--output-dir", str(tmp_path), "--max-steps", "1"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        lock.close()
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"run '{run}' already has a learner" in done.stderr
    assert "role started" not in done.stdout + done.stderr
    assert _depth(amqp_url, Topology(run).episodes) == 1  # the running run's queue untouched


def test_a_fresh_run_clears_an_earlier_same_named_runs_queues(tmp_path, amqp_url):
    import uuid

    from agentrl.messages import Topology
    from agentrl.ops.run.queues import clear_leftovers

    run = f"fresh-{uuid.uuid4().hex[:6]}"
    _leftover(amqp_url, run)
    clear_leftovers(amqp_url, run)
    assert _depth(amqp_url, Topology(run).episodes) is None
    clear_leftovers(amqp_url, run)  # nothing left: a no-op
