"""`evaluate` on the real rollout/sampler path, and the `agentrl eval` command line."""

from __future__ import annotations

import functools
import json
import re

import pykka
import pytest

from agentrl.actors._fakes import ScriptedEngine
from agentrl.environments import ChatFormat, register_task
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.ops import EvalError, evaluate, format_table
from agentrl.ops.cli import agentrl as cli_agentrl
from agentrl.ops.eval.evaluate import eval_problems, with_split
from agentrl.trainer import resolve_model
from tests.unit.scripts import calculator_script


@pytest.fixture(autouse=True)
def _stop_actors():
    yield
    pykka.ActorRegistry.stop_all()


def scripted(tokenizer, mode: str):
    """A `make_engine` whose engine answers with `calculator_script(mode)`."""
    eot = ChatFormat(tokenizer).end_of_turn_ids[-1]

    def make_engine(weights, version, max_batch):
        return ScriptedEngine(calculator_script(tokenizer, eot, mode), version=version)

    return make_engine


@pytest.mark.parametrize(("mode", "rate", "reward"), [("oracle", 1.0, 1.0), ("wrong", 0.0, 0.0)])
def test_scripted_engine_pass_rate_in_every_run(smollm_tokenizer, mode, rate, reward):
    progress = []
    report = evaluate(
        resolve_model("tiny"),
        {"calculator": {"seed": 1}},
        episodes=3,
        runs=2,
        max_new_tokens=64,
        make_engine=scripted(smollm_tokenizer, mode),
        on_progress=lambda done, total: progress.append((done, total)),
    )
    r = report.tasks["calculator"]
    assert (report.runs, report.episodes, r.runs, r.episodes) == (2, 3, 2, 3)
    assert r.options == {"seed": 1, "split": "test"}  # held-out problems by default
    assert r.pass_rates == (rate, rate)
    assert (r.pass_rate_mean, r.pass_rate_std) == (rate, 0.0)
    assert r.reward_mean == reward  # completed either way: env reward 1.0 / 0.0, no penalty
    assert r.turns_mean == 2.0  # calculate, then answer
    assert r.statuses == {"completed": 6}
    assert r.solved_per_instance == ((2, 2, 2) if rate else (0, 0, 0))
    assert progress[-1] == (6, 6)
    table = format_table(report)
    assert table.splitlines()[0] == (
        "| task | runs | episodes/run | pass rate (mean ± std) | reward | turns |"
    )
    assert table.splitlines()[2] == (
        f"| calculator | 2 | 3 | {rate:.3f} ± 0.000 | {reward:+.3f} | 2.00 |"
    )
    assert json.loads(report.to_json())["tasks"]["calculator"]["pass_rates"] == [rate, rate]


def test_arguments_are_checked_before_anything_starts(smollm_tokenizer):
    with pytest.raises(EvalError) as err:
        evaluate(
            resolve_model("tiny"),
            {"calculator": {"num_instances": 2}, "nope": {}},
            episodes=3,
            runs=0,
            make_engine=scripted(smollm_tokenizer, "oracle"),
        )
    text = str(err.value)
    assert "runs: must be >= 1" in text
    assert "unknown task 'nope'" in text
    assert "3 episodes per run but only 2 instances" in text


def test_tiny_model_report_structure():
    report = evaluate(
        resolve_model("tiny"),
        {"calculator": {}},
        episodes=2,
        runs=2,
        max_new_tokens=8,
        concurrency=4,
    )
    r = report.tasks["calculator"]
    assert (r.runs, r.episodes, len(r.pass_rates), len(r.solved_per_instance)) == (2, 2, 2, 2)
    assert sum(r.statuses.values()) == 4  # 2 runs x 2 episodes
    assert all(0.0 <= p <= 1.0 for p in r.pass_rates)
    assert 1.0 <= r.turns_mean <= 4.0
    assert "| calculator | 2 | 2 |" in format_table(report)


# --- the command line ---------------------------------------------------------------------


def test_cli_lists_every_argument_problem(capsys, tmp_path):
    code = cli_agentrl.main(
        [
            "eval",
            "--checkpoint",
            str(tmp_path / "checkpoints" / "v000099"),
            "--tasks",
            "calculator,nope",
            "--runs",
            "0",
            "--episodes",
            "many",
            "--task-option",
            "calculator.seed=1",
            "--task-option",
            "other.seed=2",
            "--task-option",
            "calculator",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    for expected in (
        "does not exist",  # the checkpoint directory
        "unknown task 'nope'",
        "runs: must be >= 1, got 0",
        "--episodes: not an integer or 'all': 'many'",
        "task 'other' is not in --tasks",
        "'calculator': expected TASK.KEY=VALUE",
    ):
        assert expected in err, err
    assert len([line for line in err.splitlines() if line.startswith("  - ")]) == 6


def test_task_episodes_override_episodes_and_all_plays_every_instance(smollm_tokenizer):
    def run(**episodes):
        report = evaluate(
            resolve_model("tiny"),
            {"calculator": {"seed": 1, "num_instances": 5}},
            runs=1,
            max_new_tokens=64,
            make_engine=scripted(smollm_tokenizer, "oracle"),
            **episodes,
        )
        return report.tasks["calculator"]

    every = run(episodes=None)
    assert (every.episodes, every.pass_rate_mean, len(every.solved_per_instance)) == (5, 1.0, 5)
    assert run(episodes=None, task_episodes={"calculator": 2}).episodes == 2
    problems = eval_problems(
        {"calculator": {"num_instances": 2}},
        episodes=None,
        task_episodes={"calculator": 3, "nope": 1},
        runs=1,
        temperature=0.0,
        max_turns=None,
        max_tokens=1024,
        max_new_tokens=64,
    )
    assert problems == [
        "task calculator: 3 episodes per run but only 2 instances",
        "task_episodes: nope=1: not a task here, or < 1",
    ]


def test_cli_expands_a_collection_and_checks_task_episodes(capsys):
    code = cli_agentrl.main(
        ["eval", "--checkpoint", "tiny", "--tasks", "calculator", "--episodes", "all",
         "--task-episodes", "calculator=0", "--task-episodes", "db=2"]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--task-episodes 'calculator=0': expected TASK=N with N >= 1" in err
    assert "--task-episodes 'db=2': task 'db' is not in --tasks" in err


def test_cli_relative_missing_checkpoint_is_not_taken_for_a_hub_name(capsys):
    code = cli_agentrl.main(["eval", "--checkpoint", "runs/nowhere/v000001", "--tasks", "x"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'runs/nowhere/v000001': no such directory" in err
    assert "unknown task 'x'" in err


def test_cli_prints_the_table_and_writes_it_with_the_numbers(
    capsys, tmp_path, monkeypatch, smollm_tokenizer
):
    engine = scripted(smollm_tokenizer, "oracle")
    monkeypatch.setattr(cli_agentrl, "evaluate", functools.partial(evaluate, make_engine=engine))
    out = tmp_path / "eval" / "eval.md"
    argv = "eval --checkpoint tiny --tasks calculator --runs 2 --episodes 2 --max-new-tokens 64"
    code = cli_agentrl.main(
        [*argv.split(), "--task-option", "calculator.levels=[1]", "--out", str(out)]
    )
    assert code == 0
    captured = capsys.readouterr()
    stdout = captured.out
    assert "agentrl eval: task calculator: split test" in captured.err
    assert "| calculator | 2 | 2 | 1.000 ± 0.000 | +1.000 | 2.00 |" in stdout
    assert out.read_text() == stdout
    numbers = json.loads(out.with_suffix(".json").read_text())
    assert numbers["tasks"]["calculator"]["options"] == {"levels": [1], "split": "test"}
    assert numbers["tasks"]["calculator"]["pass_rate_mean"] == 1.0
    assert numbers["runs"] == 2


def test_tasks_with_a_split_option_are_evaluated_on_test_unless_told():
    register_task("no-split-eval", _no_split, replace=True)
    tasks = {"calculator": {"seed": 1}, "no-split-eval": {"seed": 1}, "nope": {}}
    options, splits = with_split(tasks)
    assert options["calculator"] == {"seed": 1, "split": "test"}
    assert options["no-split-eval"] == {"seed": 1}  # no split option: built as configured
    assert splits == {"calculator": "test", "no-split-eval": "all (no split option)", "nope": "?"}
    options, splits = with_split({"calculator": {"split": "train"}})
    assert (options, splits) == ({"calculator": {"split": "train"}}, {"calculator": "train"})


def _no_split(seed: int = 0) -> CalculatorTask:
    return CalculatorTask(seed=seed)


class _Broken(CalculatorTask):
    def interact(self, session, message):
        raise KeyError("a bug in the task")


def test_an_actor_that_stops_is_named_with_its_exception_and_task(smollm_tokenizer):
    register_task("broken-eval", _Broken, replace=True)
    with pytest.raises(EvalError) as err:
        evaluate(
            resolve_model("tiny"),
            {"broken-eval": {}},
            episodes=3,
            runs=1,
            max_new_tokens=64,
            make_engine=scripted(smollm_tokenizer, "oracle"),
        )
    text = str(err.value)  # each episode is tried 3 times: the 6th failure of 10 stops it
    assert re.match(r"stopped after [0-2] of 3 episodes: the rollout actor: RuntimeError: ", text)
    assert "task 'broken-eval' keeps failing" in text
    assert "KeyError: interact raised: 'a bug in the task'" in text


def test_a_first_use_of_the_model_says_so_on_the_console(tmp_path, monkeypatch, capsys):
    # agentrl eval's console shows warnings only; the model's conversion (a minute for
    # SmolLM2 on a CPU) is info lines, shown all the same
    from agentrl.ops.cli import models

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    path, problem = models.checkpoint_dir("tiny")
    assert problem is None and (path / "config.json").exists()
    seen = capsys.readouterr()
    assert "building the tiny random model (once" in seen.out + seen.err
    models.checkpoint_dir("tiny")  # built: nothing more to say
    seen = capsys.readouterr()
    assert "building" not in seen.out + seen.err
