"""The run directory's lock: one live learner per run on every broker (memory:// too), a
refusal that names the live process, released by a process that dies however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.ops.run.run_lock import LOCK_FILE, RunLocked, hold_run_lock

PY = sys.executable


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    first = hold_run_lock(tmp_path / "run", "r")
    try:
        with pytest.raises(RunLocked) as refused:
            hold_run_lock(tmp_path / "run", "r")
        message = str(refused.value)
        assert f"pid {os.getpid()}" in message and "is live" in message and "since" in message
    finally:
        first.close()
    hold_run_lock(tmp_path / "run", "r").close()  # released by close


def test_a_killed_holder_releases_the_lock(tmp_path):
    script = (
        "import sys, time; from pathlib import Path; "
        "from agentrl.ops.run.run_lock import hold_run_lock; "
        "hold_run_lock(Path(sys.argv[1]), 'r'); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([PY, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"pid {holder.pid} "):
            hold_run_lock(tmp_path, "r")
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs
        holder.wait()
    hold_run_lock(tmp_path, "r").close()


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the run ended early ({proc.returncode})"
        assert time.monotonic() < deadline, f"no {path} after {seconds}s"
        time.sleep(0.2)


def _wait_stopped(pid: int, seconds: float = 30.0) -> None:
    """Until every thread of ``pid`` is stopped: SIGSTOP is delivered asynchronously, and a
    thread inside a write finishes it first (a checkpoint file seen at 4 MiB of 12.6)."""
    deadline = time.monotonic() + seconds
    tasks = Path(f"/proc/{pid}/task")
    while True:
        states = []
        for task in tasks.iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended since the listing
                continue
        if all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"pid {pid} not stopped after {seconds}s: {states}"
        time.sleep(0.05)


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_resume_while_the_run_is_live_is_refused_and_leaves_it_alone(tmp_path):
    """Issue 29: on memory://, ``--resume`` beside a live run started a second learner that
    deleted the live run's learner state. Now it is refused, naming the live process."""
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": "tiny",
                "run": "live",
                "broker": f"memory://live-{uuid.uuid4().hex[:6]}",
                "output_dir": str(tmp_path / "runs"),
                "tasks": {"calculator": {}},
                "rollout": {"group_size": 2, "groups_per_batch": 2, "max_new_tokens": 8},
            }
        )
    )
    start = [PY, "-m", "agentrl.ops.cli.agentrl_supervisor", "start", "--config", str(config)]
    run_dir = tmp_path / "runs" / "live"
    live = subprocess.Popen(
        [*start, "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait_for(run_dir / "learner_state" / "v000002", live, 240)
        live.send_signal(signal.SIGSTOP)  # frozen: whatever changes now, the second start did
        _wait_stopped(live.pid)
        before = _files(run_dir)
        lock_before = (run_dir / LOCK_FILE).read_text()
        second = subprocess.run([*start, "--resume"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr  # one line, no traceback
        assert f"pid {live.pid} " in lines[0] and "is live" in lines[0]
        assert _files(run_dir) == before  # learner_state/v000002 included
        assert (run_dir / LOCK_FILE).read_text() == lock_before
        live.send_signal(signal.SIGCONT)
        assert live.poll() is None  # the live run goes on
    finally:
        live.send_signal(signal.SIGCONT)
        live.send_signal(signal.SIGINT)
        _, err = live.communicate(timeout=300)
    assert live.returncode == 0, err[-2000:]
    assert b"SIGINT: stopping; waiting for the learner" in err
    assert (run_dir / LOCK_FILE).exists()
