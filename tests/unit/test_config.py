"""The run config: typed parsing, and every problem listed at once."""

from pathlib import Path

import pytest

from agentrl.ops import ConfigError, load_config, parse_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_configs_parse():
    for path in EXAMPLES.glob("*.yaml"):
        cfg = load_config(path)
        assert cfg.episodes_per_batch == cfg.rollout.group_size * cfg.rollout.groups_per_batch


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run: demo\nlearner: {lr: 1e-5}\n")
    cfg = load_config(path, broker="amqp://u:p@host:5672/", max_steps=3, model=None)
    assert cfg.broker == "amqp://u:p@host:5672/"
    assert cfg.max_steps == 3
    assert cfg.model == "smollm2"  # None keeps the file's (default) value
    assert cfg.learner.lr == pytest.approx(1e-5)  # YAML 1.1 reads 1e-5 as a string
    assert cfg.run_dir == Path("runs") / "demo"


def test_every_problem_is_listed_in_one_pass():
    raw = {
        "run": "bad name!",
        "broker": "redis://x",
        "colour": "blue",
        "tasks": {"calculator": {"weight": 0}, "nosuchtask": {}},
        "rollout": {"group_size": 1, "temperature": 0, "top_p": "high"},
        "staleness": {"max": 3, "hard": 1},
        "pools": {"current": {"weight": 0, "every": 0}},
        "learner": {"backend": "jax", "lr": [1]},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    problems = info.value.problems
    expected = [
        "colour: unknown key",
        "rollout.top_p: expected float, got 'high'",
        "learner.lr: expected float, got [1]",
        "run: 'bad name!'",
        "broker: 'redis'...",
        "tasks.calculator.weight: must be > 0",
        "tasks.nosuchtask: unknown task",
        "pools.current.every: must be >= 1",
        "pools: the weights must not all be 0",
        "rollout.group_size: GRPO needs at least 2",
        "rollout.temperature: must be > 0",
        "staleness.hard: must be >= staleness.max",
        "learner.backend: 'jax' is not available",
    ]
    for needle in expected:
        assert any(p.startswith(needle) for p in problems), (needle, problems)
    assert len(problems) == len(expected), problems
    assert str(info.value).startswith(f"config: {len(expected)} problem(s):")


def test_pool_engine_is_torch_or_vllm_and_listed_with_the_rest():
    pools = {
        "a": {"engine": "vllm"},
        "b": {},
        "c": {"engine": "sglang", "replicas": 0, "prefix_cache_tokens": -1},
    }
    with pytest.raises(ConfigError) as info:
        parse_config({"run": "ok", "pools": pools})
    assert info.value.problems == [
        "pools.c.replicas: must be >= 1",
        "pools.c.engine: 'sglang' is not torch or vllm",
        "pools.c.prefix_cache_tokens: must be >= 0 (0 = off)",
    ]
    cfg = parse_config({"run": "ok", "pools": {"a": {"engine": "vllm"}, "b": {}}})
    assert (cfg.pools["a"].engine, cfg.pools["b"].engine) == ("vllm", "torch")


def test_a_section_of_the_wrong_type_is_reported_with_the_rest():
    with pytest.raises(ConfigError) as info:
        parse_config({"run": "ok", "rollout": [1, 2], "staleness": {"max": -1}})
    assert info.value.problems == [
        "rollout: expected a mapping, got list",
        "staleness.max: must be >= 0",
    ]


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_run_is_required():
    with pytest.raises(ConfigError, match="run: required"):
        parse_config({})


def test_broker_url_from_a_file_or_the_environment(tmp_path, monkeypatch):
    from agentrl.ops.config.load import read_broker

    secret = tmp_path / "broker-url"
    secret.write_text("amqp://agent:s3cret@broker.example:5672/agentrl\n")
    monkeypatch.delenv("AGENTRL_BROKER_URL", raising=False)
    assert read_broker(None) is None
    assert read_broker("memory://x") == "memory://x"
    assert read_broker(f"@{secret}") == "amqp://agent:s3cret@broker.example:5672/agentrl"
    monkeypatch.setenv("AGENTRL_BROKER_URL", f"@{secret}")
    assert read_broker(None) == "amqp://agent:s3cret@broker.example:5672/agentrl"
    with pytest.raises(ValueError, match="cannot read the broker URL"):
        read_broker(f"@{tmp_path / 'missing'}")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        read_broker(f"@{tmp_path / 'empty'}")
    run = tmp_path / "run.yaml"
    run.write_text(f"run: r\nbroker: '@{secret}'\n")
    assert load_config(run).broker == "amqp://agent:s3cret@broker.example:5672/agentrl"
    run.write_text(f"run: r\nbroker: '@{tmp_path / 'missing'}'\n")
    with pytest.raises(ConfigError, match="broker: cannot read"):
        load_config(run)


def test_a_bad_broker_scheme_is_reported_without_the_rest_of_the_url():
    with pytest.raises(ConfigError) as info:
        parse_config({"run": "r", "broker": "redis://u:topsecret@h/"})
    assert "topsecret" not in str(info.value) and "'redis'" in str(info.value)


def test_an_entry_builds_its_task_and_carries_a_schedule():
    cfg = parse_config(
        {
            "run": "x",
            "tasks": {
                "calc1": {"task": "calculator", "options": {"levels": [1]}, "schedule": [[0, 1]]},
                "calculator": {"schedule": [[0, 0], [10, 2.5]]},
            },
        }
    )
    assert cfg.tasks["calc1"].factory("calc1") == "calculator"
    assert cfg.tasks["calculator"].factory("calculator") == "calculator"
    assert cfg.tasks["calculator"].schedule == [[0.0, 0.0], [10.0, 2.5]]
    assert cfg.rollout.max_turns is None  # no cap: every task's own limit applies


def test_schedule_task_turn_cap_and_group_timeout_problems_are_listed_together():
    raw = {
        "run": "x",
        "tasks": {
            "a": {"task": "nosuch", "schedule": [[5, 1], [2, -1]]},
            "b": {"task": "calculator", "schedule": "soon"},
            "c": {"task": "calculator", "schedule": [[1, 2, 3]]},
        },
        "rollout": {"max_turns": 0},
        "staleness": {"group_timeout": 0},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.problems == [
        "tasks.b.schedule: expected a list, got str",  # falls back to no schedule
        "tasks.a: unknown task 'nosuch' (known: alfworld, bfcl, bfcl_multi_turn, calculator, "
        "db, kg, openenv, os, reasoning_gym, verifiers, webshop)",
        "tasks.a.schedule: versions must be >= 0 and strictly increasing: [5.0, 2.0]",
        "tasks.a.schedule: weights must be >= 0",
        "tasks.c.schedule: must be a non-empty list of [version, weight] pairs",
        "rollout.max_turns: must be >= 1 (or null: no cap)",
        "staleness.group_timeout: must be > 0 seconds",
    ]


def test_schedules_that_leave_no_task_at_some_version_are_refused():
    tasks = {
        "a": {"task": "calculator", "schedule": [[0, 1], [4, 0]]},
        "b": {"task": "calculator", "schedule": [[4, 0], [6, 1]]},
    }
    with pytest.raises(ConfigError, match="every schedule gives weight 0 at version 4"):
        parse_config({"run": "x", "tasks": tasks})
    tasks["c"] = {"task": "calculator"}  # a constant weight keeps the mix alive
    assert parse_config({"run": "x", "tasks": tasks}).tasks["c"].weight == 1.0
