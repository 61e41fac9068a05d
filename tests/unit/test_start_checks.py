"""A start checks what it can before it writes anything, and every error it meets is one
line (exit 2 for what a retry cannot fix) unless --debug asks for the traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from agentrl.ops.cli.agentrl_supervisor import main
from agentrl.ops.run.supervisor import Supervisor


def _config(tmp_path, **overrides):
    path = tmp_path / "run.yaml"
    raw = {
        "model": "tiny",
        "run": "checked",
        "broker": f"memory://checks-{uuid.uuid4().hex[:6]}",
        "output_dir": str(tmp_path / "runs"),
        "tasks": {"calculator": {}},
    }
    path.write_text(yaml.safe_dump({**raw, **overrides}))
    return path


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_missing_model_is_refused_before_the_run_directory_exists(tmp_path, capsys):
    config = _config(tmp_path, model=str(tmp_path / "no-such-model"))
    assert main(["start", "--config", str(config)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "no-such-model" in line and "does not exist" in line
    assert not (tmp_path / "runs").exists()  # the corrected config starts the run, no "exists"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


def test_an_unreachable_broker_is_one_line_and_exit_2_in_seconds(tmp_path, capsys):
    broker = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/"
    config = _config(tmp_path, broker=broker)
    start = time.monotonic()
    assert main(["start", "--config", str(config), "--log-level", "error"]) == 2
    assert time.monotonic() - start < 12  # the probe's 5 s, not two 15 s loops
    line = _one_line(capsys.readouterr().err)
    assert "no broker answered" in line and "RabbitMQ" in line
    assert not (tmp_path / "runs").exists()


def test_an_unexpected_error_is_one_line_unless_debug(tmp_path, capsys, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(Supervisor, "run", broken)
    monkeypatch.setattr(
        "agentrl.ops.cli.agentrl_supervisor.configure_logging", lambda *a, **k: None
    )
    config = _config(tmp_path)
    assert main(["start", "--config", str(config)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "RuntimeError: the engine broke" in line and "--debug" in line
    with pytest.raises(RuntimeError, match="the engine broke"):
        main(["start", "--config", str(config), "--debug"])


def test_a_hub_name_the_hub_does_not_confirm_is_one_line_and_exit_2_before_anything(
    tmp_path, capsys, monkeypatch
):
    """A name that is no directory, not in the Hugging Face cache, with the hub unreachable
    (offline here): one line naming the model, exit 2, no run directory, in seconds."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    config = _config(tmp_path, model="no-such-org/x")
    start = time.monotonic()
    assert main(["start", "--config", str(config), "--log-level", "error"]) == 2
    assert time.monotonic() - start < 20
    line = _one_line(capsys.readouterr().err)
    assert "'no-such-org/x'" in line and "Hugging Face cache" in line
    assert not (tmp_path / "runs").exists()  # the corrected config starts the run


@pytest.mark.parametrize("what", ["a directory", "binary"])
def test_a_config_that_is_no_yaml_file_is_said_without_a_traceback_and_exit_2(
    tmp_path, capsys, what
):
    if what == "a directory":
        path = tmp_path
    else:
        path = tmp_path / "run.yaml"
        path.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["start", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err  # a config error's list, as for YAML's
    assert ("a directory" if what == "a directory" else "not text (UTF-8)") in err


def test_a_broker_that_accepts_and_never_answers_is_one_line_and_exit_2(tmp_path):
    """Issue 50: the right line came after a 45-line traceback from pika's I/O thread."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # takes every connection and says nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        broker = f"amqp://guest:guest@127.0.0.1:{listener.getsockname()[1]}/"
        config = _config(tmp_path, broker=broker)
        start = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor", "start"]
        done = subprocess.run(  # a process of its own: pika's I/O thread writes to its stderr
            [*start, "--config", str(config), "--log-level", "error"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    line = _one_line(done.stderr)
    assert "no broker answered" in line
    assert not (tmp_path / "runs").exists()
