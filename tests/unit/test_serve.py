"""The OpenAI-compatible endpoint with the real `openai` client against the real server
(uvicorn), the tiny model's sampler behind it on the in-process broker: tools round-trip,
the token ids of a served episode's trajectory are the ones sampled, malformed requests
and unknown episodes are 4xx with a clear message, an abandoned episode is dropped whole,
a rewritten history starts a new segment."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import openai
import pytest

from agentrl.environments import ChatFormat
from agentrl.messages import Topology, Trajectory, connect, decode
from agentrl.ops import Supervisor, parse_config
from agentrl.trainer import load_tokenizer, resolve_model
from tests.smoke_helpers import smoke_config

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def _serve_run(tmp: Path, make_engine=None):
    """A run with a sampler and the endpoint (no learner: the test reads the trajectories)."""
    broker = f"memory://serve-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp, broker, "served")
    raw["serve"] = {"port": 0, "episode_timeout": 3.0}
    raw["rollout"]["max_new_tokens"] = 64
    cfg = parse_config(raw)
    supervisor = Supervisor(cfg, ("sampler", "serve"), make_engine=make_engine)
    thread = threading.Thread(
        target=lambda: supervisor.run(progress_every=3600, install_signals=False)
    )
    thread.start()
    deadline = time.monotonic() + 120
    while supervisor.server is None:
        assert thread.is_alive() and time.monotonic() < deadline, "the endpoint did not start"
        time.sleep(0.05)
    reader = connect(broker, name="trajectory-reader")
    trajectories: list[Trajectory] = []
    got = threading.Condition()

    def take(delivery) -> None:
        with got:
            trajectories.append(decode(delivery.body, expect=Trajectory).payload)
            got.notify_all()
        delivery.ack()

    reader.consume(Topology(cfg.run).trajectories, take, prefetch=64)
    client = openai.OpenAI(
        base_url=supervisor.server.url, api_key=supervisor.server.api_key, max_retries=0
    )

    def trajectory_of(episode: str, timeout: float = 20.0) -> Trajectory:
        with got:
            assert got.wait_for(
                lambda: any(t.episode_id == episode for t in trajectories), timeout
            ), f"no trajectory for {episode}"
            return next(t for t in trajectories if t.episode_id == episode)

    def close() -> None:
        reader.close()
        supervisor.done.set()
        thread.join(60)

    return (client, trajectory_of, cfg), close


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny model's TorchEngine behind the endpoint."""
    run, close = _serve_run(tmp_path_factory.mktemp("serve"))
    yield run
    close()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """A scripted 'model' that solves the calculator task with tool calls."""
    from agentrl.actors._fakes import ScriptedEngine
    from tests.unit.scripts import calculator_script

    tokenizer = load_tokenizer(resolve_model("tiny"))
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    respond = calculator_script(tokenizer, eot, "solve")
    run, close = _serve_run(
        tmp_path_factory.mktemp("scripted"),
        make_engine=lambda weights, version, max_batch: ScriptedEngine(respond, version=version),
    )
    yield run
    close()


def _open(client, **body) -> dict:
    return client.post("/episodes", body=body, cast_to=object)


def test_models_and_a_completion_with_tools_carry_the_sampled_token_ids(served):
    client, _, cfg = served
    assert [m.id for m in client.models.list().data] == ["tiny"]
    messages = [{"role": "user", "content": "What is 2 + 3? Use the tool."}]
    reply = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, n=2, max_tokens=12, temperature=1.0
    )
    assert len(reply.choices) == 2 and reply.usage.completion_tokens <= 24
    extension = reply.model_extra["agentrl"]
    fmt = ChatFormat(load_tokenizer(resolve_model("tiny")))
    from agentrl.messages import ChatMessage

    assert extension["prompt_token_ids"] == fmt.prompt_ids(
        [ChatMessage(role="user", content=messages[0]["content"])], TOOLS
    )
    for choice, sampled in zip(reply.choices, extension["choices"], strict=True):
        assert len(sampled["token_ids"]) == len(sampled["logprobs"]) >= 1
        assert sampled["version"] == 0 and sampled["pool"] in cfg.pools
        text = fmt.decode_assistant(sampled["token_ids"])
        assert (choice.message.content or "") in text
        assert choice.finish_reason in ("stop", "length", "tool_calls")


def test_tool_calls_round_trip_in_an_episode_and_its_trajectory_is_what_was_sampled(served):
    """A built-in task (calculator): open, complete, let the environment answer, repeat;
    the published trajectory's tokens are the first prompt, then per turn the sampled ids
    (mask 1) and the environment's tokens (mask 0): every call's prompt is a prefix."""
    client, trajectory_of, _ = served
    episode = _open(client, task="calculator")
    messages, tools = episode["messages"], episode["tools"]
    assert tools and tools[0]["function"]["name"] == "calculate"
    prompts, sampled = [], []
    for _ in range(3):
        reply = client.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=tools,
            extra_headers={"X-Agentrl-Episode": episode["id"]},
        )
        extension = reply.model_extra["agentrl"]
        prompts.append(extension["prompt_token_ids"])
        sampled.append(extension["choices"][0]["token_ids"])
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        step = client.post(f"/episodes/{episode['id']}/step", body={}, cast_to=object)
        messages.extend(step["messages"])
        if step["finish"]:
            break
    else:
        give_up = {"status": "task_limit_reached"}  # the environment judges: no reward
        client.post(f"/episodes/{episode['id']}/end", body=give_up, cast_to=object)
    traj = trajectory_of(episode["id"])
    assert traj.metrics["serve/segments"] == 1.0 and traj.num_turns == len(sampled)
    assert traj.group_id == episode["group"] and traj.group_size == episode["group_size"]
    for prompt in prompts:  # no retokenisation: each prompt extends the last one's tokens
        assert traj.token_ids[: len(prompt)] == prompt
    trained = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m == 1]
    assert trained == [t for ids in sampled for t in ids]
    assert len(traj.logprobs) == len(traj.versions) == len(traj.token_ids)
    assert all(v == 0 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m == 1)


def test_an_episode_judged_by_its_agent_and_a_rewritten_history(served):
    client, trajectory_of, _ = served
    episode = _open(client, task="my-own-task", group_size=1)
    assert episode["messages"] == [] and episode["tools"] == []
    header = {"X-Agentrl-Episode": episode["id"]}
    first = [{"role": "user", "content": "Say hello."}]
    client.chat.completions.create(model="tiny", messages=first, extra_headers=header)
    rewritten = [{"role": "user", "content": "Say goodbye instead."}]  # not an extension
    reply = client.chat.completions.create(model="tiny", messages=rewritten, extra_headers=header)
    done = client.post(f"/episodes/{episode['id']}/end", body={"reward": 1.0}, cast_to=object)
    assert done["reward"] == 1.0
    traj = trajectory_of(episode["id"])
    assert traj.metrics["serve/segments"] == 2.0 and traj.metrics["serve/untrained_tokens"] > 0
    last = reply.model_extra["agentrl"]
    assert traj.token_ids == last["prompt_token_ids"] + last["choices"][0]["token_ids"]
    assert traj.reward == 1.0 and traj.task == "my-own-task"


def test_malformed_requests_and_unknown_episodes_get_a_clear_4xx(served):
    client, _, _ = served
    with pytest.raises(openai.BadRequestError, match="messages: List should have at least 1"):
        client.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], temperature=9.0
        )
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice="required",
        )
    with pytest.raises(openai.NotFoundError, match="no open episode 'nope'"):
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Agentrl-Episode": "nope"},
        )
    episode = _open(client, task="calculator")
    with pytest.raises(openai.BadRequestError, match="n must be 1 inside an episode"):
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            n=2,
            extra_headers={"X-Agentrl-Episode": episode["id"]},
        )


def test_an_agent_that_disappears_has_its_episode_dropped_whole(served):
    client, trajectory_of, _ = served
    episode = _open(client, task="calculator")
    client.chat.completions.create(
        model="tiny",
        messages=episode["messages"],
        tools=episode["tools"],
        extra_headers={"X-Agentrl-Episode": episode["id"]},
    )
    traj = trajectory_of(episode["id"], timeout=30)  # episode_timeout is 3 s here
    assert traj.metrics["infra_failure"] == 1.0 and traj.token_ids == []
    with pytest.raises(openai.NotFoundError):
        client.post(f"/episodes/{episode['id']}/end", body={"reward": 1.0}, cast_to=object)


def test_a_solved_episode_with_tool_calls_round_trips_and_extends_its_tokens(scripted):
    """The agent's loop as a user writes it: the assistant message it got back (with its
    tool calls) and the tool results go back in; the endpoint recognises its own turn, so
    the prompt is never re-tokenised and the task's environment judges the episode."""
    client, trajectory_of, _ = scripted
    episode = _open(client, task="calculator")
    messages, tools, header = episode["messages"], episode["tools"], {}
    header["X-Agentrl-Episode"] = episode["id"]
    prompts, names = [], []
    while True:
        reply = client.chat.completions.create(
            model="tiny", messages=messages, tools=tools, extra_headers=header
        )
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        names += [call.function.name for call in message.tool_calls]
        prompts.append(reply.model_extra["agentrl"]["prompt_token_ids"])
        messages.append(message.model_dump(exclude_none=True))
        step = client.post(f"/episodes/{episode['id']}/step", body={}, cast_to=object)
        messages.extend(step["messages"])
        if step["finish"]:
            break
    assert names == ["calculate", "answer"] and step["status"] == "completed"
    assert step["reward"] == 1.0 and messages[-2]["role"] == "tool"
    traj = trajectory_of(episode["id"])
    assert traj.reward == 1.0 and traj.num_turns == 2 and traj.metrics["serve/segments"] == 1
    assert traj.token_ids[: len(prompts[1])] == prompts[1]  # the second call extended the first
