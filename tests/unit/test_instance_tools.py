"""Tools of one instance (`Start.tools`): the prompt, env workers, demos; task variants
(``base:variant``); scripted steps with several calls."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest

from agentrl.actors import EpisodeLimits, TopologySpec, declare
from agentrl.actors._episode import play_episode
from agentrl.environments import (
    ChatFormat,
    Start,
    Status,
    Step,
    TaskOptionsError,
    UnknownTask,
    expand_task_name,
    make_task,
    register_task,
    session_tools,
)
from agentrl.environments._check import agent_message, step_text
from agentrl.environments._demo import with_demo
from agentrl.environments._toolcalls import function_tool, parse_assistant
from agentrl.environments._worker import EnvWorker, RemoteEnvironment
from agentrl.messages import ChatMessage, EpisodeRequest, ToolCall, connect
from tests.unit.test_episode import scripted

SHARED = [function_tool("shared", "A tool every instance has.", {}, [])]


def _own(index: int) -> list[dict]:
    return [function_tool(f"only_{index}", f"The tool of instance {index}.", {}, [])]


@dataclass
class _Session:
    index: int
    done: bool = False


class OwnToolsTask:
    """Instance i offers the single tool ``only_i``; calling it ends the episode with 1.0."""

    instance_tools = True
    num_instances = 3

    @property
    def tools(self) -> list[dict]:
        return list(SHARED)

    def start(self, index: int) -> Start:
        return Start(_Session(index), [ChatMessage("user", "call your tool")], _own(index))

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        ok = [c.name for c in message.tool_calls] == [f"only_{session.index}"]
        session.done = True
        return Step.end(Status.COMPLETED, 1.0 if ok else 0.0, {"env/success": float(ok)})

    def cancel(self, session: _Session) -> None:
        session.done = True


def test_session_tools_are_the_starts_own_else_the_environments():
    env = OwnToolsTask()
    assert session_tools(env, env.start(2)) == _own(2)
    assert session_tools(env, Start(None, [])) == SHARED


def test_the_prompt_shows_the_instances_tools_not_the_environments(smollm_tokenizer):
    tokenizer = smollm_tokenizer
    fmt = ChatFormat(tokenizer)
    env = OwnToolsTask()
    sample, calls = scripted(tokenizer, fmt, ['<tool_call>{"name": "only_1"}</tool_call>'])
    req = EpisodeRequest("e", "own", 1, "g", 0, 1, 0)
    traj = play_episode(req, env, env.start(1), fmt, EpisodeLimits(max_tokens=2048), sample)
    prompt = tokenizer.decode(calls[0])
    assert "only_1" in prompt and "shared" not in prompt and "only_0" not in prompt
    assert traj.env_reward == 1.0


def test_an_env_worker_sends_each_sessions_own_tools():
    run = f"owntools-{uuid.uuid4().hex[:6]}"
    client = connect(f"memory://{run}", name="client")
    declare(client, TopologySpec(run, ("current",), 8))
    worker = EnvWorker(
        OwnToolsTask(), broker=f"memory://{run}", run=run, task="own", capacity=2,
        worker_id="w1", heartbeat_interval=0.2,
    )  # fmt: skip
    try:
        remote = RemoteEnvironment(client, run, "own", timeout=5)
        first, second = remote.start(0), remote.start(2)
        assert first.tools == _own(0) and second.tools == _own(2)
        step = remote.interact(second.session, agent_message(ToolCall("c", "only_2", "{}")))
        assert step.finish and step.reward == 1.0
        remote.cancel(first.session)
    finally:
        worker.close()
        client.close()


def test_a_demo_is_refused_for_a_task_whose_instances_have_their_own_tools():
    with pytest.raises(ValueError, match="its own tools"):
        with_demo(OwnToolsTask(), "own", True)


def test_a_variant_name_sets_the_option_the_factory_names():
    made = []

    def factory(*, flavour: str = "plain", size: int = 1):
        made.append((flavour, size))
        return OwnToolsTask()

    factory.variant_option = "flavour"
    factory.variants = lambda v: ["a", "b"] if v == "both" else [v]
    name = f"variant-{uuid.uuid4().hex[:6]}"
    register_task(name, factory)
    make_task(f"{name}:sour", size=2)
    assert made == [("sour", 2)]
    assert expand_task_name(f"{name}:both") == [f"{name}:a", f"{name}:b"]
    assert expand_task_name(name) == [name]
    with pytest.raises(TaskOptionsError, match="contradicts"):
        make_task(f"{name}:sour", flavour="sweet")
    with pytest.raises(UnknownTask, match="takes no variant"):
        make_task("calculator:hard")
    with pytest.raises(UnknownTask, match="unknown task"):
        make_task("nosuchtask:x")


def test_a_scripted_step_may_make_several_calls_in_one_turn():
    calls = [ToolCall("c0", "a", '{"x": 1}'), ToolCall("c1", "b", "{}")]
    message = agent_message(calls)
    assert [c.name for c in message.tool_calls] == ["a", "b"]
    text = step_text(calls)
    parsed = parse_assistant(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("a", {"x": 1}),
        ("b", {}),
    ]
    assert step_text("just words") == "just words"
    with pytest.raises(ValueError, match="not a JSON object"):
        step_text(ToolCall("c", "a", "[1]"))
