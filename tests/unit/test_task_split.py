"""The split a command builds a task on when the user names none (ops/eval/task_split.py)."""

from __future__ import annotations

from agentrl.ops.cli import agentrl_env as cli_env
from agentrl.ops.eval.task_split import make_on_split


def test_the_default_split_is_added_only_where_the_factory_takes_one():
    env, options, split = make_on_split("calculator", {"num_instances": 4}, "all")
    assert (options, split, env.num_instances) == ({"num_instances": 4, "split": "all"}, "all", 4)
    _, options, split = make_on_split("calculator", {"split": "train"}, "all")
    assert (options, split) == ({"split": "train"}, "train")


def test_env_check_runs_the_oracle_on_every_item_by_default(capsys):
    argv = ["check", "--task", "calculator", "--agent", "oracle", "--option", "num_instances=4"]
    assert cli_env.main(argv) == 0
    assert "agentrl-env: task calculator: split all" in capsys.readouterr().err
    assert cli_env.main([*argv, "--option", "split=test"]) == 0
    assert "split test" in capsys.readouterr().err
