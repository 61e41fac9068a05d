"""The fault suite: a run on RabbitMQ, every role a process, loses nothing and trains
nothing twice when a role is SIGKILLed, when its node supervisor is, or when the broker
restarts. Each test runs the tiny model to ``max_steps`` and reads the ledger at the end:
every trained episode issued once and trained once, exactly ``max_steps`` updates, exit 0,
and every episode still open is waiting in a durable queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.actors._ledger import read_ledger
from agentrl.messages import Topology, connect
from tests.processes import alive
from tests.smoke_helpers import smoke_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 4
EPISODES_PER_BATCH = 4  # smoke_config: 2 groups of 2


def _start(
    tmp_path: Path, amqp_url: str, run: str, *extra: str, remote: bool = False
) -> subprocess.Popen:
    """The node, every role a process; ``remote``: the task served by env workers (the
    ``env`` role) over the broker."""
    config = tmp_path / f"{run}.yaml"
    raw = smoke_config(tmp_path, amqp_url, run, steps=STEPS)
    if remote:
        raw["tasks"]["calculator"].update(remote=True, workers=1, capacity=8)
    config.write_text(yaml.safe_dump(raw))
    argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
    argv += ["start", "--config", str(config)]
    argv += ["--node", "n1", "--progress-every", "5", *extra]
    log = (tmp_path / f"{run}.out").open("ab")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"waiting for {what}: the node exited {proc.returncode}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _versions(run_dir: Path) -> list[int]:
    found = (run_dir / "checkpoints").glob("v[0-9]*")
    return sorted(int(p.name[1:]) for p in found if (p / "DIGEST").exists())


def _role_pid(run_dir: Path, role: str) -> int | None:
    path = run_dir / "nodes" / "n1.json"
    if not path.exists():
        return None
    state = json.loads(path.read_text())["roles"].get(role, {})
    return state.get("pid") if state.get("alive") else None


def _check_ledger(amqp_url: str, run: str, run_dir: Path) -> dict:
    """The run's accounting once every process has exited; its counts."""
    ledger = read_ledger(run_dir)
    assert _versions(run_dir)[-1] == STEPS and ledger.last_version == STEPS
    assert not ledger.trained_twice, ledger.trained_twice
    assert not ledger.unissued, ledger.unissued
    assert len(ledger.trained) + len(ledger.dropped) >= STEPS * EPISODES_PER_BATCH
    # no over-issue: the window at the last version, (v + eta + 1) * B with eta = 1, plus
    # a replacement for every dropped episode
    assert len(ledger.issued) <= (STEPS + 2) * EPISODES_PER_BATCH + len(ledger.dropped)
    waiting = _waiting_episodes(amqp_url, run)
    # nothing lost: every open episode waits in a durable queue (a queue may also hold a
    # second copy of an episode whose rollout died between publishing and acking)
    assert set(ledger.open) <= waiting, sorted(set(ledger.open) - waiting)
    assert waiting <= set(ledger.issued), sorted(waiting - set(ledger.issued))
    return {**ledger.counts(), "waiting": len(waiting), "reasons": dict(ledger.drop_reasons())}


def _waiting_episodes(amqp_url: str, run: str) -> set[str]:
    """The episode ids in the run's episodes and trajectories queues (taken off them)."""
    from agentrl.messages import EpisodeRequest, Trajectory, decode

    names = Topology(run)
    transport = connect(amqp_url, name="fault-check")
    found: set[str] = set()
    try:
        for queue, kind in ((names.episodes, EpisodeRequest), (names.trajectories, Trajectory)):
            depth = transport.queue_depth(queue)
            got: list[str] = []
            done = threading.Event()

            def take(delivery, kind=kind, got=got, depth=depth, done=done) -> None:
                got.append(decode(delivery.body, expect=kind).payload.episode_id)
                delivery.ack()
                if len(got) >= depth:
                    done.set()

            if depth:
                consumer = transport.consume(queue, take, prefetch=100)
                assert done.wait(20), f"{len(got)} of {depth} from {queue}"
                consumer.cancel()
            found.update(got)
    finally:
        transport.close()
    return found


def _finish(proc: subprocess.Popen, tmp_path: Path, run: str) -> None:
    try:
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / f"{run}.out").read_text(errors="replace")
    assert code == 0, out[-4000:]


@pytest.mark.parametrize("role", ["learner", "controller", "rollout", "sampler", "env"])
def test_a_killed_role_loses_nothing_and_trains_nothing_twice(tmp_path, amqp_url, role):
    run = f"fault-{role}-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / run
    proc = _start(tmp_path, amqp_url, run, remote=role == "env")
    try:
        _wait(lambda: _versions(run_dir)[-1:] >= [1], 240, "the first update", proc)
        victim = _role_pid(run_dir, role)
        assert victim is not None, f"no live {role} role"
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: _role_pid(run_dir, role) not in (None, victim), 60, f"{role} restarted", proc)
        _finish(proc, tmp_path, run)
    finally:
        if proc.poll() is None:
            proc.kill()
    counts = _check_ledger(amqp_url, run, run_dir)
    print(f"ledger after SIGKILL of the {role}: {counts}")


@pytest.mark.parametrize("whole", [False, True], ids=["supervisor", "every-process"])
def test_a_killed_node_then_a_resume_loses_nothing(tmp_path, amqp_url, whole):
    """SIGKILL of the node supervisor (its roles drain and exit: parent-death signal), or
    of the node's every process at once (a machine lost); the same command with
    --resume finishes the run."""
    run = f"fault-node-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / run
    proc = _start(tmp_path, amqp_url, run)
    try:
        _wait(lambda: _versions(run_dir)[-1:] >= [1], 240, "the first update", proc)
        roles = json.loads((run_dir / "nodes" / "n1.json").read_text())["roles"]
        pids = [r["pid"] for r in roles.values() if r.get("alive")]
        proc.send_signal(signal.SIGKILL)
        if whole:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        _wait(lambda: not any(alive(p) for p in pids), 120, "the orphaned roles to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
    again = _start(tmp_path, amqp_url, run, "--resume")
    _finish(again, tmp_path, run)
    counts = _check_ledger(amqp_url, run, run_dir)
    print(f"ledger after SIGKILL of the node and a resume: {counts}")


def test_a_broker_restart_loses_nothing(tmp_path, amqp_url):
    if "127.0.0.1" not in amqp_url:
        pytest.skip("restarts the broker at 127.0.0.1 with rabbitmqctl")
    run = f"fault-broker-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / run
    proc = _start(tmp_path, amqp_url, run)
    try:
        _wait(lambda: _versions(run_dir)[-1:] >= [1], 240, "the first update", proc)
        names = Topology(run)
        transport = connect(amqp_url, name="fault-peek")
        try:  # episodes wait in the queue while the broker goes down
            _wait(lambda: transport.queue_depth(names.episodes) > 0, 60, "waiting episodes")
        finally:
            transport.close()
        subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True)
        try:
            time.sleep(2)
        finally:
            subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True)
            subprocess.run(["rabbitmqctl", "await_startup"], check=True, capture_output=True)
        _finish(proc, tmp_path, run)
    finally:
        if proc.poll() is None:
            proc.kill()
    counts = _check_ledger(amqp_url, run, run_dir)
    print(f"ledger after a broker restart: {counts}")


def _poison(run: str) -> dict[str, list[tuple[str, bytes]]]:
    """Per queue, (what, body) of each kind of poison: garbage bytes, a map that is no
    envelope, an old schema version, a valid schema with a bad field value."""

    import msgpack

    from agentrl.messages import EpisodeRequest, encode
    from tests.unit.records import trajectory

    def old_schema(body: bytes) -> bytes:
        wire = msgpack.unpackb(body, raw=False)
        wire["envelope"]["schema"] = 1
        return msgpack.packb(wire, use_bin_type=True)

    request = EpisodeRequest("p-0", "calculator", 0, "p", 0, 2, 0)
    good_traj = encode(trajectory([0, 1, 1], group="q", episode_id="q-0"), run=run)
    bad_mask = msgpack.unpackb(good_traj, raw=False)
    bad_mask["payload"]["loss_mask"] = bytes([0, 2, 1])  # 0/1 only
    names = Topology(run)
    return {
        names.episodes: [
            ("garbage", b"\xc1 not msgpack"),
            ("wrong map", msgpack.packb({"hello": "world"})),
            ("old schema", old_schema(encode(request, run=run))),
            (
                "bad index",
                encode(EpisodeRequest("p-1", "calculator", 10**9, "p", 1, 2, 0), run=run),
            ),
        ],
        names.trajectories: [
            ("garbage", b"\x00\xff\xfe"),
            ("wrong map", msgpack.packb([1, 2, 3])),
            ("old schema", old_schema(good_traj)),
            ("bad mask", msgpack.packb(bad_mask, use_bin_type=True)),
        ],
    }


def test_poison_messages_are_dead_lettered_with_a_reason_and_the_run_goes_on(tmp_path, amqp_url):
    from agentrl.messages._transport import QUEUE_HEADER, REASON_HEADER

    run = f"fault-poison-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / run
    proc = _start(tmp_path, amqp_url, run)
    transport = connect(amqp_url, name="poisoner")
    try:
        try:  # mid-run (a fresh run would clear messages left before its start)
            _wait(lambda: _versions(run_dir)[-1:] >= [1], 240, "the first update", proc)
            poison = _poison(run)
            for queue, bodies in poison.items():
                for _, body in bodies:
                    transport.publish("", queue, body).result(10)
            names = Topology(run)
            broadcasts = {  # every consumer of a broadcast dead-letters its own copy
                (names.checkpoints, ""): b"\xc1 garbage on the checkpoints exchange",
                (names.control, "heartbeat.sampler"): b"\xc1 garbage as a heartbeat",
                (names.control, "metrics.learner"): b"\xc1 garbage as metrics",
            }
            for (exchange, key), body in broadcasts.items():
                transport.publish(exchange, key, body).result(10)
            _finish(proc, tmp_path, run)
        finally:
            if proc.poll() is None:
                proc.kill()
        dead: list = []
        got = threading.Event()
        wanted = {body for bodies in poison.values() for _, body in bodies}
        wanted |= set(broadcasts.values())

        def take(delivery) -> None:
            dead.append(delivery)
            delivery.ack()
            if wanted <= {bytes(d.body) for d in dead}:
                got.set()

        transport.consume(Topology(run).dead, take, prefetch=20)
        assert got.wait(20), [d.headers for d in dead]
    finally:
        transport.close()
    reasons = {bytes(d.body): str(d.headers[REASON_HEADER]) for d in dead}
    expected = {  # each reason names what was wrong
        "garbage": "not valid msgpack",
        "wrong map": "message body: expected",
        "old schema": "schema version 1 not supported",
        "bad index": "episode_request.index: 1000000000 not in [0, ",
        "bad mask": "trajectory.loss_mask[1]: expected 0 or 1, got 2",
    }
    for bodies in poison.values():
        for what, body in bodies:
            assert body in reasons, f"{what} was not dead-lettered"
            assert expected[what] in reasons[body], (what, reasons[body])
            print(f"{what}: {reasons[body]}")
    for (exchange, _), body in broadcasts.items():
        copies = [d for d in dead if bytes(d.body) == body]
        assert copies, f"{body!r} was not dead-lettered"
        assert {str(d.headers[QUEUE_HEADER]) for d in copies} == {exchange}
        assert all("not valid msgpack" in str(d.headers[REASON_HEADER]) for d in copies)
        print(f"{exchange}: {len(copies)} consumers dead-lettered it")
    counts = _check_ledger(amqp_url, run, run_dir)  # the run finished, nothing lost
    print(f"ledger after 8 poison messages: {counts}")
