"""The trace viewer's HTML: the episode list with its filters, one episode, two versions.

Every string that comes from the run (episode text above all: model output, hostile by
assumption) goes through `esc`; the pages carry no inline script or style, so the
server's Content-Security-Policy (`server.py`) allows scripts and styles from
``/static/`` only. A sampled token's background is its advantage: green above zero, red
below, five shades each by magnitude (`advantage_class`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

from agentrl.actors._trace_store import EpisodeFilter, EpisodeSummary, EpisodeTrace

from .text import Piece, Turn

__all__ = ["ListView", "advantage_class", "compare_page", "episode_page", "error_page", "list_page"]

_SHADES = (0.25, 0.5, 1.0, 2.0)
"""Upper bounds of |advantage| for shades 1 to 4; above the last is shade 5."""


def esc(value: object) -> str:
    """``value`` as HTML text (quotes escaped too, so it is safe in attributes)."""
    return html.escape(str(value), quote=True)


def advantage_class(piece: Piece) -> str:
    """The CSS class of a sampled token: ``pos1..pos5`` / ``neg1..neg5`` by advantage,
    ``zero`` (a flat group), ``old`` (not trained: older than the lag bound), or
    ``dropped`` (its episode was never trained)."""
    if piece.advantage is None:
        return "dropped"
    if not piece.trained:
        return "old"
    a = piece.advantage
    if a == 0:
        return "zero"
    shade = next((i + 1 for i, bound in enumerate(_SHADES) if abs(a) <= bound), len(_SHADES) + 1)
    return f"{'pos' if a > 0 else 'neg'}{shade}"


@dataclass(frozen=True, slots=True)
class ListView:
    """What the list page shows: the filter, its page of episodes, the filter's options."""

    where: EpisodeFilter
    rows: list[EpisodeSummary]
    total: int
    offset: int
    limit: int
    facets: dict[str, list]
    compare: int | None = None
    """The version shown beside ``where.version`` (the side-by-side page)."""


def _shell(title: str, run: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} · {esc(run)}</title>"
        '<link rel=stylesheet href="/static/trace.css">'
        '<script src="/static/trace.js" defer></script></head>\n'
        f'<body><header><a href="/">agentrl trace</a> <span class=run>{esc(run)}</span></header>\n'
        f"<main>{body}</main></body></html>\n"
    )


def _query(where: EpisodeFilter, **extra: object) -> str:
    values = {
        "task": where.task,
        "group": where.group,
        "status": where.status,
        "outcome": where.outcome,
        "version": where.version,
        "min_reward": where.min_reward,
        "max_reward": where.max_reward,
        **extra,
    }
    return urlencode({k: v for k, v in values.items() if v is not None})


def _select(name: str, label: str, options: Sequence[object], chosen: object) -> str:
    items = ['<option value="">any</option>']
    for value in options:
        selected = " selected" if value == chosen else ""
        items.append(f'<option value="{esc(value)}"{selected}>{esc(value)}</option>')
    return f'<label>{esc(label)} <select name="{name}">{"".join(items)}</select></label>'


def _filters(view: ListView) -> str:
    w, f = view.where, view.facets

    def number(name: str, label: str, value: float | None) -> str:
        shown = "" if value is None else esc(value)
        return (
            f'<label>{label} <input name="{name}" type=number step=any size=6 '
            f'value="{shown}"></label>'
        )

    group = f'<input type=hidden name=group value="{esc(w.group)}">' if w.group else ""
    return (
        '<form id=filters method=get action="/">'
        + _select("task", "task", f["task"], w.task)
        + _select("status", "status", f["status"], w.status)
        + _select("outcome", "outcome", f["outcome"], w.outcome)
        + _select("version", "version", f["version"], w.version)
        + _select("compare", "beside version", f["version"], view.compare)
        + number("min_reward", "reward ≥", w.min_reward)
        + number("max_reward", "reward ≤", w.max_reward)
        + group
        + '<button type=submit>show</button> <a href="/">clear</a></form>'
    )


def _outcome(e: EpisodeSummary) -> str:
    if e.outcome == "trained":
        return '<span class="badge trained">trained</span>'
    return f'<span class="badge dropped">dropped: {esc(e.reason)}</span>'


def _sampled(e: EpisodeSummary) -> str:
    if e.min_sampled is None:
        return "&ndash;"
    if e.min_sampled == e.max_sampled:
        return f"v{e.min_sampled}"
    return f"v{e.min_sampled}&ndash;v{e.max_sampled}"


def list_page(run: str, view: ListView) -> str:
    """The episode table under the filters."""
    rows = []
    for e in view.rows:
        link = "/episode?" + urlencode({"id": e.episode_id})
        rows.append(
            f'<tr class="ep {esc(e.outcome)}" data-episode="{esc(e.episode_id)}">'
            f'<td><a href="{esc(link)}">{esc(e.episode_id)}</a></td>'
            f"<td>{esc(e.task)}</td><td>{e.index}</td><td>v{e.version}</td>"
            f"<td>{_outcome(e)}</td><td>{esc(e.status)}</td>"
            f"<td class=num>{e.reward:+.3f}</td><td class=num>{e.num_turns}</td>"
            f"<td class=num>{e.num_tokens}</td><td>{_sampled(e)}</td></tr>"
        )
    end = view.offset + len(view.rows)
    first = view.offset + 1 if view.rows else 0
    pages = f"<p class=count>episodes {first}&ndash;{end} of {view.total}"
    if view.offset > 0:
        back = _query(view.where, offset=max(0, view.offset - view.limit))
        pages += f' · <a href="/?{esc(back)}">previous</a>'
    if end < view.total:
        pages += f' · <a href="/?{esc(_query(view.where, offset=end))}">next</a>'
    table = (
        "<table id=episodes><thead><tr><th>episode</th><th>task</th><th>instance</th>"
        "<th>version</th><th>outcome</th><th>status</th><th>reward</th><th>turns</th>"
        "<th>tokens</th><th>sampled by</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    return _shell("episodes", run, _filters(view) + pages + "</p>" + table)


def _tokens(pieces: Sequence[Piece]) -> str:
    spans = []
    for p in pieces:
        if p.advantage is None:
            tip = f"v{p.version} · logprob {p.logprob:.3f} · not trained (dropped)"
        elif not p.trained:
            tip = f"v{p.version} · logprob {p.logprob:.3f} · not trained (older than the lag bound)"
        else:
            tip = f"advantage {p.advantage:+.3f} · v{p.version} · logprob {p.logprob:.3f}"
        spans.append(
            f'<span class="tok {advantage_class(p)}" title="{esc(tip)}">{esc(p.text)}</span>'
        )
    return "".join(spans)


def _turn(number: int, turn: Turn, *, first: bool) -> str:
    versions = ", ".join(f"v{v}" for v in turn.versions)
    pool = f" · pool {esc(turn.pool)}" if turn.pool is not None else ""
    label = "prompt" if first else "environment"
    context = esc(turn.context)
    read = (
        f"<details class=context{'' if first else ' open'}><summary>{label} "
        f"({turn.context_tokens} tokens)</summary><pre>{context}</pre></details>"
    )
    calls = "".join(f"<li><code>{esc(c.name)}({esc(c.arguments)})</code></li>" for c in turn.calls)
    if turn.malformed is not None:
        calls += f"<li class=malformed>malformed tool call: {esc(turn.malformed)}</li>"
    return (
        f'<section class=turn data-turn="{number}">{read}'
        f"<h4>turn {number} · sampled by {versions}{pool} · {len(turn.pieces)} spans</h4>"
        f"<pre class=sampled>{_tokens(turn.pieces)}</pre>"
        + (f"<ul class=calls>{calls}</ul>" if calls else "")
        + "</section>"
    )


def _episode(trace: EpisodeTrace, turns: list[Turn], tail: str) -> str:
    e = trace.summary
    facts = [
        ("task", f'<a href="/?{esc(urlencode({"task": e.task}))}">{esc(e.task)}</a>'),
        ("instance", str(e.index)),
        ("group", f'<a href="/?{esc(urlencode({"group": e.group_id}))}">{esc(e.group_id)}</a>'
                  f" (member {e.sample_idx})"),
        ("outcome", _outcome(e) + f" at v{e.version}"),
        ("status", esc(e.status)),
        ("reward", f"{e.reward:+.3f} (environment {e.env_reward:+.3f})"),
        ("issued at", f"v{e.issued_version}"),
        ("sampled by", _sampled(e)),
        ("tokens", f"{e.num_tokens} ({e.num_turns} turns)"),
    ]  # fmt: skip
    metrics = ", ".join(f"{esc(k)}={v:g}" for k, v in sorted(trace.metrics.items()))
    if metrics:
        facts.append(("metrics", metrics))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    body = "".join(_turn(i + 1, t, first=i == 0) for i, t in enumerate(turns))
    if tail:
        label = "after the last turn" if turns else "prompt (no sampled turn)"
        body += (
            f"<details class=context open><summary>{label}</summary>"
            f"<pre>{esc(tail)}</pre></details>"
        )
    return (
        f'<article class="episode {esc(e.outcome)}" data-episode="{esc(e.episode_id)}">'
        f"<h3>{esc(e.episode_id)}</h3><dl>{dl}</dl>{body}</article>"
    )


_LEGEND = (
    '<p class=legend>advantage: <span class="tok neg5">&minus;2</span>'
    '<span class="tok neg3">&minus;1</span>'
    '<span class="tok neg1">&minus;¼</span><span class="tok zero">0</span>'
    '<span class="tok pos1">+¼</span><span class="tok pos3">+1</span>'
    '<span class="tok pos5">+2</span> · <span class="tok old">not trained</span>'
    ' · <span class="tok dropped">dropped</span> · hover a token for its numbers</p>'
)


def episode_page(run: str, trace: EpisodeTrace, turns: list[Turn], tail: str) -> str:
    """One episode, every turn, its tokens coloured by advantage."""
    return _shell(trace.summary.episode_id, run, _LEGEND + _episode(trace, turns, tail))


def compare_page(
    run: str,
    view: ListView,
    left: list[tuple[EpisodeTrace, list[Turn], str]],
    right: list[tuple[EpisodeTrace, list[Turn], str]],
    totals: tuple[int, int],
) -> str:
    """Two versions side by side, each column the filter's episodes of its version."""
    columns = []
    for side, version, episodes, total in (
        ("left", view.where.version, left, totals[0]),
        ("right", view.compare, right, totals[1]),
    ):
        shown = "".join(_episode(*e) for e in episodes)
        columns.append(
            f'<div class=column id="{side}" data-version="{version}"><h2>v{version} '
            f"<small>{len(episodes)} of {total} episodes</small></h2>{shown}</div>"
        )
    body = _filters(view) + _LEGEND + f"<div class=compare>{''.join(columns)}</div>"
    return _shell(f"v{view.where.version} beside v{view.compare}", run, body)


def error_page(run: str, status: int, message: str) -> str:
    return _shell(f"error {status}", run, f"<p class=error>{esc(message)}</p>")
