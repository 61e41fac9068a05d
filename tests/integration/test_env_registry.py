"""The env worker registry on RabbitMQ: SIGKILL a worker mid-interact, nothing is lost or stuck.

Controller, sampler (scripted), rollout and learner (fake backend) run in this
process; the env workers are processes. The doomed worker stalls inside
``interact``, so its two episodes wait on calls that will never be answered
(the rollout's env timeout is 120 s): only the registry's verdict (dead after
10 heartbeats of 0.5 s) ends them, as infra failures retried on the spare.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import pykka
import pytest

from agentrl.actors import (
    ControllerActor,
    EpisodeLimits,
    LearnerActor,
    RolloutActor,
    SamplerActor,
    TaskEntry,
    TopologySpec,
)
from agentrl.actors._env_registry import RegistryTimes
from agentrl.actors._fakes import FakeBackend, ScriptedEngine
from agentrl.environments import ChatFormat, make_task
from agentrl.messages import CheckpointReady, Topology, connect
from tests.unit.scripts import calculator_script

pytestmark = pytest.mark.integration

INTERVAL = 0.5

WORKER = """
import sys, threading, time
from agentrl.environments import make_task
from agentrl.environments._worker import EnvWorker
broker, run, wid, capacity, stall = sys.argv[1:6]
env = make_task("calculator")
if stall == "1":
    real = env.interact
    def interact(session, message):
        print("STALLED", flush=True)
        time.sleep(3600)
        return real(session, message)
    env.interact = interact
EnvWorker(env, broker=broker, run=run, task="calculator", capacity=int(capacity),
          worker_id=wid, heartbeat_interval=float(sys.argv[6]))
print("READY", flush=True)
threading.Event().wait()
"""


def _worker(amqp_url, run, wid, capacity, *, stall=False) -> subprocess.Popen:
    argv = [sys.executable, "-c", WORKER, amqp_url, run, wid, str(capacity),
            "1" if stall else "0", str(INTERVAL)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    proc.lines = queue.Queue()  # its stdout, line by line (log lines and our markers)
    threading.Thread(
        target=lambda: [proc.lines.put(x.strip()) for x in proc.stdout], daemon=True
    ).start()
    _expect(proc, "READY", 30)
    return proc


def _expect(proc: subprocess.Popen, marker: str, timeout: float) -> None:
    """Wait until the worker process prints ``marker`` on a line of its own."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if proc.lines.get(timeout=max(0.0, deadline - time.monotonic())) == marker:
                return
        except queue.Empty:
            raise AssertionError(f"worker did not print {marker} within {timeout} s") from None


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        threading.Event().wait(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def tokenizer():
    from agentrl.trainer._models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("tiny"))


def test_a_killed_worker_is_declared_dead_and_its_episodes_finish_elsewhere(
    amqp_url, tokenizer, tmp_path
):
    run = f"envreg-{uuid.uuid4().hex[:6]}"
    spec = TopologySpec(run, ("current",), 64)
    client = connect(amqp_url, name=f"{run}-client")
    Topology(run).declare(client, ["current"], 64)
    client.declare_queue(f"{run}.env.calculator")
    procs = [_worker(amqp_url, run, "doomed", 2, stall=True)]
    try:
        fmt = ChatFormat(tokenizer)
        engine = ScriptedEngine(calculator_script(tokenizer, fmt.end_of_turn_ids[-1], "oracle"))
        SamplerActor.start(
            broker=amqp_url, topology=spec, pool="current", every=1,
            engine_factory=lambda: engine, sampler_id="s0",
        )  # fmt: skip
        rollout = RolloutActor.start(
            broker=amqp_url, topology=spec, environments={}, remote_tasks=["calculator"],
            chat_format=fmt, pool_weights={"current": 1.0},
            limits=EpisodeLimits(max_turns=4, max_tokens=2048, max_new_tokens=64),
            concurrency=8, rollout_id="r0", heartbeat_interval=INTERVAL, env_timeout=120,
        ).proxy()  # fmt: skip
        backend, done, metrics = FakeBackend(), threading.Event(), []
        LearnerActor.start(
            broker=amqp_url, topology=spec, backend_factory=lambda: backend,
            checkpoint_dir=tmp_path / "ckpt", start_version=0, group_size=2,
            groups_per_batch=2, hard_staleness=8, prefetch=64, pad_id=0, max_steps=1,
            on_metrics=metrics.append, done=done,
        )  # fmt: skip
        ctl = ControllerActor.start(
            broker=amqp_url, topology=spec,
            tasks={"calculator": TaskEntry(1.0, make_task("calculator").num_instances)},
            group_size=2, episodes_per_batch=4, max_staleness=0,
            initial=CheckpointReady(version=0, uri="/none", digest="", created_at=0.0),
            env_times=RegistryTimes.for_interval(INTERVAL), reconcile_interval=INTERVAL,
        ).proxy()  # fmt: skip
        # the doomed worker takes two sessions and stalls in both interacts
        _expect(procs[0], "STALLED", 30)
        _expect(procs[0], "STALLED", 30)
        _wait(
            lambda: ctl.env_workers().get().get("doomed", {}).get("sessions") == 2
            and ctl.status().get().get("env_sessions/claimed", 0) >= 2,
            10, "the registry to list the doomed worker's sessions",
        )  # fmt: skip
        procs.append(_worker(amqp_url, run, "spare", 8))
        killed = time.monotonic()
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(10)
        assert done.wait(60), "the learner never got its two groups"
        elapsed = time.monotonic() - killed
        assert elapsed < 60  # far below the 120 s env timeout the stalled calls had
        view = ctl.env_workers().get()
        assert view["doomed"]["state"] == "dead"
        assert view["spare"]["state"] == "alive"
        status = ctl.status().get()
        assert status["env_workers/dead"] == 1.0 and status["env_sessions/lost"] >= 2
        stats = rollout.stats().get()
        assert stats["sessions_lost"] == 2 and stats["infra_retries"] >= 2
        # no episode lost, no group stuck: both groups trained whole, none dropped
        assert backend.batches[0].num_rows == 4
        assert metrics[0].get("learner/dropped_groups_total", 0.0) == 0.0
        print(f"killed worker's episodes finished {elapsed:.1f} s after the kill")
    finally:
        pykka.ActorRegistry.stop_all()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
        for queue in (f"{run}.env.calculator",):
            client.delete_queue(queue)
        client.close()
