"""Environment protocol, task registry, the safe arithmetic parser and the calculator task."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.environments import (
    Environment,
    MalformedToolCall,
    SessionClosed,
    Status,
    TaskOptionsError,
    UnknownTask,
    make_task,
    parse_assistant,
    register_task,
    task_names,
)
from agentrl.environments.tasks.calculator.arith import CalcError, evaluate
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.messages import ChatMessage

# --- protocol and registry ------------------------------------------------------------


def test_status_values_are_the_documented_ones():
    assert {s.value for s in Status} == {
        "running",
        "completed",
        "agent_context_limit",
        "agent_validation_failed",
        "agent_invalid_action",
        "task_limit_reached",
        "task_error",
        "cancelled",
    }
    assert Status.COMPLETED == "completed"  # a str enum: goes on the wire as its value


def test_calculator_is_registered_and_is_an_environment():
    assert "calculator" in task_names()
    env = make_task("calculator", levels=(1,), seed=3)
    assert isinstance(env, Environment)
    assert env.num_instances == len(env) == 10_000
    assert [t["function"]["name"] for t in env.tools] == ["calculate", "answer"]


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(UnknownTask, match=r"unknown task 'nope'; known tasks: .*calculator"):
        make_task("nope")


def test_bad_options_name_the_task():
    with pytest.raises(TaskOptionsError, match="calculator"):
        make_task("calculator", colour="blue")
    with pytest.raises(ValueError, match="levels"):
        make_task("calculator", levels=(4,))


def test_register_task_and_duplicates():
    made = []

    def factory(size: int = 1):
        made.append(size)
        return CalculatorTask(num_instances=size)

    register_task("test-registry-task", factory)
    try:
        assert "test-registry-task" in task_names()
        assert make_task("test-registry-task", size=7).num_instances == 7
        assert made == [7]
        with pytest.raises(ValueError, match="already registered"):
            register_task("test-registry-task", factory)
        register_task("test-registry-task", lambda: CalculatorTask(num_instances=2), replace=True)
        assert make_task("test-registry-task").num_instances == 2
    finally:
        from agentrl.environments import _registry

        _registry._factories.pop("test-registry-task", None)


# --- the safe arithmetic parser -----------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3", 5),
        ("2 + 3 * 4", 14),  # * binds tighter: 2 + 12
        ("(2 + 3) * 4", 20),
        ("10 - 4 - 3", 3),  # left-associative: (10 - 4) - 3
        ("48 / 4 / 2", 6),  # left-associative: (48 / 4) / 2
        ("7 / 2", Fraction(7, 2)),
        ("-(3 + 4) * 2", -14),
        ("--5", 5),
        ("2.5 * 4", 10),
        ("12 * (3 + 4) =", 84),  # a trailing '=' is tolerated
        ("6 \u00d7 7", 42),  # multiplication sign
        ("((((1))))", 1),
    ],
)
def test_evaluate_values(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("1 / 0", "division by zero"),
        ("1 / (2 - 2)", "division by zero"),
        ("2 ^ 3", "unsupported character '^'"),
        ("__import__('os')", "unsupported character '_'"),
        ("(1 + 2", "missing )"),
        ("1 + 2)", "unexpected )"),
        ("1 +", "unexpected end"),
        ("", "empty"),
        ("1" * 31, "too long"),
        ("1+" * 150 + "1", "longer than 200"),
        ("(" * 40 + "1" + ")" * 40, "nested too deeply"),
        ("-" * 40 + "1", "nested too deeply"),
    ],
)
def test_evaluate_errors(expression, reason):
    with pytest.raises(CalcError, match=re.escape(reason)):
        evaluate(expression)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/() .x", max_size=60) | st.text(max_size=30))
def test_evaluate_only_ever_raises_calc_error(text):
    try:
        value = evaluate(text)
    except CalcError:
        return
    assert isinstance(value, Fraction)


# --- the calculator task -----------------------------------------------------------------


def _call(name: str, **arguments) -> ChatMessage:
    body = json.dumps({"name": name, "arguments": arguments})
    return parse_assistant(f"<tool_call>{body}</tool_call>")


def _oracle(env: CalculatorTask, index: int, *, wrong: bool = False):
    """Calls calculate with the problem's expression, then answers the tool's result."""
    start = env.start(index)
    expression = re.search(r'compute "(.+)"', start.messages[-1].content).group(1)
    step = env.interact(start.session, _call("calculate", expression=expression))
    assert step.status is Status.RUNNING and not step.finish and step.reward == 0.0
    (reply,) = step.messages
    assert (reply.role, reply.tool_call_id, reply.name) == ("tool", "call_0", "calculate")
    result = float(reply.content.split("\n")[0])
    return env.interact(start.session, _call("answer", value=result + (1 if wrong else 0)))


def test_oracle_agent_solves_every_instance():
    env = CalculatorTask()
    steps = [_oracle(env, i) for i in range(200)]
    assert all(s.status is Status.COMPLETED and s.finish for s in steps)
    assert sum(s.reward for s in steps) / len(steps) == 1.0
    assert {s.metrics["env/level"] for s in steps} == {1.0, 2.0, 3.0}
    assert steps[0].metrics == {
        "env/turns": 2.0,
        "env/bad_calls": 0.0,
        "env/calls": 2.0,
        "env/level": 1.0,
        "env/success": 1.0,
        "env/used_calculator": 1.0,
        "env/calc_errors": 0.0,
    }


def test_wrong_agent_gets_nothing_but_completes():
    env = CalculatorTask()
    steps = [_oracle(env, i, wrong=True) for i in range(30)]
    assert all(s.status is Status.COMPLETED for s in steps)
    assert sum(s.reward for s in steps) == 0.0
    assert all(s.metrics["env/success"] == 0.0 for s in steps)


def test_opening_messages_state_the_problem_after_one_demo():
    env = CalculatorTask(seed=0)
    problem = env.problem(0)
    messages = env.start(0).messages
    assert [m.role for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert messages[-1].content == f'Use the calculate tool to compute "{problem.expression}".'
    assert parse_assistant(messages[2].content).tool_calls[0].name == "calculate"
    assert parse_assistant(messages[4].content).tool_calls[0].arguments == '{"value": 84}'
    assert [m.role for m in CalculatorTask(demo=False).start(0).messages] == ["system", "user"]


def test_answer_without_calculate_is_judged():
    env = CalculatorTask()
    start = env.start(5)
    step = env.interact(start.session, _call("answer", value=str(env.problem(5).value)))
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert step.metrics["env/used_calculator"] == 0.0


def test_calculate_and_answer_in_one_message():
    env = CalculatorTask()
    start = env.start(1)
    text = (
        '<tool_call>{"name": "calculate", "arguments": {"expression": "1 + 1"}}</tool_call>'
        f'<tool_call>{{"name": "answer", "arguments": {{"value": {env.problem(1).value}}}}}'
        "</tool_call>"
    )
    step = env.interact(start.session, parse_assistant(text))
    assert (step.status, step.reward, step.metrics["env/calls"]) == (Status.COMPLETED, 1.0, 2.0)


def test_calculator_error_is_an_observation():
    env = CalculatorTask()
    start = env.start(0)
    step = env.interact(start.session, _call("calculate", expression="1 / 0"))
    assert step.status is Status.RUNNING
    assert step.messages[0].content == "error: division by zero"
    done = env.interact(start.session, _call("answer", value=env.problem(0).value))
    assert done.metrics["env/calc_errors"] == 1.0 and done.reward == 1.0


@pytest.mark.parametrize(
    "message",
    [
        ChatMessage(role="assistant", content="The answer is 170."),
        _call("add", a=1, b=2),
        _call("calculate", expr="1 + 1"),
        _call("calculate", expression=["1"]),
        _call("answer", result=5),
        _call("answer", value="five"),
        _call("answer", value=True),
    ],
    ids=[
        "no-call",
        "unknown-tool",
        "calc-arg-name",
        "calc-arg-type",
        "answer-arg-name",
        "answer-not-a-number",
        "answer-bool",
    ],
)
def test_invalid_actions_end_the_episode(message):
    env = CalculatorTask()
    start = env.start(0)
    step = env.interact(start.session, message)
    assert (step.status, step.reward, step.finish) == (Status.AGENT_INVALID_ACTION, 0.0, True)
    with pytest.raises(SessionClosed):
        env.interact(start.session, _call("answer", value=1))


def test_turn_limit():
    env = CalculatorTask(max_turns=3)
    start = env.start(0)
    statuses = [env.interact(start.session, _call("calculate", expression="1+1")) for _ in range(3)]
    assert [s.status for s in statuses] == [
        Status.RUNNING,
        Status.RUNNING,
        Status.TASK_LIMIT_REACHED,
    ]
    assert statuses[-1].reward == 0.0 and statuses[-1].metrics["env/turns"] == 3.0


def test_malformed_call_is_caught_before_the_env():
    # The rollout passes the raw text to the env as a message without calls (actors/_episode.py).
    with pytest.raises(MalformedToolCall):
        parse_assistant('<tool_call>{"name": "calculate", "arguments": {"expression": 1 +')


def test_cancel_closes_the_session():
    env = CalculatorTask()
    start = env.start(0)
    env.cancel(start.session)
    env.cancel(start.session)  # idempotent
    with pytest.raises(SessionClosed):
        env.interact(start.session, _call("answer", value=1))


def test_instances_are_deterministic_graded_and_seeded():
    a, b = CalculatorTask(seed=1), CalculatorTask(seed=1)
    assert [a.problem(i) for i in range(50)] == [b.problem(i) for i in range(50)]
    assert [a.problem(i) for i in range(50)] != [
        CalculatorTask(seed=2).problem(i) for i in range(50)
    ]
    patterns = {
        1: r"\d\d [+-] \d\d",
        2: r"\d\d \* \d{2,3}",
        3: r"\(\d\d [+*-] \d\d\) [+*-] \d\d",
    }
    for i in range(300):
        p = a.problem(i)
        assert p.level == (1, 2, 3)[i % 3]
        assert re.fullmatch(patterns[p.level], p.expression), p
        assert p.value == evaluate(p.expression)
    only2 = CalculatorTask(levels=[2])
    assert {only2.problem(i).level for i in range(20)} == {2}
    with pytest.raises(IndexError):
        a.problem(10_000)
