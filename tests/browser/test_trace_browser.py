"""`agentrl trace` in a real browser: chromium --headless loads the pages of a small run
(`trace_run.build_run`: calculator episodes through the rollout's episode loop, written by
the learner's writer), its DOM is checked after the page's script ran, and a screenshot of
the side-by-side page is decoded and checked for the advantage colours in each column."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from agentrl.ops.trace import TraceServer, TraceSite
from agentrl.trainer import load_tokenizer, resolve_model
from tests.browser.conftest import run_chromium
from tests.browser.trace_run import HOSTILE, HOSTILE_VALUE, build_run

_VOID = {"br", "img", "input", "link", "meta", "hr", "source", "wbr"}


class Dom(HTMLParser):
    """The elements of a dumped DOM, each with its attributes and its text (entities decoded)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": []}
        self.elements.append(element)
        if tag not in _VOID:
            self._open.append(element)

    def handle_endtag(self, tag):
        while self._open and self._open.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for element in self._open:
            element["text"].append(data)

    def find(self, tag: str, cls: str | None = None, **attrs: str) -> list[dict]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag
            and (cls is None or cls in (e["attrs"].get("class") or "").split())
            and all(e["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def text(self, element: dict) -> str:
        return "".join(element["text"])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "demo"
    build_run(run_dir)
    trace = TraceServer(TraceSite(run_dir, load_tokenizer(resolve_model("tiny"))), "127.0.0.1", 0)
    trace.start()
    yield trace
    trace.close()


def dom(chromium: str, tmp_path: Path, url: str) -> Dom:
    page = Dom(run_chromium(chromium, tmp_path, "--dump-dom", url))
    (body,) = page.find("body")
    assert body["attrs"].get("data-script") == "ready", "the page's script did not run"
    return page


def rows(page: Dom) -> list[str]:
    return [e["attrs"]["data-episode"] for e in page.find("tr", "ep")]


def chosen(page: Dom, name: str) -> str | None:
    (select,) = page.find("select", name=name)
    index = page.elements.index(select)
    for e in page.elements[index + 1 :]:
        if e["tag"] == "select":
            break
        if e["tag"] == "option" and "selected" in e["attrs"]:
            return e["attrs"]["value"]
    return None


def test_the_list_filters_by_task_status_outcome_version_and_reward(chromium, server, tmp_path):
    url = f"{server.url}?task=calculator&outcome=trained&version=1&min_reward=0"
    page = dom(chromium, tmp_path, url)
    # v1's episodes without the two that paid the -0.2 penalty (a-1, b-3)
    assert rows(page) == ["a-0", "a-2", "a-3", "b-0", "b-1", "b-2"]
    assert (chosen(page, "task"), chosen(page, "outcome"), chosen(page, "version")) == (
        "calculator",
        "trained",
        "1",
    )
    (minimum,) = page.find("input", name="min_reward")
    assert minimum["attrs"]["value"] == "0.0"
    page = dom(chromium, tmp_path, f"{server.url}?outcome=dropped")
    assert rows(page) == ["e-0", "e-1", "e-2", "e-3"]
    assert {page.text(e) for e in page.find("span", "dropped")} == {"dropped: no_spread"}
    page = dom(chromium, tmp_path, f"{server.url}?status=agent_invalid_action&max_reward=0")
    assert rows(page) == ["a-1", "b-3"]
    page = dom(chromium, tmp_path, server.url)
    assert len(rows(page)) == 20 and rows(page)[0] == "c-0"  # newest version first


def test_an_episode_shows_its_turns_calls_results_versions_and_advantages(
    chromium, server, tmp_path
):
    page = dom(chromium, tmp_path, f"{server.url}episode?id=c-0")
    turns = page.find("section", "turn")
    assert len(turns) == 2
    headings = [page.text(e) for e in page.find("h4")]
    assert headings[0].startswith("turn 1 · sampled by v0 · pool stale")
    assert headings[1].startswith("turn 2 · sampled by v1 · pool current")
    calls = [page.text(e) for e in page.find("code")]
    assert calls[0].startswith('calculate({"expression": ') and calls[1].startswith("answer(")
    environment = [page.text(e) for e in page.find("details", "context")]
    assert "Now call answer with this result." in environment[1]  # the tool's reply
    tokens = page.find("span", "tok")
    sampled = [e for e in tokens if e["attrs"].get("title", "").startswith("advantage +")]
    # c-0 succeeded in a group with one failure: every sampled token has a positive advantage
    assert sampled and all(
        any(c.startswith("pos") for c in e["attrs"]["class"].split()) for e in sampled
    )
    first = page.find("pre", "sampled")[0]
    assert page.text(first).startswith("<tool_call>") and page.text(first).endswith("<|im_end|>")


def test_episode_text_is_shown_as_text_and_never_run(chromium, server, tmp_path):
    page = dom(chromium, tmp_path, f"{server.url}episode?id=b-3")
    (body,) = page.find("body")
    assert "data-pwned" not in body["attrs"]
    assert page.find("img") == []
    assert [e["attrs"].get("src") for e in page.find("script")] == ["/static/trace.js"]
    (turn,) = page.find("pre", "sampled")
    assert page.text(turn) == HOSTILE + "<|im_end|>"
    (call,) = page.find("code")
    assert page.text(call) == f"answer({json.dumps({'value': HOSTILE_VALUE})})"


def test_two_versions_side_by_side_in_a_screenshot(chromium, server, tmp_path):
    url = f"{server.url}?task=calculator&version=1&compare=2"
    page = dom(chromium, tmp_path, url)
    (left,) = page.find("div", "column", id="left")
    (right,) = page.find("div", "column", id="right")
    assert (left["attrs"]["data-version"], right["attrs"]["data-version"]) == ("1", "2")
    shown = [e["attrs"]["data-episode"] for e in page.find("article", "episode")]
    assert shown == ["a-0", "a-1", "a-2", "a-3", "b-0", "b-1",
                     "c-0", "c-1", "c-2", "c-3", "d-0", "d-1"]  # fmt: skip
    png = tmp_path / "compare.png"
    run_chromium(chromium, tmp_path, f"--screenshot={png}", "--window-size=1200,820", url)
    image = Image.open(png)
    assert image.format == "PNG" and image.size == (1200, 820)
    pixels = np.asarray(image.convert("RGB")).astype(int)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 200  # text, not a blank page
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    red = (r - np.maximum(g, b)) > 40  # the negative-advantage shades
    green = (g - np.maximum(r, b)) > 40  # the positive ones
    half = pixels.shape[1] // 2
    # v1 (left) opens with a-0, a wrong answer: red tokens; v2 (right) with c-0, a right one
    assert red[:, :half].sum() > 2000 and red[:, :half].sum() > 5 * green[:, :half].sum()
    assert green[:, half:].sum() > 2000 and green[:, half:].sum() > 5 * red[:, half:].sum()
