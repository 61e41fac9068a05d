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

``--real``: nothing simulated. SmolLM2-135M (``--model``), the TorchEngine sampler and the
torch learner, each role its own process on RabbitMQ (``--broker``), the sampler (with the
rollout and the controller) pinned to one core and the learner to another
(``cpu_affinity``), a multi-turn task mix (calculator level 1, db level 0), eta = 0 against
eta = 2 for the same number of updates. On separate cores, with sampling time S and
training time T per update, synchronous training costs S + T per update and the best
asynchronous schedule max(S, T): async can gain at most (S + T) / max(S, T). It prints
episodes/s of both (from the first update to the last: start-up excluded), their ratio,
S (the eta = 0 learner's wait for each batch) and T (its step + save), the bound and the
ratio as a fraction of it. With ``--smoke`` the real mode runs too, on the tiny model.

    python bench/async_vs_sync.py --real [--steps 6] [--model smollm2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

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


def run_real(eta: int, args, out_dir: Path, cores: tuple[int, int]) -> dict[str, float]:
    """One run of the real parts, every role a process (see the module doc)."""
    run = f"bench-real-eta{eta}-{uuid.uuid4().hex[:6]}"
    sampler_core, learner_core = cores
    raw = {
        "run": run,
        "broker": args.broker,
        "model": args.model,
        "output_dir": str(out_dir),
        "max_steps": args.steps,
        "seed": args.seed,
        "tasks": {
            "calculator": {"options": {"levels": [1]}},
            "db": {"options": {"levels": [0]}},
        },
        "rollout": {
            "group_size": args.group_size,
            "groups_per_batch": args.groups,
            "concurrency": args.group_size * args.groups,
            "max_tokens": 1536,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
        },
        "staleness": {"max": eta, "hard": eta + 8},
        "pools": {"current": {"max_batch": args.group_size * args.groups}},
        "learner": {"micro_batch_tokens": 2048},
        "cpu_affinity": {
            "controller": [sampler_core],
            "rollout": [sampler_core],
            "sampler": [sampler_core],
            "learner": [learner_core],
        },
    }
    config = out_dir / f"{run}.yaml"
    config.write_text(yaml.safe_dump(raw))
    argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
    argv += ["start", "--config", str(config)]
    argv += ["--roles", "controller,rollout,sampler,learner", "--progress-every", "3600"]
    with (out_dir / f"{run}.out").open("wb") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
    if code:
        tail = (out_dir / f"{run}.out").read_text(errors="replace")[-3000:]
        raise SystemExit(f"eta={eta}: the run exited {code}:\n{tail}")
    rows = [json.loads(x) for x in (out_dir / run / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:]  # the first update carries the start-up (model loads, first batch)
    wall = rows[-1]["time"] - rows[0]["time"]
    episodes = sum(m["rollout/episodes"] for m in later)
    return {
        "eta": eta,
        "episodes": episodes,
        "wall_s": wall,
        "episodes_per_s": episodes / wall,
        "train_s": sum(m["learner/step_time"] + m["learner/save_time"] for m in later) / len(later),
        "wait_s": sum(m["learner/idle_time"] for m in later) / len(later),
        "learner_idle_fraction": sum(m["learner/idle_time"] for m in later) / wall,
        "issue_lag_mean": sum(m["staleness/issue_lag_mean"] for m in later) / len(later),
    }


def real(args) -> None:
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise SystemExit("--real needs two cores (one for the sampler, one for the learner)")
    results = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-async-real-") as tmp:
        for eta in (0, 2):
            results[eta] = run_real(eta, args, Path(tmp), (usable[0], usable[1]))
    print(f"real: {args.model}, {args.steps} updates of {args.groups * args.group_size} episodes, "
          f"sampler on core {usable[0]}, learner on core {usable[1]}")  # fmt: skip
    for r in results.values():
        print(
            f"eta={r['eta']}: {r['episodes']:.0f} episodes in {r['wall_s']:.1f}s = "
            f"{r['episodes_per_s']:.3f} episodes/s, learner idle "
            f"{100 * r['learner_idle_fraction']:.0f}%, mean issue lag {r['issue_lag_mean']:.2f}"
        )
    ratio = results[2]["episodes_per_s"] / results[0]["episodes_per_s"]
    sample, train = results[0]["wait_s"], results[0]["train_s"]
    bound = (sample + train) / max(sample, train)
    print(f"ratio async/sync episodes/s: {ratio:.2f}x")
    print(f"per update (eta=0): sampling S = {sample:.1f} s, training T = {train:.1f} s")
    print(f"per update (eta=2): training {results[2]['train_s']:.1f} s (the sampler beside it "
          f"on the other core), waiting {results[2]['wait_s']:.1f} s")  # fmt: skip
    print(f"bound (S + T) / max(S, T) = {bound:.2f}x; ratio / bound = {100 * ratio / bound:.0f}%"
          " (goal >= 90%)")  # fmt: skip


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
    parser.add_argument("--real", action="store_true", help="the real parts (module doc)")
    parser.add_argument("--model", default="smollm2", help="--real: the policy model")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="--real: per turn")
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args()
    if args.real and not args.smoke:
        args.group_size, args.groups = 4, 2
        configure_logging("warning")
        return real(args)
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
    if args.smoke:  # the real mode too, on the tiny model: 3 updates of 4 episodes
        args.model, args.steps, args.max_new_tokens = "tiny", 3, 16
        real(args)


if __name__ == "__main__":
    main()
