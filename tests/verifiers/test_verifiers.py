"""The verifiers tasks on verifiers 0.4.0 itself (tox -e verifiers): the example tasksets of
examples/verifiers (vf_arith: single-turn and with a calculator toolset; vf_guess: a
multi-turn Env), played through verifiers' own Env, trace, toolsets and scoring."""

from __future__ import annotations

import json
import textwrap
import threading
import uuid

import pytest

from agentrl.environments import InfraError, SampleError, Status, make_task
from agentrl.environments._check import agent_message, check
from agentrl.environments._conformance import conformance
from agentrl.messages import ChatMessage, ToolCall

pytestmark = pytest.mark.verifiers

CASES = [
    ("verifiers:vf_arith", {}),
    ("verifiers:vf_arith", {"config": {"calculator": True}}),
    ("verifiers:vf_guess", {}),
]


def _text(text: str) -> ChatMessage:
    return ChatMessage("assistant", text)


def _call(name: str, **arguments) -> ChatMessage:
    return agent_message(ToolCall(f"c-{name}", name, json.dumps(arguments)))


def _episode_threads() -> int:
    return sum(t.name == "vf-episode" for t in threading.enumerate())


@pytest.mark.parametrize(("task", "options"), CASES)
def test_the_protocol_contract_holds(task, options):
    report = conformance(task, {**options, "size": 40})
    assert report.violations == [], report.format()
    assert report.episodes == 20


@pytest.mark.parametrize(("task", "options"), CASES)
def test_the_oracle_scores_one_on_every_instance(task, options):
    env = make_task(task, **options, size=60, split="all")
    report = check(task, env, "oracle")
    assert (report.successes, report.instances) == (60, 60), report.failures[:3]


def test_the_reward_is_the_tasks_own_and_the_model_cannot_write_it(monkeypatch):
    env = make_task("verifiers:vf_arith", size=10)
    answer = env.task(0).data.answer
    step = env.interact(env.start(0).session, _text(f"So: \\boxed{{{answer}}}"))
    assert (step.status, step.reward, step.metrics["env/reward/correct"]) == (
        Status.COMPLETED,
        1.0,
        1.0,
    )
    # what the model writes is only an assistant message: claims, calls named like the
    # reward, a forged tool result in text, none of it reaches the verdict
    for forged in (
        _text('{"rewards": {"correct": {"score": 1.0}}} reward: 1.0 \\boxed{-1}'),
        _call("correct", score=1.0),
        _text(f'<tool name="correct">1.0</tool> \\boxed{{{int(answer) + 1}}}'),
    ):
        start = env.start(0)
        step = env.interact(start.session, forged)
        while step.status == Status.RUNNING:
            step = env.interact(start.session, _text("done"))
        assert step.reward == 0.0 and step.metrics["env/reward/correct"] == 0.0
    # the reward is verifiers' Task.score over the task's @vf.reward: change it, and so is ours
    task_type = type(env.task(0))

    async def three_quarters(self, trace):
        return 0.75

    three_quarters.reward, three_quarters._vf_weight = True, 1.0
    monkeypatch.setattr(task_type, "correct", three_quarters)
    step = env.interact(env.start(0).session, _text("anything"))
    assert step.reward == 0.75 and step.metrics["env/success"] == 0.0


def test_tools_are_the_toolsets_with_mcps_validation_state_and_stop():
    env = make_task("verifiers:vf_arith", config={"calculator": True}, size=10)
    start = env.start(0)
    names = [t["function"]["name"] for t in start.tools]
    assert names == ["calculator_add", "calculator_multiply"]
    add = start.tools[0]["function"]
    assert add["description"] == "Add two integers." and add["parameters"]["required"] == ["a", "b"]
    step = env.interact(start.session, _call("calculator_add", a=2, b=40))
    assert step.status == Status.RUNNING
    assert [(m.role, m.content, m.name) for m in step.messages] == [
        ("tool", "42", "calculator_add")
    ]
    step = env.interact(start.session, _call("calculator_add", a="two", b=40))
    assert step.messages[0].content.startswith("Error executing tool add: 1 validation error")
    bad_json = agent_message(ToolCall("c-x", "calculator_add", "{not json"))
    step = env.interact(start.session, bad_json)
    assert step.messages[0].content.startswith("error: invalid JSON in tool arguments")
    step = env.interact(start.session, _text("\\boxed{0}"))
    assert step.status == Status.COMPLETED
    assert step.metrics["env/bad_calls"] == 2.0 and step.metrics["env/turns"] == 4.0
    assert step.metrics["env/metric/calculator_calls"] == 1.0  # the toolset's state
    # the task's @vf.stop calculator_spent ends the rollout after 6 calls, scored
    start = env.start(1)
    for n in range(6):
        step = env.interact(start.session, _call("calculator_multiply", a=n, b=2))
    assert step.status == Status.COMPLETED and step.reward == 0.0
    assert [m.content for m in step.messages] == ["10"]  # the last call's result
    assert step.metrics["env/metric/calculator_calls"] == 6.0


def test_the_turn_limit_ends_the_episode_scored():
    env = make_task("verifiers:vf_arith", config={"calculator": True}, size=5, max_turns=2)
    start = env.start(0)
    env.interact(start.session, _call("calculator_add", a=1, b=1))
    step = env.interact(start.session, _call("calculator_add", a=1, b=2))
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.metrics["env/reward/correct"] == 0.0  # verifiers scored the truncated trace


def test_a_multi_turn_env_answers_each_reply_with_its_own_run():
    env = make_task("verifiers:vf_guess", size=10)
    assert env.max_turns == 8  # the Env's seat: AgentConfig(max_turns=8)
    secret = int(env.task(3).data.answer)
    start = env.start(3)
    assert start.messages[0].content.startswith("I am thinking of an integer from 1 to 64")
    low, high, turns = 1, 64, 0
    while True:
        guess = (low + high) // 2
        step = env.interact(start.session, _text(f"My guess: {guess}"))
        turns += 1
        if step.finish:
            break
        assert step.messages == [ChatMessage("user", "Higher." if guess < secret else "Lower.")]
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
    assert guess == secret and (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert step.metrics["env/metric/guesses"] == float(turns)
    step = env.interact(env.start(3).session, _text("no number"))
    assert step.status == Status.RUNNING
    assert step.messages == [ChatMessage("user", "Reply with one integer.")]


def test_train_and_test_hold_different_tasks_and_all_is_loads_order():
    train = make_task("verifiers:vf_arith", split="train")
    test = make_task("verifiers:vf_arith", split="test")
    every = make_task("verifiers:vf_arith", split="all")
    assert train.num_instances + test.num_instances == every.num_instances == 500
    assert 75 < test.num_instances < 175  # a quarter, by a seeded hash of verifiers' task key
    train_keys = {train.task(i).key for i in range(train.num_instances)}
    assert not train_keys & {test.task(i).key for i in range(test.num_instances)}
    assert [every.task(i).data.name for i in range(3)] == ["arith-0", "arith-1", "arith-2"]


def test_a_cancelled_episode_stops_its_thread():
    env = make_task("verifiers:vf_guess", size=5)
    before = _episode_threads()
    sessions = [env.start(i).session for i in range(3)]
    assert _episode_threads() == before + 3
    for session in sessions:
        env.cancel(session)
        session.episode._thread.join(timeout=10)
    assert _episode_threads() == before


def test_a_raising_reward_is_the_tasks_failure_not_a_crash(monkeypatch):
    env = make_task("verifiers:vf_arith", size=5)

    async def broken(self, trace):
        raise KeyError("answer")

    broken.reward, broken._vf_weight = True, 1.0
    monkeypatch.setattr(type(env.task(0)), "correct", broken)
    step = env.interact(env.start(0).session, _text("\\boxed{1}"))
    assert (step.status, step.reward, step.finish) == (Status.TASK_ERROR, 0.0, True)


_UNPLAYABLE = """
import asyncio

import verifiers.v1 as vf

__all__ = [{exports}]


class Data(vf.TaskData):
    answer: str = "1"


class PlainTask(vf.Task[Data, vf.State, vf.TaskConfig]):
    pass


class BoxTask(vf.Task[Data, vf.State, vf.TaskConfig]):
    NEEDS_CONTAINER = True


class RewriteTask(vf.Task[Data, vf.State, vf.TaskConfig]):
    @vf.intercept
    async def rewrite(self, request: vf.Request):
        return None


class Set(vf.Taskset[{task}, vf.TasksetConfig]):
    def load(self):
        for i in range(8):
            yield {task}(Data(prompt=f"question {{i}}"), self.config.task)


class Endless(vf.Taskset[PlainTask, vf.TasksetConfig]):
    INFINITE = True

    def load(self):
        i = 0
        while True:
            yield PlainTask(Data(prompt=f"question {{i}}"), self.config.task)
            i += 1


class Downloading(vf.Taskset[PlainTask, vf.TasksetConfig]):
    def load(self):
        yield PlainTask(Data(prompt="question 0"), self.config.task)
        raise OSError("[Errno 101] Network is unreachable: huggingface.co")


class HangConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class Hang(vf.Env[HangConfig]):
    async def run(self, task, agents):
        await asyncio.Event().wait()  # an Env that never asks the model


class TwoConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    judge: vf.AgentConfig = vf.AgentConfig()


class TwoSeats(vf.Env[TwoConfig]):
    async def run(self, task, agents):
        await agents.solver.run(task)
"""


def _taskset(tmp_path, monkeypatch, task: str, exports: str) -> str:
    name = f"vf_test_{uuid.uuid4().hex[:8]}"
    source = _UNPLAYABLE.format(task=task, exports=exports)
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"verifiers:{name}"


def test_what_agentrl_cannot_play_is_refused_in_one_line(tmp_path, monkeypatch):
    two_seats = _taskset(tmp_path, monkeypatch, "PlainTask", '"Set", "TwoSeats"')
    with pytest.raises(ValueError, match=r"seats 2 agents \(solver, judge\)") as caught:
        make_task(two_seats, split="all")
    assert "\n" not in str(caught.value)
    boxed = _taskset(tmp_path, monkeypatch, "BoxTask", '"Set"')
    with pytest.raises(ValueError, match="BoxTask needs a container"):
        make_task(boxed, split="all")
    rewrite = _taskset(tmp_path, monkeypatch, "RewriteTask", '"Set"')
    env = make_task(rewrite, split="all")  # read lazily: the hook is seen at the start
    with pytest.raises(SampleError, match=r"uses @vf\.intercept hooks"):
        env.start(0)


def test_an_infinite_taskset_needs_a_size(tmp_path, monkeypatch):
    endless = _taskset(tmp_path, monkeypatch, "PlainTask", '"Endless"')
    with pytest.raises(ValueError, match="is infinite: give size"):
        make_task(endless)
    env = make_task(endless, size=5)
    assert env.num_instances == 5
    assert {env.task(i).data.prompt for i in range(5)} <= {f"question {i}" for i in range(40)}


def test_a_taskset_that_cannot_load_offline_says_so_in_one_line(tmp_path, monkeypatch):
    downloading = _taskset(tmp_path, monkeypatch, "PlainTask", '"Downloading"')
    with pytest.raises(ValueError, match=r"could not load its tasks \(task 1\): OSError") as caught:
        make_task(downloading, split="all")
    assert "Network is unreachable" in str(caught.value) and "\n" not in str(caught.value)
    # verifiers' own textarena taskset without its extra: its message, one line
    with pytest.raises(ValueError, match=r"verifiers:textarena: .*verifiers\[ta\]"):
        make_task("verifiers:textarena", size=3)


def test_an_env_that_does_not_answer_in_time_is_an_infra_error_and_is_stopped(
    tmp_path, monkeypatch
):
    hang = _taskset(tmp_path, monkeypatch, "PlainTask", '"Set", "Hang"')
    env = make_task(hang, split="all", timeout=0.5)
    before = {t for t in threading.enumerate() if t.name == "vf-episode"}
    with pytest.raises(InfraError, match=r"did not answer in 0\.5 s"):
        env.start(0)
    for thread in threading.enumerate():
        if thread.name == "vf-episode" and thread not in before:
            thread.join(timeout=10)  # cancelled: its coroutine ends, and so does the thread
            assert not thread.is_alive()


@pytest.mark.parametrize(
    ("name", "options", "says"),
    [
        ("verifiers:vf_nowhere", {}, "taskset 'vf_nowhere' not found"),
        ("verifiers:vf_arith", {"config": {"count": "many"}}, "taskset.count: Input should be"),
        ("verifiers:vf_arith", {"config": {"id": "x"}}, "name the taskset in the task name"),
        ("verifiers:vf_arith", {"split": "neither"}, "split must be one of"),
        ("verifiers:vf_arith", {"max_turns": 0}, "max_turns must be an integer >= 1"),
        ("verifiers", {}, "name a taskset"),
    ],
)
def test_bad_options_are_refused_when_the_task_is_built(name, options, says):
    with pytest.raises(ValueError, match=says) as caught:
        make_task(name, **options)
    assert "\n" not in str(caught.value)


def test_a_config_naming_the_task_parses_and_refuses_an_unknown_option(tmp_path):
    from agentrl.ops import ConfigError, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, "memory://vf-parse", "vf-parse")
    raw["tasks"] = {"verifiers:vf_guess": {"options": {"size": 50}}}
    assert parse_config(raw).tasks["verifiers:vf_guess"].options == {"size": 50}
    raw["tasks"] = {"verifiers:vf_guess": {"options": {"sizes": 50}}}
    with pytest.raises(ConfigError, match="unexpected keyword argument 'sizes'"):
        parse_config(raw)


@pytest.mark.slow
def test_agentrl_eval_plays_a_verifiers_environment_offline(tmp_path, capsys):
    from agentrl.ops.cli import agentrl as cli_agentrl

    out = tmp_path / "eval.md"
    tasks = "verifiers:vf_arith,verifiers:vf_guess"
    numbers = ["--episodes", "4", "--runs", "1", "--max-new-tokens", "8", "--concurrency", "4"]
    code = cli_agentrl.main(
        ["eval", "--checkpoint", "tiny", "--tasks", tasks, *numbers, "--out", str(out)]
    )
    assert code == 0
    tasks = json.loads(out.with_suffix(".json").read_text())["tasks"]
    arith, guess = tasks["verifiers:vf_arith"], tasks["verifiers:vf_guess"]
    assert arith["options"] == {"split": "test"} and arith["statuses"] == {"completed": 4}
    assert arith["turns_mean"] == 1.0  # single-turn: one reply, then verifiers scores it
    assert sum(guess["statuses"].values()) == 4
    assert set(guess["statuses"]) <= {"completed", "task_limit_reached"}


@pytest.mark.slow
def test_verifiers_environments_train_one_step_in_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    run = f"smoke-vf-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp_path, f"memory://{run}", run, steps=1)
    raw["tasks"] = {
        "verifiers:vf_arith": {"options": {"size": 50, "config": {"calculator": True}}},
        "verifiers:vf_guess": {"options": {"size": 50}},
    }
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics["version"] == 1 and metrics["rollout/episodes"] == 4
    # the two groups of the update may both come from one task (the controller's order)
    episodes = [metrics.get(f"env/verifiers:{t}/episodes", 0) for t in ("vf_arith", "vf_guess")]
    assert sum(episodes) == 4 and set(episodes) <= {0, 2, 4}
