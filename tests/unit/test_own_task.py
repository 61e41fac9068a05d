"""A task of one's own, from outside agentrl (docs/own-task.md, examples/own_task/): named
by import path or entry point, checked by the protocol contract, solved by its oracle,
trained from its config; a bad import path is one clear line."""

from __future__ import annotations

import importlib.metadata
import re
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.environments import TaskImportError, _locate, expand_task_name, make_task, task_names
from agentrl.environments._check import check
from agentrl.environments._conformance import conformance
from agentrl.ops import ConfigError, parse_config
from agentrl.ops.cli import agentrl_env as cli_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_task"
TASK = "guessing.task:GuessingTask"


@pytest.fixture(autouse=True)
def _example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # what PYTHONPATH=examples/own_task does


def test_the_example_passes_the_protocol_contract():
    report = conformance(TASK, {"levels": [1, 2, 3]}, episodes=40)
    assert report.violations == [], report.format()
    assert report.episodes == 40


def test_the_example_oracle_solves_every_instance_of_each_split():
    for split in ("train", "test"):
        env = make_task(TASK, levels=[1, 2, 3], num_instances=60, split=split)
        report = check(TASK, env, "oracle")
        assert report.success_rate == 1.0, report.format()
    env = make_task(TASK, levels=[1], num_instances=200, split="all")
    assert check(TASK, env, "random", seed=1).success_rate < 0.5  # guessing blind rarely wins


def test_train_and_test_secrets_are_disjoint_per_level():
    def secrets(split):
        env = make_task(TASK, levels=[1], num_instances=100, split=split)
        return {env.game(i).secret for i in range(100)}

    train, test = secrets("train"), secrets("test")
    assert train and test and not train & test


def test_the_demo_option_finds_the_oracle_through_the_import_path():
    env = make_task(TASK, demo=True)
    assert [m.role for m in env.start(0).messages].count("tool") >= 1


def test_cli_check_by_import_path():
    assert cli_env.main(["check", "--task", TASK, "--agent", "random"]) == 0
    assert (
        cli_env.main(["check", "--task", TASK, "--agent", "oracle", "--option", "levels=[2]"]) == 0
    )


def test_the_example_config_parses_and_its_options_are_checked():
    raw = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    cfg = parse_config(raw)
    assert cfg.tasks["guess"].factory("guess") == TASK
    raw["tasks"]["guess"]["options"]["levels"] = [9]  # refused by the factory when built
    raw["tasks"]["guess"]["options"]["colour"] = "red"  # refused by its signature, at start
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    (problem,) = info.value.problems
    assert problem.startswith(f"tasks.guess: task '{TASK}': bad options") and "colour" in problem


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nopkg_zz.envs:make_env", "not a registered task, and no module named 'nopkg_zz'"),
        ("guessing.task:NoSuchTask", "module 'guessing.task' has no attribute 'NoSuchTask'"),
        ("guessing.task:TOOLS", "guessing.task:TOOLS is not a class or function"),
    ],
)
def test_a_bad_import_path_is_one_clear_line(name, says):
    raw = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    raw["tasks"]["guess"]["task"] = name
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    (problem,) = info.value.problems
    assert problem.startswith("tasks.guess: ") and f"task {name!r}: {says}" in problem, problem
    assert "\n" not in problem
    with pytest.raises(TaskImportError, match=re.escape(says.split(" (")[0])):
        make_task(name)


def test_a_module_that_fails_to_import_is_named_with_its_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_task_zz.py").write_text("import json\nraise RuntimeError('no data')\n")
    (tmp_path / "needs_dep_zz.py").write_text("import not_installed_zz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskImportError, match=r"importing 'broken_task_zz' failed: Runtim"):
        make_task("broken_task_zz:Task")
    with pytest.raises(TaskImportError, match=r"it imports 'not_installed_zz', which is not"):
        make_task("needs_dep_zz:Task")
    assert cli_env.main(["check", "--task", "needs_dep_zz:Task", "--agent", "random"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("agentrl-env: task 'needs_dep_zz:Task': importing"), err


def test_builtin_and_variant_names_are_unchanged():
    assert make_task("calculator", levels=[1]).num_instances == 10_000
    assert expand_task_name(TASK) == [TASK] and expand_task_name("calculator") == ["calculator"]
    with pytest.raises(Exception, match="takes no variant"):
        make_task("calculator:x")


def test_an_entry_point_names_a_task(monkeypatch):
    point = importlib.metadata.EntryPoint(name="guess_zz", value=TASK, group="agentrl.tasks")
    monkeypatch.setattr(_locate, "_points", {"guess_zz": point})
    assert "guess_zz" in task_names()
    assert make_task("guess_zz", levels=[3]).game(0).high == 1000
    raw = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    raw["tasks"] = {"guess_zz": {"options": {"levels": [1]}}}
    assert parse_config(raw).tasks["guess_zz"].factory("guess_zz") == "guess_zz"


@pytest.mark.slow
def test_the_example_config_trains_one_step_with_the_tiny_model(tmp_path):
    from agentrl.ops import Supervisor

    raw = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    raw.update(
        model="tiny",
        max_steps=1,
        output_dir=str(tmp_path),
        broker=f"memory://own-task-{uuid.uuid4().hex[:6]}",
    )
    raw["rollout"].update(group_size=2, groups_per_batch=2, concurrency=4, max_new_tokens=8)
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    (line,) = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    assert '"env/guess/episodes": 4' in line
