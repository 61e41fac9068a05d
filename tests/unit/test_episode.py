"""The episode loop (`play_episode`): malformed calls go to the environment, turn limits."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agentrl.actors import EpisodeLimits
from agentrl.actors._episode import assistant_message, play_episode
from agentrl.environments import ChatFormat, Start, Status, Step, make_task
from agentrl.messages import ChatMessage, EpisodeRequest, GenerateResult
from agentrl.ops.config.load import parse_config

NO_CALL = "No executable tool calls found. Please call a tool."
MALFORMED = '<tool_call>{"name": "step", "arguments": {</tool_call>'
GOOD = '<tool_call>{"name": "step", "arguments": {}}</tool_call>'


@dataclass
class _Session:
    turns: int = 0
    done: bool = False


@dataclass
class CountingTask:
    """Answers every message and ends the episode itself at its own turn limit (AgentBench)."""

    max_turns: int = 6
    seen: list[ChatMessage] = field(default_factory=list)
    cancelled: int = 0
    tools: list = field(default_factory=list)
    num_instances: int = 1

    def start(self, index: int) -> Start:
        return Start(_Session(), [ChatMessage(role="user", content="go")])

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        self.seen.append(message)
        session.turns += 1
        reply = [ChatMessage(role="user", content=NO_CALL if not message.tool_calls else "ok")]
        if session.turns >= self.max_turns:
            return Step(reply, Status.TASK_LIMIT_REACHED, 0.0, True, {"env/turns": 6.0})
        return Step(reply, Status.RUNNING, 0.0, False, {})

    def cancel(self, session: _Session) -> None:
        self.cancelled += 1


def scripted(tokenizer, fmt: ChatFormat, texts):
    """A `sample` function answering turn i with texts[i % len(texts)] and counting calls."""
    calls = []

    def sample(ids, max_new):
        text = texts[len(calls) % len(texts)]
        calls.append(ids)
        tokens = [*tokenizer.encode(text, add_special_tokens=False), fmt.end_of_turn_ids[-1]]
        result = GenerateResult("r", tokens, [-1.0] * len(tokens), 3, "current", "stop")
        return "current", result

    return sample, calls


REQ = EpisodeRequest("e0", "counting", 0, "g0", 0, 2, 3)


def test_a_malformed_call_reaches_the_environment_as_raw_text_and_the_episode_goes_on(
    smollm_tokenizer,
):
    fmt, env = ChatFormat(smollm_tokenizer), CountingTask(max_turns=6)
    sample, _ = scripted(smollm_tokenizer, fmt, [MALFORMED, GOOD])
    limits = EpisodeLimits(max_tokens=8192)
    traj = play_episode(REQ, env, env.start(0), fmt, limits, sample)
    assert traj.num_turns == 6 and traj.status == "task_limit_reached"
    assert traj.metrics["malformed_turns"] == 3.0  # turns 1, 3, 5
    assert traj.metrics["env/turns"] == 6.0  # the finishing step's metrics are kept
    malformed = env.seen[0]
    assert (malformed.role, malformed.content, malformed.tool_calls) == ("assistant", MALFORMED, [])
    assert env.seen[1].tool_calls[0].name == "step"
    # the model sees its own raw text and the environment's answer to it
    text = smollm_tokenizer.decode(traj.token_ids)
    assert text.count(MALFORMED) == 3 and text.count(NO_CALL) == 3
    assert env.cancelled == 0  # the environment finished the episode itself


def test_the_task_limit_applies_under_the_default_config(smollm_tokenizer):
    """rollout.max_turns defaults to no cap: a task with limit 6 runs 6 turns."""
    r = parse_config({"run": "x"}).rollout
    assert r.max_turns is None
    limits = EpisodeLimits(max_turns=r.max_turns, max_tokens=8192, max_new_tokens=r.max_new_tokens)
    fmt, env = ChatFormat(smollm_tokenizer), CountingTask(max_turns=6)
    sample, calls = scripted(smollm_tokenizer, fmt, [GOOD])
    traj = play_episode(REQ, env, env.start(0), fmt, limits, sample)
    assert (traj.num_turns, len(calls), traj.status) == (6, 6, "task_limit_reached")
    assert traj.metrics["malformed_turns"] == 0.0


def test_the_safety_cap_ends_an_episode_before_the_task_limit(smollm_tokenizer):
    fmt, env = ChatFormat(smollm_tokenizer), CountingTask(max_turns=6)
    sample, _ = scripted(smollm_tokenizer, fmt, [GOOD])
    limits = EpisodeLimits(max_turns=2, max_tokens=8192)
    traj = play_episode(REQ, env, env.start(0), fmt, limits, sample)
    assert (traj.num_turns, traj.status, traj.reward) == (2, "task_limit_reached", -0.2)
    assert env.cancelled == 1  # the rollout ended it: the session is cancelled


def test_the_calculator_ends_a_malformed_turn_as_an_invalid_action(smollm_tokenizer):
    """The calculator's own rule for a message without a call, not a crash."""
    fmt, env = ChatFormat(smollm_tokenizer), make_task("calculator")
    sample, _ = scripted(smollm_tokenizer, fmt, ['<tool_call>{"name": "calculate"'])
    req = EpisodeRequest("e0", "calculator", 0, "g0", 0, 2, 3)
    traj = play_episode(req, env, env.start(0), fmt, EpisodeLimits(max_tokens=4096), sample)
    assert (traj.status, traj.num_turns, traj.reward) == ("agent_invalid_action", 1, -0.2)
    assert traj.metrics["malformed_turns"] == 1.0


@pytest.mark.parametrize(
    ("text", "malformed"),
    [(GOOD, False), (MALFORMED, True), ("just words", False), ("</tool_call>", True)],
)
def test_assistant_message_keeps_raw_text_only_for_malformed_calls(text, malformed):
    message, why = assistant_message(text)
    assert (why is not None) == malformed
    if malformed:
        assert message == ChatMessage(role="assistant", content=text, tool_calls=[])
