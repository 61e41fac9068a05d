"""A small run directory for the trace viewer: calculator episodes played by scripted policies
through the rollout's own episode loop, written by the learner's own writer.

Each episode is `play_episode` on the real calculator task with a `sample` that answers
from a script (the right call, a wrong answer, no call, hostile markup), so the token ids,
loss mask, versions, pools, rewards and statuses are the ones a run would hold; the
advantages come from `build_batch`, as the learner's update computes them.

    python -m tests.browser.trace_run --screenshot docs/trace.png   # the README's picture
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

from agentrl.actors._episode import EpisodeLimits, play_episode
from agentrl.actors._trace_store import TRACE_FILE, TraceWriter
from agentrl.environments import ChatFormat, make_task
from agentrl.environments._toolcalls import call_text
from agentrl.messages import EpisodeRequest, GenerateResult, Trajectory
from agentrl.trainer import build_batch, load_tokenizer, resolve_model

HOSTILE_VALUE = "<img src=x onerror=\"document.body.setAttribute('data-pwned', 'img')\">"
HOSTILE = '<script>document.body.setAttribute("data-pwned", "script")</script>' + call_text(
    "answer", {"value": HOSTILE_VALUE}
)
"""An assistant turn that would run script if the page inserted episode text as HTML: the
script is split over several tokens, the markup in the call's arguments shown whole."""


def _policy(name: str, expression: str, value: int) -> list[str]:
    """The turns a scripted policy writes for a problem."""
    calculate = call_text("calculate", {"expression": expression})
    return {
        "right": [calculate, call_text("answer", {"value": value})],
        "wrong": [calculate, call_text("answer", {"value": value + 10})],
        "guess": [call_text("answer", {"value": value + 1})],
        "chatty": [f"I think {expression} is about {value + 3}, no tool needed."],
        "hostile": [HOSTILE],
    }[name]


def play(
    tokenizer,
    fmt: ChatFormat,
    group: str,
    index: int,
    policies: list[str],
    *,
    issued: int,
    turn_versions: tuple[tuple[int, str], ...],
) -> list[Trajectory]:
    """One GRPO group on calculator instance ``index``; turn k is sampled by
    ``turn_versions[k]`` (version, pool), the last one repeating."""
    env = make_task("calculator")
    problem = env.problem(index)
    out = []
    for i, name in enumerate(policies):
        texts = _policy(name, problem.expression, problem.value)
        turn = itertools.count()

        def sample(ids, max_new, texts=texts, turn=turn):
            k = next(turn)
            version, pool = turn_versions[min(k, len(turn_versions) - 1)]
            tokens = [*tokenizer.encode(texts[k], add_special_tokens=False)]
            tokens.append(fmt.end_of_turn_ids[-1])
            logprobs = [-0.05 - 0.4 * ((t * 7919) % 13) / 13 for t in tokens]
            return pool, GenerateResult("r", tokens, logprobs, version, pool, "stop")

        req = EpisodeRequest(
            episode_id=f"{group}-{i}",
            task="calculator",
            index=index,
            group_id=group,
            sample_idx=i,
            group_size=len(policies),
            issued_version=issued,
        )
        out.append(play_episode(req, env, env.start(index), fmt, EpisodeLimits(), sample))
    return out


def build_run(run_dir: Path) -> Path:
    """Two updates and a dropped group in ``run_dir``; returns the store's path.

    v1 trains groups ``a`` (instance 0: mostly failures) and ``b`` (instance 1, with the
    hostile turn); v2 trains ``c`` (instance 0 again: mostly right, its first turns
    sampled by v0 in the stale pool) and ``d``; ``e`` (all right, no spread) is dropped.
    """
    model = resolve_model("tiny")
    tokenizer = load_tokenizer(model)
    fmt = ChatFormat(tokenizer)
    path = run_dir / TRACE_FILE
    writer = TraceWriter(path, tokenizer=str(model))
    v0 = ((0, "current"),)
    stale = ((0, "stale"), (1, "current"))
    updates = {
        1: [
            play(tokenizer, fmt, "a", 0, ["wrong", "chatty", "wrong", "right"], issued=0,
                 turn_versions=v0),
            play(tokenizer, fmt, "b", 1, ["guess", "right", "wrong", "hostile"], issued=0,
                 turn_versions=v0),
        ],
        2: [
            play(tokenizer, fmt, "c", 0, ["right", "right", "right", "wrong"], issued=1,
                 turn_versions=stale),
            play(tokenizer, fmt, "d", 2, ["right", "guess", "right", "right"], issued=1,
                 turn_versions=stale),
        ],
    }  # fmt: skip
    for version, groups in updates.items():
        batch = [t for group in groups for t in group]
        writer.trained(version, batch, build_batch(batch, pad_id=0, version=version - 1))
    flat = play(tokenizer, fmt, "e", 3, ["right"] * 4, issued=1, turn_versions=stale)
    writer.dropped(2, "no_spread", flat)
    writer.close()
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshot", required=True, help="PNG to write")
    parser.add_argument("--window", default="1200,760", help="width,height")
    args = parser.parse_args()
    from agentrl.ops import configure_logging
    from agentrl.ops.trace import TraceServer, TraceSite
    from tests.browser.conftest import find_chromium, run_chromium

    configure_logging("warning")
    browser = find_chromium()
    if browser is None:
        print("no chromium on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "runs" / "demo"
        build_run(run_dir)
        site = TraceSite(run_dir, load_tokenizer(resolve_model("tiny")))
        site.name = "runs/demo"
        server = TraceServer(site, "127.0.0.1", 0)
        server.start()
        try:
            url = f"{server.url}?task=calculator&version=1&compare=2"
            run_chromium(browser, Path(tmp), f"--screenshot={args.screenshot}",
                         f"--window-size={args.window}", url)  # fmt: skip
        finally:
            server.close()
    from PIL import Image

    shot = Image.open(args.screenshot).convert("RGB")  # 128 colours: a third of the bytes
    shot.quantize(128, Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
        args.screenshot, optimize=True
    )
    print(args.screenshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
