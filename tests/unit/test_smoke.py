"""The whole loop, all four actors, in-process broker, tiny model, two learner updates."""

import uuid

import pytest

from tests.smoke_helpers import run_smoke


@pytest.mark.slow
def test_two_learner_steps_on_the_in_process_broker(tmp_path):
    metrics = run_smoke(tmp_path, f"memory://smoke-{uuid.uuid4().hex[:6]}", "smoke")
    shares = {k for m in metrics for k in m if k.startswith("rollout/pool_share/")}
    assert shares <= {"rollout/pool_share/current", "rollout/pool_share/stale"}


@pytest.mark.slow
def test_the_db_task_through_the_whole_loop(tmp_path, capfd):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://smoke-db-{uuid.uuid4().hex[:6]}", "smoke-db", steps=1)
    raw["tasks"] = {"db": {"options": {"max_turns": 2}}}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    import json

    (metrics,) = [
        json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["env/db/episodes"] == 4 and "env/db/reward" in metrics
    # the end-of-run summary: what this node's rollouts finished, per task
    err = capfd.readouterr().err
    assert "run smoke-db: v0 -> v1, " in err and "\n  db " in err, err[-2000:]


@pytest.mark.slow
def test_a_remote_task_served_by_environment_workers(tmp_path):
    import json

    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://smoke-env-{uuid.uuid4().hex[:6]}", "smoke-env", steps=1)
    raw["tasks"] = {
        "db": {"remote": True, "workers": 2, "capacity": 2, "options": {"max_turns": 2}}
    }
    cfg = parse_config(raw)
    supervisor = Supervisor(cfg)  # every role, "env" included
    assert supervisor.run(progress_every=3600, install_signals=False) == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics["env/db/episodes"] == 4
    assert "rollout/status/task_error" not in metrics  # every episode reached its environment
