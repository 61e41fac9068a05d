"""The trace viewer without a browser: tokens back into turns, the query's filters, the
pages' answers and refusals, the server's headers and Host check, `agentrl trace`'s errors.
(tests/browser drives the same pages in chromium.)"""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import pytest

from agentrl.actors._trace_store import TRACE_FILE, TraceError, TraceReader, TraceWriter
from agentrl.environments import ChatFormat
from agentrl.ops.cli.agentrl import main
from agentrl.ops.trace import TraceServer, TraceSite, find_tokenizer
from agentrl.ops.trace.page import advantage_class
from agentrl.ops.trace.server import BadQuery, parse_query
from agentrl.ops.trace.text import Piece, episode_turns
from agentrl.trainer import build_batch
from tests.browser.trace_run import play

STALE = ((0, "stale"), (1, "current"))


@pytest.fixture
def run_dir(tmp_path, smollm_tokenizer) -> Path:
    """v1: one calculator group (right, wrong); its first turns by v0 (stale), then v1."""
    fmt = ChatFormat(smollm_tokenizer)
    batch = play(smollm_tokenizer, fmt, "g", 0, ["right", "wrong"], issued=0, turn_versions=STALE)
    writer = TraceWriter(tmp_path / TRACE_FILE, tokenizer=str(tmp_path / "gone"))
    writer.trained(1, batch, build_batch(batch, pad_id=0))
    writer.close()
    return tmp_path


def test_an_episode_splits_into_its_sampled_turns_with_what_the_model_read(
    run_dir, smollm_tokenizer
):
    trace = TraceReader(run_dir / TRACE_FILE).episode("g-0")
    assert trace is not None
    turns, tail = episode_turns(trace, smollm_tokenizer, ChatFormat(smollm_tokenizer))
    assert tail == ""  # the episode ended with the answer turn
    assert [(t.versions, t.pool) for t in turns] == [([0], "stale"), ([1], "current")]
    assert [c.name for t in turns for c in t.calls] == ["calculate", "answer"]
    assert turns[0].context.startswith("<|im_start|>system")  # the prompt
    assert "Now call answer with this result." in turns[1].context  # the tool's reply
    sampled = [i for i, m in zip(trace.token_ids, trace.loss_mask, strict=True) if m]
    shown = "".join(p.text for t in turns for p in t.pieces)
    assert shown == smollm_tokenizer.decode(sampled)
    assert all(p.trained and p.advantage > 0 for t in turns for p in t.pieces)  # the right one


def test_a_character_split_over_tokens_is_one_span_and_unmatched_pools_are_unknown(
    run_dir, smollm_tokenizer
):
    trace = TraceReader(run_dir / TRACE_FILE).episode("g-0")
    assert trace is not None
    word = smollm_tokenizer.encode(" 🧮 = 4", add_special_tokens=False)
    assert smollm_tokenizer.decode(word[:1]) == " \ufffd"  # the abacus is 3 byte tokens
    ids = [*trace.token_ids[:3], *word]
    mask, n = [0, 0, 0, *[1] * len(word)], len(word)
    changed = type(trace)(
        summary=trace.summary,
        token_ids=ids,
        loss_mask=mask,
        versions=[-1, -1, -1, *[2] * n],
        logprobs=[0.0, 0.0, 0.0, *[-0.5] * n],
        advantages=[0.0, 0.0, 0.0, *[-1.0] * n],
        trained=mask,
        pools=["current", "stale"],  # two pools, one sampled run: no match
        metrics={},
        timings={},
    )
    (turn,), _ = episode_turns(changed, smollm_tokenizer, ChatFormat(smollm_tokenizer))
    assert turn.pieces[0].text == " 🧮" and len(turn.pieces) == n - 2
    assert "".join(p.text for p in turn.pieces) == " 🧮 = 4"
    assert turn.pool is None and turn.versions == [2]
    assert sum(p.logprob for p in turn.pieces) == pytest.approx(-0.5 * n)


@pytest.mark.parametrize(
    ("advantage", "trained", "expected"),
    [
        (None, False, "dropped"),
        (0.7, False, "old"),
        (0.0, True, "zero"),
        (0.25, True, "pos1"),
        (0.26, True, "pos2"),
        (-1.0, True, "neg3"),
        (-1.5, True, "neg4"),
        (2.5, True, "pos5"),
    ],
)
def test_a_token_is_shaded_by_its_advantage(advantage, trained, expected):
    piece = Piece("x", advantage=advantage, trained=trained, logprob=0.0, version=0)
    assert advantage_class(piece) == expected


def test_the_query_becomes_a_filter_and_a_bad_one_is_refused():
    where, compare, offset, limit = parse_query(
        "task=calculator&status=&version=3&compare=5&min_reward=-0.2&offset=10"
    )
    assert (where.task, where.status, where.version, where.min_reward) == (
        "calculator",
        None,  # empty: any
        3,
        -0.2,
    )
    assert (compare, offset, limit) == (5, 10, None)
    for query, message in (
        ("version=x", "version: not an integer"),
        ("max_reward=nan", "max_reward: not a finite number"),
        ("min_reward=abc", "min_reward: not a number"),
        ("compare=2", "a version beside which"),
        ("limit=0", "limit in"),
        ("offset=-1", "offset must be"),
    ):
        with pytest.raises(BadQuery, match=message):
            parse_query(query)


def test_the_tokenizer_is_the_recorded_one_else_the_newest_checkpoints(tmp_path):
    assert find_tokenizer(tmp_path, str(tmp_path)) == str(tmp_path)
    with pytest.raises(TraceError, match="pass --tokenizer"):
        find_tokenizer(tmp_path, str(tmp_path / "gone"))
    for version in (1, 2):
        ckpt = tmp_path / "checkpoints" / f"v{version:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "tokenizer_config.json").write_text("{}")
    assert find_tokenizer(tmp_path, None) == str(tmp_path / "checkpoints" / "v000002")


def test_the_site_answers_pages_and_refuses_what_is_not_there(run_dir, smollm_tokenizer):
    site = TraceSite(run_dir, smollm_tokenizer)
    status, kind, body = site.respond("/", "task=calculator")
    assert status == 200 and kind.startswith("text/html")
    assert b'data-episode="g-0"' in body and b'data-episode="g-1"' in body
    assert site.respond("/episode", "id=g-1")[0] == 200
    status, _, body = site.respond("/", "version=1&compare=1")
    assert status == 200 and body.count(b"<article") == 4  # both members, on both sides
    assert site.respond("/episode", "id=nope")[0] == 404
    assert site.respond("/", "version=x")[0] == 400
    assert site.respond("/admin", "")[0] == 404
    assert site.respond("/static/trace.js", "")[:2] == (200, "text/javascript; charset=utf-8")
    for path in ("/static/../server.py", "/static/nope.css", "/static/trace.py"):
        assert site.respond(path, "")[0] == 404, path


def _get(port: int, path: str, host: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True)
    conn.putheader("Host", host)
    conn.endheaders()
    return conn.getresponse()


def test_the_server_sends_a_strict_policy_and_answers_only_its_own_host(run_dir, smollm_tokenizer):
    server = TraceServer(TraceSite(run_dir, smollm_tokenizer), "127.0.0.1", 0)
    server.start()
    try:
        ok = _get(server.port, "/", f"127.0.0.1:{server.port}")
        assert ok.status == 200
        policy = ok.getheader("Content-Security-Policy")
        assert "script-src 'self'" in policy and "default-src 'none'" in policy
        assert ok.getheader("X-Content-Type-Options") == "nosniff"
        assert _get(server.port, "/", f"localhost:{server.port}").status == 200
        assert _get(server.port, "/", "evil.example:80").status == 400  # DNS rebinding
    finally:
        server.close()


def test_agentrl_trace_refuses_a_run_without_a_store_or_a_port_in_use(
    run_dir, tmp_path_factory, smollm_tokenizer, capsys
):
    empty = tmp_path_factory.mktemp("empty")
    assert main(["trace", "--run-dir", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trace.sqlite does not exist" in err
    # the recorded tokenizer is gone and no checkpoint holds one
    assert main(["trace", "--run-dir", str(run_dir)]) == 2
    assert "pass --tokenizer" in capsys.readouterr().err
    smollm_tokenizer.save_pretrained(run_dir / "tok")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["trace", "--run-dir", str(run_dir), "--tokenizer", str(run_dir / "tok")]
        assert main([*argv, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err
