"""BFCL tasks: ``bfcl`` (any category, for evaluation) and ``bfcl_multi_turn`` (training).

Each instance is one BFCL entry of the ``bfcl-eval`` package (`data`), played the way BFCL
plays an OpenAI-compatible function-calling model, and scored by BFCL's own checker.
Needs bfcl-eval (`_bfcl.INSTALL`); docs/tasks.md "bfcl" has the details and deviations.

**Tools.** Every entry has its own functions: `Start.tools` carries them, as BFCL's
``convert_to_tool`` writes them (OpenAI style, ``.`` in names written ``_``). There is no
system prompt but the entry's own (BFCL's function-calling mode adds none).

**Single-turn categories** (simple, multiple, parallel, ..., live, irrelevance): the entry's
question, one assistant message, then the end. Its calls, ``[{name: arguments}]``, go to
``ast_checker`` with the possible answer (AST categories); a message without a call, or
with arguments that are not a JSON object, fails to decode and is wrong, as in BFCL. The
relevance categories only ask whether the message holds a call (irrelevance: right when
it holds none). Reward 1.0 when BFCL's check passes, else 0.0; status ``completed``.

**Multi-turn categories.** BFCL's inference loop: the user turns of the entry in order;
within a turn, each assistant message with calls is a step whose calls run on BFCL's
executable backends (``execute_multi_turn_func_call``, one instance set per session) and
whose results come back as tool messages; a message without a call (or one that does not
decode) ends the turn and the next user turn follows. More than BFCL's
``MAXIMUM_STEP_LIMIT`` (20) steps in a turn force-quit the entry: ``task_limit_reached``,
reward 0. After the last turn, ``multi_turn_checker`` (and, for the categories with
turns that must not be answered with calls, ``multi_turn_irrelevance_checker``) judge the
decoded calls of every step: reward 1.0 when valid, status ``completed``.

- A call runs when BFCL would run it: a public method of the entry's backend classes,
  offered in the prompt or not (a ``miss_func`` function before its turn, as in BFCL).
  Any other name gets BFCL's execution error as its result (``Error during execution:
  name 'x' is not defined``) and is never evaluated; so does a call whose argument names
  are not Python identifiers. Calls are written for
  BFCL's backends as ``name(key=repr(value), ...)`` (BFCL's ``convert_to_function_call``)
  from JSON values, so no text of the model is evaluated as code.
- ``miss_func`` entries: at the held-out turn BFCL's function-calling mode recompiles the
  tools and asks "I have updated some more functions you can choose from. What about
  now?". agentrl's prompt shows the tools once, at its top, so the new functions come in
  that user message as their JSON schemas (BFCL's prompting mode does the same) and are
  callable from then on.

**Splits.** ``bfcl`` plays a whole category (BFCL's numbers are over every entry).
``bfcl_multi_turn`` plays one or more multi-turn categories split by a seeded hash of the
entry id (`tasks.toolkit.split`, 25 % test): train by default, so evaluation
(``split=test``) never sees a trained entry.

Metrics on the finishing step (`tasks.toolkit.episode.end_episode`): ``env/success``,
``env/turns`` (assistant messages), ``env/bad_calls`` (unknown functions, undecodable
arguments), ``env/level`` (always 0: BFCL has no levels), ``env/calls``,
``env/user_turns`` (user turns reached), ``env/force_quit``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.environments._protocol import SessionClosed, Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.environments.tasks.bfcl._bfcl import MODEL_NAME, load
from agentrl.environments.tasks.bfcl.agents import CHECK_AGENTS
from agentrl.environments.tasks.bfcl.data import (
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    Entry,
    backend_methods,
    entries,
    expand,
    language,
    to_tools,
)
from agentrl.environments.tasks.toolkit.episode import end_episode
from agentrl.environments.tasks.toolkit.split import check_split, split_items
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "BFCLTask", "bfcl", "bfcl_multi_turn"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def bfcl(*, category: str = "simple_python", step_limit: int | None = None) -> BFCLTask:
    """The ``bfcl`` task: every entry of one BFCL category (``bfcl:<category>`` in task
    lists); ``step_limit`` overrides BFCL's steps per user turn (multi-turn only)."""
    return BFCLTask(expand(category), split="all", step_limit=step_limit, name="bfcl")


bfcl.variant_option = "category"  # type: ignore[attr-defined]  # bfcl:<category>
bfcl.variants = expand  # type: ignore[attr-defined]  # bfcl:<collection> in task lists


def bfcl_multi_turn(
    *,
    categories: Sequence[str] = ("multi_turn_base",),
    split: str = "train",
    seed: int = 0,
    step_limit: int | None = None,
) -> BFCLTask:
    """The ``bfcl_multi_turn`` task: BFCL's multi-turn entries of ``categories`` on one side
    of a seeded train/test split of their ids."""
    if isinstance(categories, str):
        categories = (categories,)
    chosen = tuple(c for name in categories for c in expand(name))
    if not chosen or any(c not in MULTI_TURN_CATEGORIES for c in chosen):
        raise ValueError(
            f"bfcl_multi_turn: categories must be multi-turn ones "
            f"({', '.join(MULTI_TURN_CATEGORIES)}), got {list(categories)}"
        )
    return BFCLTask(chosen, split=split, seed=seed, step_limit=step_limit, name="bfcl_multi_turn")


@dataclass
class _Session:
    entry: Entry
    callable: set[str]
    """Names a call may run under: the tools offered so far and, multi-turn, every public
    method of the entry's backends (BFCL's executor runs those, offered or not)."""
    tag: str
    """This session's model name for BFCL's backends: its instances are its own."""
    turn: int = 0
    steps: int = 0
    """Steps in the current user turn."""
    decoded: list[list[list[str]]] = field(default_factory=list)
    """Per user turn, per step: the calls as BFCL's execution strings."""
    turns: int = 0
    calls: int = 0
    bad_calls: int = 0
    done: bool = False


class BFCLTask:
    """BFCL entries as an agentrl environment (module doc)."""

    instance_tools = True
    """Each instance has its own tools (`Start.tools`); demos are refused."""

    def __init__(
        self,
        categories: Sequence[str],
        *,
        split: str = "all",
        seed: int = 0,
        step_limit: int | None = None,
        name: str = "bfcl",
    ) -> None:
        self._bfcl = load()
        self._name = name
        check_split(split, name)
        if step_limit is not None and step_limit < 1:
            raise ValueError(f"{name}: step_limit must be >= 1")
        self._step_limit = step_limit or self._bfcl.default_prompts.MAXIMUM_STEP_LIMIT
        items = [e for c in categories for e in entries(c)]
        self._entries = split_items(items, [e.id for e in items], split, seed)
        if not self._entries:
            raise ValueError(f"{name}: no entries in {list(categories)} on split {split!r}")

    @property
    def tools(self) -> list[dict]:
        """No tools shared by every instance: each session's are in its `Start`."""
        return []

    @property
    def num_instances(self) -> int:
        return len(self._entries)

    def entry(self, index: int) -> Entry:
        if not 0 <= index < len(self._entries):
            raise IndexError(f"{self._name}: index {index} not in [0, {len(self._entries)})")
        return self._entries[index]

    def describe(self, index: int) -> str:
        return f"({self.entry(index).id})"

    # --- the episode ------------------------------------------------------------------

    def start(self, index: int) -> Start:
        entry = self.entry(index)
        tools = to_tools(entry.prompt.get("function", []))
        names = {t["function"]["name"] for t in tools}
        if entry.multi_turn:
            names |= backend_methods(tuple(entry.prompt["involved_classes"]))
        session = _Session(entry, names, f"{MODEL_NAME}_{uuid.uuid4().hex}")
        if entry.multi_turn:
            session.decoded.append([])
            self._execute(session, [])  # BFCL sets up the instances before the first turn
        return Start(session, self._messages(entry.prompt["question"][0]), tools)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        if session.done:
            raise SessionClosed(f"{self._name}: interact on a session that has ended")
        session.turns += 1
        calls = self._decode(session, message)
        if not session.entry.multi_turn:
            return self._judge_single(session, calls)
        if not calls:  # no call, or one that does not decode: the turn is over
            return self._next_turn(session)
        strings = [text for _, text in calls if text is not None]
        results = iter(self._execute(session, strings))
        replies = [
            tool_reply(call, next(results))
            if text is not None
            else tool_reply(call, f"Error during execution: name '{call.name}' is not defined")
            for call, text in calls
        ]
        session.decoded[-1].append(strings)
        session.steps += 1
        if session.steps > self._step_limit:
            return self._end(session, Status.TASK_LIMIT_REACHED, "force quit", replies)
        return Step(replies, Status.RUNNING, 0.0, False, {})

    def cancel(self, session: _Session) -> None:
        if not session.done:
            session.done = True
            self._release(session)

    # --- single turn ------------------------------------------------------------------

    def _judge_single(
        self, session: _Session, calls: list[tuple[ToolCall, str | None]] | None
    ) -> Step:
        entry = session.entry
        decoded = None if calls is None else [{c.name: call_arguments(c)} for c, _ in calls]
        if entry.category in RELEVANCE_CATEGORIES:
            has_call = bool(decoded)
            ok = not has_call if "irrelevance" in entry.category else has_call
            return self._end(session, Status.COMPLETED, "relevance", success=ok)
        if not decoded:  # BFCL's decode fails on a message without calls
            return self._end(session, Status.COMPLETED, "no call")
        result = self._bfcl.ast_checker.ast_checker(
            entry.checked["function"],
            decoded,
            entry.answer,
            language(entry.category),
            entry.category,
            MODEL_NAME,
        )
        why = "valid" if result["valid"] else str(result.get("error_type", "invalid"))
        return self._end(session, Status.COMPLETED, why, success=bool(result["valid"]))

    # --- multi turn -------------------------------------------------------------------

    def _next_turn(self, session: _Session) -> Step:
        entry = session.entry
        questions = entry.prompt["question"]
        session.turn += 1
        session.steps = 0
        if session.turn >= len(questions):
            return self._judge_multi(session)
        session.decoded.append([])
        messages = list(questions[session.turn])
        held_out = entry.prompt.get("missed_function", {}).get(str(session.turn))
        if held_out:
            new = to_tools(held_out)
            session.callable |= {t["function"]["name"] for t in new}
            ask = self._bfcl.default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
            schemas = "\n".join(json.dumps(t["function"]) for t in new)
            messages = [{"role": "user", "content": f"{schemas}\n{ask}"}]
        return Step(self._messages(messages), Status.RUNNING, 0.0, False, {})

    def _judge_multi(self, session: _Session) -> Step:
        entry = session.entry
        checker = self._bfcl.multi_turn_checker
        decoded = [[step for step in turn if step] for turn in session.decoded]
        result = {"valid": True}  # should a checker raise, the rollout's cancel releases
        if self._bfcl.utils.contain_multi_turn_irrelevance(entry.category):
            result = checker.multi_turn_irrelevance_checker(decoded, entry.answer)
        if result["valid"]:
            result = checker.multi_turn_checker(
                decoded, entry.answer, entry.checked, entry.category, session.tag
            )
        why = "valid" if result["valid"] else str(result.get("error_type", "invalid"))
        return self._end(session, Status.COMPLETED, why, success=bool(result["valid"]))

    def _execute(self, session: _Session, strings: list[str]) -> list[str]:
        entry = session.entry.prompt
        results, _ = self._bfcl.multi_turn_utils.execute_multi_turn_func_call(
            strings,
            entry.get("initial_config", {}),
            entry["involved_classes"],
            session.tag,
            entry["id"],
            long_context="long_context" in session.entry.category,
        )
        return list(results)

    def _release(self, session: _Session) -> None:
        """Drop the session's backend instances (BFCL keeps them in a module's globals, under
        names that start with the session's tag); single-turn sessions have none."""
        if not session.entry.multi_turn:
            return
        space = vars(self._bfcl.multi_turn_utils)
        for key in [k for k in list(space) if k.startswith(session.tag)]:
            space.pop(key, None)

    # --- shared -----------------------------------------------------------------------

    def _decode(
        self, session: _Session, message: ChatMessage
    ) -> list[tuple[ToolCall, str | None]] | None:
        """The message's calls, each with its BFCL execution string (None when it cannot
        run: an unknown function or argument names that are not identifiers); None when
        the message does not decode (no call, or arguments that are not an object)."""
        if not message.tool_calls:
            return None
        out: list[tuple[ToolCall, str | None]] = []
        for call in message.tool_calls:
            arguments = call_arguments(call)
            if arguments is None:
                session.bad_calls += 1
                return None
            session.calls += 1
            ok = call.name in session.callable and all(
                isinstance(k, str) and _IDENT.match(k) for k in arguments
            )
            if not ok:
                session.bad_calls += 1
            text = _call_string(call.name, arguments) if ok else None
            out.append((call, text))
        return out

    def _messages(self, raw: list[dict]) -> list[ChatMessage]:
        return [ChatMessage(role=m["role"], content=str(m["content"])) for m in raw]

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        success: bool = False,
    ) -> Step:
        self._release(session)
        metrics = {
            "env/calls": float(session.calls),
            "env/user_turns": float(session.turn + 1),
            "env/force_quit": float(why == "force quit"),
        }
        return end_episode(
            f"{self._name} {session.entry.id}",
            session,
            status,
            why,
            replies,
            level=0,
            success=success,
            metrics=metrics,
        )


def _call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as BFCL's ``convert_to_function_call`` writes it: ``name(k=repr(v),...)``."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"
