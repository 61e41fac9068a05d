"""Random tool calls against every AgentBench-style task: a Step or SessionClosed, nothing else.

The model's output reaches ``interact`` as parsed tool calls with arbitrary
JSON arguments (wrong types, nulls, nested values, huge or unencodable strings,
``#99999999999``). Whatever it sends, an episode either goes on, ends with a
status and a reward, or (after its end) raises SessionClosed; and ``cancel``
stays idempotent. The os task runs a few examples only (a bwrap sandbox per
example) and is skipped without bubblewrap and root.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.environments import make_task
from agentrl.environments._protocol import SessionClosed, Status, Step
from agentrl.messages import ChatMessage, ToolCall

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

_ODD = [
    "",
    " ",
    "#0",
    "#1",
    "#-1",
    "#99999999999",
    "#" + "9" * 5000,
    "²",
    "٣",
    "\x00",
    "a\x00b",
    "\ud800",
    "x" * 200_000,
    "NaN",
    "-1",
    "0",
]
_TEXT = st.one_of(
    st.sampled_from(_ODD),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=30),
)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
)
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _messages(tools: list[str], keys: list[str], vocab: list[str]) -> st.SearchStrategy:
    """Assistant messages: no call, or a few calls of known or unknown tools."""
    # Mostly well-named calls with every argument present, so episodes get past turn one.
    words, odd = st.sampled_from(vocab), st.sampled_from(_ODD)
    value = st.integers(0, 9).flatmap(
        lambda k: words if k < 6 else odd if k < 8 else _TEXT if k < 9 else _JSON
    )
    full = st.fixed_dictionaries({k: value for k in keys})
    loose = st.dictionaries(st.text(max_size=5), _JSON, max_size=2)
    args = st.integers(0, 9).flatmap(lambda k: full if k < 8 else loose)
    encoded = st.integers(0, 9).flatmap(
        lambda k: args.map(lambda a: json.dumps(a, ensure_ascii=False)) if k < 9 else _TEXT
    )
    call = st.tuples(st.sampled_from(tools * 4 + ["", "nope"]), encoded)
    content = st.one_of(
        _TEXT, st.sampled_from(["Final Answer: #0", "Final Answer: #" + "7" * 5000])
    )
    return st.builds(
        lambda text, calls: ChatMessage(
            "assistant",
            text,
            [ToolCall(f"call_{i}", name, a) for i, (name, a) in enumerate(calls)],
        ),
        content,
        st.lists(call, max_size=3),
    )


def _play(env, index: int, messages: list[ChatMessage]) -> None:
    start = env.start(index % env.num_instances)
    ended = False
    try:
        for message in messages:
            try:
                step = env.interact(start.session, message)
            except SessionClosed:
                assert ended, "SessionClosed before the episode ended"
                continue
            assert isinstance(step, Step)
            assert not ended, "a step after the end"
            assert step.finish == (step.status != Status.RUNNING)
            assert isinstance(step.reward, float) and 0.0 <= step.reward <= 1.0
            ended = step.finish
    finally:
        env.cancel(start.session)
        env.cancel(start.session)


def _vocab(env) -> tuple[list[str], list[str]]:
    tools = [t["function"]["name"] for t in env.tools]
    keys = sorted({k for t in env.tools for k in t["function"]["parameters"]["properties"]})
    return tools, keys


_FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None
)

_DB = make_task("db", statement_timeout=0.2)
_KG = make_task("kg")
_ALFWORLD = make_task("alfworld", num_instances=6)
_WEBSHOP = make_task("webshop")
_SQL = [
    "SELECT * FROM t",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "DROP TABLE t",
    "select 1; select 2",
]
_KG_WORDS = ["#0", "#1", "m.0abc1", "film.film.directed_by", "people.person.date_of_birth"]
_ALF_WORDS = ["look", "inventory", "go to countertop 1", "take apple 1 from countertop 1"]
_SHOP_WORDS = ["Buy Now", "Next >", "< Prev", "Back to Search", "Description", "coffee"]


@pytest.mark.parametrize(
    ("env", "words"),
    [(_DB, _SQL), (_KG, _KG_WORDS), (_ALFWORLD, _ALF_WORDS), (_WEBSHOP, _SHOP_WORDS)],
    ids=["db", "kg", "alfworld", "webshop"],
)
def test_random_tool_calls_give_steps_or_session_closed(env, words):
    tools, keys = _vocab(env)

    @_FAST
    @given(st.integers(0, 1000), st.lists(_messages(tools, keys, words), min_size=1, max_size=6))
    def play(index, messages):
        _play(env, index, messages)

    play()


@pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="os sessions here use the bwrap sandbox: needs bubblewrap and root",
)
def test_os_random_tool_calls_give_steps_or_session_closed():
    env = make_task("os", sandbox="bwrap", timeout=2.0, max_turns=3)
    tools, keys = _vocab(env)

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.integers(0, 1000),
        st.lists(_messages(tools, keys, ["echo hi", "cd /tmp", "0"]), min_size=1, max_size=3),
    )
    def play(index, messages):
        _play(env, index, messages)

    play()
