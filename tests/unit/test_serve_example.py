"""examples/openai_agent.py (the openai package only) trains a run through its endpoint."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.ops import Supervisor, parse_config

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_agent_imports_nothing_of_agentrl():
    tree = ast.parse((EXAMPLES / "openai_agent.py").read_text())
    modules = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0] for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }  # fmt: skip
    assert "openai" in modules and "agentrl" not in modules


def test_the_example_agent_trains_the_run_for_two_updates(tmp_path):
    raw = yaml.safe_load((EXAMPLES / "serve.yaml").read_text())
    raw.update(
        run="served-example",
        broker=f"memory://served-{uuid.uuid4().hex[:6]}",
        model="tiny",
        output_dir=str(tmp_path),
        max_steps=2,
    )
    raw["rollout"].update(group_size=2, groups_per_batch=2, max_new_tokens=16)
    raw["serve"] = {"port": 0, "episode_timeout": 60}
    cfg = parse_config(raw)
    supervisor = Supervisor(cfg, ("sampler", "learner", "serve"))
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(supervisor.run(progress_every=3600, install_signals=False))
    )
    thread.start()
    deadline = time.monotonic() + 120
    while supervisor.server is None:
        assert thread.is_alive() and time.monotonic() < deadline, "the endpoint did not start"
        time.sleep(0.05)
    agent = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "openai_agent.py"), "--base-url", supervisor.server.url,
         "--api-key", supervisor.server.api_key,
         "--episodes", "200", "--concurrency", "4", "--max-turns", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        thread.join(240)
        assert not thread.is_alive() and codes == [0]
    finally:
        agent.kill()
        out = agent.communicate()[0]
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["version"] for m in metrics] == [1.0, 2.0], out[-2000:]
    assert all(m["rollout/episodes"] >= 2 for m in metrics)
    assert "episodes, last 8: mean reward" in out


def test_agentrl_serve_starts_the_endpoint_and_stops_on_sigterm(tmp_path):
    import re
    import signal

    import openai

    config = tmp_path / "serve.yaml"
    raw = yaml.safe_load((EXAMPLES / "serve.yaml").read_text())
    raw.update(model="tiny", output_dir=str(tmp_path), broker="memory://serve-cli")
    config.write_text(yaml.safe_dump(raw))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.ops.cli.agentrl", "serve", "--config", str(config),
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = None
        for line in proc.stdout:
            found = re.search(r"url=(http://\S+/v1)", line)
            if found:
                url = found.group(1)
                break
        assert url, "no 'endpoint serving' line"
        # no key configured: one was generated, kept in the run directory for the owner only
        key_file = tmp_path / raw["run"] / "serve" / "api_key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        anyone = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anyone.models.list()
        key = key_file.read_text().strip()
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        episode = client.post("/episodes", body={"task": "calculator"}, cast_to=object)
        assert episode["tools"][0]["function"]["name"] == "calculate"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
