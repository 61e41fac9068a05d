"""reasoning-gym datasets as agentrl tasks: ``reasoning_gym:<dataset>``.

Each instance is one reasoning-gym entry (`items`: seeds and questions mapped to agentrl's
train/test split, curriculum levels), scored by the dataset's own
``dataset.score_answer(answer, entry)``. docs/tasks.md "reasoning_gym" has the commands.

**Modes.** ``mode: answer`` (the default) is single-turn, as reasoning-gym is played: the
system prompt is reasoning-gym's own (``SYSTEM_PROMPTS[prompt]``, ``default`` by default),
the user message the entry's question, and the one assistant reply must hold the answer in
``<answer>...</answer>`` (read by reasoning-gym's ``extract_answer``, the last tag wins).
``mode: tool`` is multi-turn: the model calls ``submit_answer(answer)`` once it knows the
answer; a message without that call is answered with a reminder and costs its turn (a bad
call), and ``max_turns`` (default 3) ends the episode ``task_limit_reached``, reward 0.

**Reward and statuses.** An answer read ends the episode ``completed`` with reward
``score_answer``'s value: 1.0 for the expected answer, 0.0 for a wrong one, and for some
datasets partial credit in between (the base class gives ``len(expected) / len(answer)``
when the expected answer is inside a longer one); it is clamped to [0, 1]. Success
(``env/success``) is a score of 1.0. A single-turn reply without an answer tag is the
model's failure: ``agent_invalid_action``, reward 0. A scorer that raises, or returns a
value that is not a finite number, is the task's failure: ``task_error``, reward 0, logged.

**Oracle.** The entry's ``answer`` (``CHECK_AGENTS["oracle"]``): for ``agentrl-env check
--agent oracle``, the ``demo`` option and SFT data. Datasets whose entries have no single
answer (``answer`` None) cannot be solved by it.

Metrics on the finishing step: ``env/turns``, ``env/bad_calls``, ``env/level``,
``env/success``, ``env/score`` (the scorer's value) and ``env/answered`` (1 when an answer
was read).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from agentrl.environments._protocol import Start, Status, Step
from agentrl.environments.tasks.reasoning_gym.items import Item, ItemSource
from agentrl.environments.tasks.reasoning_gym.library import load
from agentrl.environments.tasks.toolkit.episode import (
    after_turn,
    begin_turn,
    end_episode,
    no_tool_call,
)
from agentrl.environments.tasks.toolkit.split import check_split
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "MODES", "ReasoningGymTask", "reasoning_gym"]

log = structlog.get_logger(__name__)

MODES = ("answer", "tool")
"""Values of the ``mode`` option: single-turn answer tags, or the ``submit_answer`` tool."""

SUBMIT = {
    "type": "function",
    "function": {
        "name": "submit_answer",
        "description": "Submit your final answer. The episode ends with it.",
        "parameters": {
            "type": "object",
            "properties": {
                "answer": {
                    "type": "string",
                    "description": "Only the final answer, in the format the question asks for.",
                }
            },
            "required": ["answer"],
        },
    },
}

TOOL_PROMPT = (
    "Solve the problem step by step. When you know the answer, call the submit_answer tool "
    "with only the final answer, in the format the question asks for. You submit once."
)
REMINDER = "Call submit_answer with your final answer."


def reasoning_gym(
    *,
    dataset: str | None = None,
    mode: str = "answer",
    split: str = "train",
    seed: int = 0,
    size: int = 1000,
    config: dict[str, Any] | None = None,
    levels: Sequence[int] | None = None,
    max_turns: int = 3,
    prompt: str = "default",
) -> ReasoningGymTask:
    """The ``reasoning_gym`` task: ``size`` items of reasoning-gym's ``dataset``
    (``reasoning_gym:<dataset>`` in task lists) on ``split``, generated with ``seed`` and
    ``config`` (fields of the dataset's config class, passed to
    ``reasoning_gym.create_dataset``), at curriculum ``levels`` when given."""
    return ReasoningGymTask(
        dataset,
        mode=mode,
        split=split,
        seed=seed,
        size=size,
        config=config,
        levels=levels,
        max_turns=max_turns,
        prompt=prompt,
    )


reasoning_gym.variant_option = "dataset"  # type: ignore[attr-defined]  # reasoning_gym:<dataset>


@dataclass
class _Session:
    item: Item
    max_turns: int
    turns: int = 0
    bad_calls: int = 0
    done: bool = False


class ReasoningGymTask:
    """reasoning-gym entries as an agentrl environment (module doc)."""

    def __init__(
        self,
        dataset: str | None,
        *,
        mode: str = "answer",
        split: str = "train",
        seed: int = 0,
        size: int = 1000,
        config: dict[str, Any] | None = None,
        levels: Sequence[int] | None = None,
        max_turns: int = 3,
        prompt: str = "default",
    ) -> None:
        self.name = f"reasoning_gym:{dataset}"
        if not dataset:
            raise ValueError("reasoning_gym: name a dataset, reasoning_gym:<dataset>")
        self._rg = load()
        check_split(split, self.name)
        if mode not in MODES:
            raise ValueError(f"{self.name}: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not isinstance(size, int) or size < 1 or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"{self.name}: size and max_turns must be integers >= 1")
        if prompt not in self._rg.utils.SYSTEM_PROMPTS:
            known = ", ".join(self._rg.utils.SYSTEM_PROMPTS)
            raise ValueError(f"{self.name}: prompt must be one of {known}, got {prompt!r}")
        if levels is not None:
            levels = tuple(levels)
            if not levels or not all(isinstance(v, int) and v >= 0 for v in levels):
                raise ValueError(f"{self.name}: levels must be integers >= 0, got {levels}")
        self.mode, self.split, self.seed = mode, split, seed
        self._size, self._max_turns = size, max_turns
        self._system = self._rg.utils.SYSTEM_PROMPTS[prompt] if mode == "answer" else TOOL_PROMPT
        self._levels: tuple[int, ...] = levels or (0,)
        self._items = ItemSource(
            dataset,
            split=split,
            seed=seed,
            size=size,
            config=dict(config or {}),
            levels=levels,
            task=self.name,
        )
        self._ids = itertools.count()

    @property
    def tools(self) -> list[dict]:
        return [json.loads(json.dumps(SUBMIT))] if self.mode == "tool" else []

    @property
    def num_instances(self) -> int:
        return self._size

    def item(self, index: int) -> Item:
        """Instance ``index``'s reasoning-gym item (`items`); IndexError out of range."""
        if not 0 <= index < self._size:
            raise IndexError(f"{self.name}: index {index} not in [0, {self._size})")
        level = self._levels[index % len(self._levels)]
        return self._items.item(level, index // len(self._levels))

    def describe(self, index: int) -> str:
        """The question (its start and a digest): equal instances have equal descriptions."""
        question = self.item(index).entry["question"]
        digest = hashlib.sha256(question.encode()).hexdigest()[:12]
        return f"({question[:60]!r} sha256 {digest})"

    def start(self, index: int) -> Start:
        item = self.item(index)
        messages = [
            ChatMessage("system", self._system),
            ChatMessage("user", item.entry["question"]),
        ]
        return Start(_Session(item, 1 if self.mode == "answer" else self._max_turns), messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        begin_turn(self.name, session)
        if self.mode == "answer":
            answer = self._rg.utils.extract_answer(message.content or "")
            if answer is None:
                session.bad_calls += 1
                return self._end(session, Status.AGENT_INVALID_ACTION, "no <answer> tag", [])
            return self._judge(session, answer, [])
        if not message.tool_calls:
            return after_turn(session, [no_tool_call(session, REMINDER)], self._end)
        replies = []
        for call in message.tool_calls:
            answer = _submitted(call)
            if answer is None:
                session.bad_calls += 1
                text = f"error: call submit_answer with a string answer, not {call.name}"
                replies.append(_reply(call, f"{text}({call.arguments[:200]})"))
                continue
            replies.append(_reply(call, "submitted"))
            return self._judge(session, answer, replies)
        return after_turn(session, replies, self._end)

    def cancel(self, session: _Session) -> None:
        session.done = True

    def _judge(self, session: _Session, answer: str, replies: list[ChatMessage]) -> Step:
        item = session.item
        try:
            score = item.dataset.score_answer(answer, item.entry)
        except Exception as exc:  # any error of the dataset's scorer is the task's failure
            log.warning("reasoning_gym scorer raised", task=self.name, error=repr(exc))
            return self._end(session, Status.TASK_ERROR, f"scorer raised {exc!r}", replies)
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            log.warning("reasoning_gym scorer returned a non-number", task=self.name, score=score)
            return self._end(session, Status.TASK_ERROR, f"score {score!r}", replies)
        score = min(max(float(score), 0.0), 1.0)
        return self._end(session, Status.COMPLETED, "answered", replies, score=score)

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage],
        *,
        score: float | None = None,
    ) -> Step:
        metrics = {"env/score": score or 0.0, "env/answered": float(score is not None)}
        return end_episode(
            self.name,
            session,
            status,
            why,
            replies,
            level=session.item.level,
            success=score == 1.0,
            reward=score or 0.0,
            metrics=metrics,
        )


def _submitted(call: ToolCall) -> str | None:
    """The answer of a ``submit_answer`` call (a number is taken as its text), else None."""
    if call.name != "submit_answer":
        return None
    try:
        answer = json.loads(call.arguments).get("answer")
    except (ValueError, AttributeError):
        return None
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        return str(answer)
    return answer if isinstance(answer, str) else None


def _reply(call: ToolCall, text: str) -> ChatMessage:
    return ChatMessage("tool", text, tool_call_id=call.id, name=call.name)


def _submit(answer: str) -> ToolCall:
    return ToolCall(id="call_0", name="submit_answer", arguments=json.dumps({"answer": answer}))


def _oracle(env: ReasoningGymTask, index: int, rng: random.Random):
    """The entry's own answer, in the mode's form."""
    answer = env.item(index).entry["answer"]
    answer = "" if answer is None else str(answer)
    yield _submit(answer) if env.mode == "tool" else f"<answer>{answer}</answer>"


def _random(env: ReasoningGymTask, index: int, rng: random.Random):
    """Prose, or a random number as the answer: right now and then on small-number datasets."""
    while True:
        if rng.random() < 0.25:
            yield "I am not sure."
        else:
            guess = str(rng.randint(-20, 200))
            yield _submit(guess) if env.mode == "tool" else f"<answer>{guess}</answer>"


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
"""Scripted agents for agentrl-env check (--agent oracle|random), the demo option and SFT."""
