"""configure_logging: one JSON-lines file per role, run/node bound to every line."""

from __future__ import annotations

import json

import pytest
import structlog

from agentrl.ops import configure_logging


@pytest.fixture
def restore_structlog():
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    from transformers.utils import logging as hf_logging

    hf_logging.set_tqdm_hook(None)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_role_gets_its_own_file_with_run_and_node(tmp_path, capsys, restore_structlog):
    configure_logging("info", tmp_path, run="r1", node="n1")
    log = structlog.get_logger("test")
    log.bind(role="sampler", actor="s0", pool="current").info("loaded", version=3)
    log.bind(role="rollout", actor="r0").warning("infra failure", episode="e1", task="t")
    log.bind(role="rollout").debug("too detailed")  # below the configured level: nowhere
    log.info("supervisor line")
    sampler = _lines(tmp_path / "sampler.jsonl")
    assert [(e["event"], e["version"], e["pool"]) for e in sampler] == [("loaded", 3, "current")]
    assert sampler[0]["run"] == "r1" and sampler[0]["node"] == "n1"
    assert sampler[0]["level"] == "info" and "timestamp" in sampler[0]
    (rollout,) = _lines(tmp_path / "rollout.jsonl")
    assert (rollout["episode"], rollout["task"], rollout["level"]) == ("e1", "t", "warning")
    assert [e["event"] for e in _lines(tmp_path / "supervisor.jsonl")] == ["supervisor line"]
    err = capsys.readouterr().err
    assert "loaded" in err and "supervisor line" in err and "infra failure" in err
    assert "too detailed" not in err


def test_transformers_bars_stay_off_the_console_and_end_as_one_line_in_the_log(
    tmp_path, capfd, restore_structlog
):
    from transformers.utils import logging as hf_logging

    configure_logging("info", tmp_path, run="r1", node="n1")
    for _ in hf_logging.tqdm(range(20), desc="Loading weights"):  # as from_pretrained's
        pass
    with hf_logging.tqdm(total=2, desc="Writing model shards") as bar:
        bar.update(2)
    structlog.get_logger("test").info("file only", console=False)
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and "it/s" not in err
    assert "file only" not in err
    bars = [e for e in _lines(tmp_path / "supervisor.jsonl") if e["event"] == "progress bar"]
    assert [(e["desc"], e["n"], e["total"]) for e in bars] == [
        ("Loading weights", 20, 20),
        ("Writing model shards", 2, 2),
    ]
    assert all("console" not in e for e in _lines(tmp_path / "supervisor.jsonl"))
    assert "file only" in [e["event"] for e in _lines(tmp_path / "supervisor.jsonl")]


def test_the_environment_worker_imports_without_torch_transformers_or_tqdm():
    """The env-worker image installs agentrl without the model stack: logging set up there
    must not need tqdm (the image build runs ``agentrl-env-worker --help``)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'tqdm'):\n"
        "    sys.modules[name] = None  # importing any of them raises ImportError\n"
        "from agentrl.ops.cli.agentrl_env import worker_main\n"
        "from agentrl.ops.logs.configure import configure_logging\n"
        "configure_logging(level='info')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_actor_that_dies_says_why_on_one_console_line_and_in_full_in_the_file(
    tmp_path, capfd, restore_structlog
):
    """pykka says an actor's unhandled exception on the stdlib logger ``pykka``; it reaches
    the console as one line with the exception, and the file with its traceback."""
    import pykka

    class Broken(pykka.ThreadingActor):
        def on_start(self):
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs avx512bw\nmore")

    configure_logging("info", tmp_path, run="r1", node="n1")
    ref = Broken.start()
    ref.actor_stopped.wait(timeout=10)
    assert not ref.is_alive()
    err = capfd.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "actor failed" in ln]
    assert "RuntimeError: mkldnn_reorder_linear_weight: bf16 path needs avx512bw" in line
    assert "Broken" in line and "Traceback" not in err and "more" not in err
    failed = [e for e in _lines(tmp_path / "supervisor.jsonl") if "actor failed" in e["event"]]
    assert [e["event"] for e in failed] == ["actor failed", "actor failed: traceback"]
    assert "Traceback" in failed[1]["exception"] and "on_start" in failed[1]["exception"]
