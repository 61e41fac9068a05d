"""Asynchronous (eta = 2) against synchronous (eta = 0) training on the same workload.

Everything is real except the two expensive parts, which are simulated with
measured-looking costs so the scheduling effect is visible on a 2-core machine:

- sampler: a ScriptedEngine whose requests take `--ms-per-token` per sampled
  token (default 8 ms, i.e. ~125 tok/s per sequence, with unlimited batching as
  on a GPU); each turn samples a log-normal number of tokens (median 40, sigma 1)
- episodes: the `latency` task below ends after a heavy-tailed number of turns
  (1 + Pareto(alpha=1.2), capped at 8), so a few episodes are much longer than
  the rest, as with real agent tasks
- learner: a FakeBackend whose update takes `--step-time` seconds (default 2 s)

Controller, rollout, sampler and learner actors, the in-process broker, the
staleness window, group assembly and checkpoint fan-out are the real ones.

    python bench/async_vs_sync.py            # prints episodes/s for each, the ratio, idle fractions
    python bench/async_vs_sync.py --smoke    # 2 steps of 2 groups, 0.1 s per step: seconds (CI)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

from agentrl.actors._fakes import FakeBackend, ScriptedEngine
from agentrl.environments import Start, Status, Step, register_task
from agentrl.messages import ChatMessage
from agentrl.ops import Supervisor, configure_logging, parse_config
from agentrl.trainer import load_tokenizer, resolve_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "step",
            "description": "Take one step.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


class LatencyTask:
    """An environment whose episodes last a heavy-tailed number of turns."""

    tools = TOOLS
    num_instances = 100_000

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed

    def start(self, index: int) -> Start:
        rng = random.Random(f"{self._seed}:{index}")
        turns = 1 + min(int(rng.paretovariate(1.2)) - 1, 7)
        session = {"left": turns, "rng": random.Random(f"{self._seed}:{index}:r")}
        return Start(session, [ChatMessage("user", f"Take {turns} steps.")])

    def interact(self, session, message: ChatMessage) -> Step:
        session["left"] -= 1
        if session["left"] <= 0:
            reward = float(session["rng"].random() < 0.5)
            return Step([], Status.COMPLETED, reward, True, {})
        reply = ChatMessage("tool", "ok", tool_call_id="call_0", name="step")
        return Step([reply], Status.RUNNING, 0.0, False, {})

    def cancel(self, session) -> None:
        session["left"] = 0


def make_engine_factory(tokenizer, ms_per_token: float, seed: int):
    call = tokenizer.encode('<tool_call>{"name": "step", "arguments": {}}</tool_call>')
    filler = tokenizer.encode(" thinking")[0]
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)

    def respond(prompt_ids, version):
        n = max(0, min(int(rng.lognormvariate(math.log(40), 1.0)), 200) - len(call))
        return [filler] * n + call + [eot]

    def factory(weights, version, max_batch):
        return ScriptedEngine(
            respond, latency=lambda n: n * ms_per_token / 1000, concurrency=256, version=version
        )

    return factory


def run_once(eta: int, args, tokenizer, out_dir: Path) -> dict[str, float]:
    cfg = parse_config(
        {
            "run": f"bench-eta{eta}",
            "broker": f"memory://bench-eta{eta}",
            "model": "tiny",
            "output_dir": str(out_dir),
            "max_steps": args.steps,
            "tasks": {"latency": {}},
            "rollout": {
                "group_size": args.group_size,
                "groups_per_batch": args.groups,
                "concurrency": 256,
                "max_turns": 8,
                "max_tokens": 8192,
                "max_new_tokens": 256,
            },
            "staleness": {"max": eta, "hard": max(eta, 1) + 8},
            "pools": {"current": {"max_batch": 256}},
            "learner": {"micro_batch_tokens": 8192},
        }
    )
    backend = FakeBackend(step_time=args.step_time)
    sup = Supervisor(
        cfg,
        make_engine=make_engine_factory(tokenizer, args.ms_per_token, args.seed),
        make_backend=lambda weights, version: backend,
    )
    start = time.monotonic()
    code = sup.run(progress_every=3600, install_signals=False)
    wall = time.monotonic() - start
    if code:
        raise SystemExit(f"eta={eta}: the run failed")
    lines = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = sum(m["rollout/episodes"] for m in lines)
    idle = sum(m["learner/idle_time"] for m in lines)
    return {
        "eta": eta,
        "episodes": episodes,
        "wall_s": wall,
        "episodes_per_s": episodes / wall,
        "learner_idle_fraction": idle / wall,
        "issue_lag_mean": sum(m["staleness/issue_lag_mean"] for m in lines) / len(lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4, help="groups per batch")
    parser.add_argument("--step-time", type=float, default=2.0)
    parser.add_argument("--ms-per-token", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes (2 steps, 0.1 s each): checks it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.groups, args.group_size, args.step_time = 2, 2, 2, 0.1
    configure_logging("warning")
    register_task("latency", LatencyTask, replace=True)
    tokenizer = load_tokenizer(resolve_model("tiny"))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for eta in (0, 2):
            results[eta] = run_once(eta, args, tokenizer, Path(tmp))
    for r in results.values():
        print(
            f"eta={r['eta']}: {r['episodes']:.0f} episodes in {r['wall_s']:.1f}s = "
            f"{r['episodes_per_s']:.2f} episodes/s, "
            f"learner idle {100 * r['learner_idle_fraction']:.0f}%, "
            f"mean issue lag {r['issue_lag_mean']:.2f} versions"
        )
    ratio = results[2]["episodes_per_s"] / results[0]["episodes_per_s"]
    print(f"ratio async/sync episodes/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
