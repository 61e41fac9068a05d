"""Learning benchmark: does the policy get better on held-out instances, per arm, per task?

    python bench/learning.py --minutes 40 [--sft-steps 20]          # the three arms in turn
    python bench/learning.py --arm full --minutes 40                # one arm (one session each)
    python bench/learning.py --report                               # table + learning.png
    python bench/learning.py --bfcl-only --bfcl simple_python,multiple  # BFCL of the arms' runs
    python bench/learning.py --smoke                                # tiny model, 2 steps (CI)

Three arms with the same base config (bench/learning.yaml), budget and seed:
``full`` (task advantage normalization + cross-policy sampling, a ``current`` and a
``stale`` pool), ``no-task-norm`` (``learner.task_normalize: false``) and
``no-cross-policy`` (the ``current`` pool alone). Per arm:

1. optional supervised warm start, ``agentrl sft --steps N`` (its time stated apart); the
   arms after the first copy the first arm's (``--warm-start-from``), so all start RL from
   the same weights and the same before-RL evaluation;
2. ``agentrl eval`` of the test split of every task on the starting weights (the base
   model or the warm-start checkpoint): "before";
3. RL: ``agentrl-supervisor start`` in a subprocess, stopped by SIGTERM (it drains) when
   ``--minutes`` of wall clock have passed; every ``--eval-every``-th checkpoint and the
   last few are kept, the others deleted as the run goes (a SmolLM2 checkpoint is 540 MB);
4. ``agentrl eval`` of the kept intermediate checkpoints and of the last one: "after".

Held-out generalisation (``--bfcl CATEGORIES``, needs bfcl-eval, docs/tasks.md "BFCL"):
BFCL, never trained on, is evaluated through ``agentrl eval`` on the model as shipped,
before RL and after RL: the first ``--bfcl-episodes`` entries of each category, greedy, in
an 8,192-token context. ``--bfcl-only`` does that for arms already run (their checkpoints
still on disk under ``--work``) and adds it to their results files.

Each arm writes ``<results>/learning-<arm>.json``: the command line, the arm's config,
the seeds, per-task pass rate per evaluated learner version, the training success per
update (metrics.jsonl) and the wall-clock times; and ``<results>/metrics-<arm>.jsonl``, the
run's metrics.jsonl as it is (every update's metrics). ``--report`` reads those files.
Evaluation runs in this process through the CLI's own entry point (``agentrl eval``),
after the supervisor has exited, so it never competes with training for the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from learning_report import write_report  # noqa: E402

ARMS: dict[str, dict[str, Any]] = {
    "full": {},
    "no-task-norm": {"learner": {"task_normalize": False}},
    "no-cross-policy": {"pools": {"current": {"weight": 1.0, "every": 1}}},
}
"""Each arm's override of the base config; a mapping replaces ``pools`` whole (see derive)."""

KEEP_LAST = 4
"""Newest checkpoints never pruned during a run (the stale pool lags by up to every + eta)."""

SMOKE: dict[str, Any] = {
    "model": "tiny",
    "rollout": {
        "group_size": 2,
        "groups_per_batch": 2,
        "concurrency": 4,
        "max_turns": 5,  # a level-0 oracle's calls (webshop: search, click, buy) fit
        "max_new_tokens": 96,  # webshop's exact-title calls fit (agentrl sft skips longer)
    },
    "pools": {"current": {"max_batch": 4}, "stale": {"max_batch": 4}},
    "learner": {"gradient_checkpointing": False},
}
"""Merged into the base config by --smoke: the tiny random model, small batches."""


def derive(base: dict[str, Any], arm: str, *, run_root: Path, seed: int) -> dict[str, Any]:
    """The arm's config: the base with the arm's override; the run named and placed."""
    cfg = _merge(base, {k: v for k, v in ARMS[arm].items() if k != "pools"})
    if "pools" in ARMS[arm]:  # a pool left out must go, so pools are replaced, not merged
        cfg["pools"] = {
            name: {**base["pools"].get(name, {}), **pool}
            for name, pool in ARMS[arm]["pools"].items()
        }
    name = f"learning-{arm}"
    cfg.update(run=name, broker=f"memory://{name}", output_dir=str(run_root), seed=seed)
    cfg.setdefault("learner", {})["keep_checkpoints"] = 0  # the bench prunes (prune_checkpoints)
    return cfg


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def eval_tasks(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each registered task of the config with the options evaluated: its test split.

    Entries building the same task (``db0: {task: db, ...}`` beside ``db``) are one task
    here: the first entry's options, the union of their ``levels`` in order of appearance.
    """
    tasks: dict[str, dict[str, Any]] = {}
    for key, entry in cfg["tasks"].items():
        entry = entry or {}
        options = dict(entry.get("options") or {})
        name = entry.get("task") or key
        if name not in tasks:
            tasks[name] = {**options, "split": "test"}
        elif "levels" in options:
            levels = tasks[name].setdefault("levels", [])
            levels.extend(lv for lv in options["levels"] if lv not in levels)
    return tasks


def checkpoints(run_dir: Path) -> dict[int, Path]:
    """Complete checkpoints (with a DIGEST) by version."""
    return {
        int(p.name[1:]): p
        for p in (run_dir / "checkpoints").glob("v[0-9]*")
        if p.is_dir() and (p / "DIGEST").exists()
    }


def prune_checkpoints(run_dir: Path, keep: set[int], eval_every: int) -> None:
    """Delete checkpoints that are neither kept, nor among the last KEEP_LAST, nor on the grid."""
    versions = sorted(checkpoints(run_dir))
    recent = set(versions[-KEEP_LAST:])
    for v in versions:
        if v not in keep and v not in recent and not (eval_every and v % eval_every == 0):
            shutil.rmtree(run_dir / "checkpoints" / f"v{v:06d}", ignore_errors=True)


def evaluate(
    cfg: dict[str, Any], weights: str, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """``agentrl eval`` (`agentrl`) of every task's test split."""
    tasks = eval_tasks(cfg)
    rollout = cfg.get("rollout", {})
    argv = ["eval", "--checkpoint", weights, "--tasks", ",".join(tasks)]
    argv += ["--episodes", str(args.eval_episodes), "--runs", str(args.eval_runs)]
    for name, count in test_instances(tasks).items():  # every instance where there are fewer
        if count < args.eval_episodes:
            argv += ["--task-episodes", f"{name}={count}"]
    argv += ["--seed", str(args.seed), "--out", str(out)]
    for flag, key in (("--temperature", "temperature"), ("--max-turns", "max_turns"),
                      ("--max-tokens", "max_tokens"), ("--max-new-tokens", "max_new_tokens"),
                      ("--concurrency", "concurrency")):  # fmt: skip
        if rollout.get(key) is not None:
            argv += [flag, str(rollout[key])]
    for name, options in tasks.items():
        for key, value in options.items():
            argv += ["--task-option", f"{name}.{key}={json.dumps(value)}"]
    start = time.monotonic()
    agentrl(argv)
    report = json.loads(out.with_suffix(".json").read_text())
    return summary(report, weights, time.monotonic() - start, ["agentrl", *argv])


def test_instances(tasks: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Instances of each task's test split (as `agentrl eval` builds it)."""
    from agentrl.environments import make_task
    from agentrl.ops.eval.evaluate import with_split

    options, _ = with_split(tasks)
    return {name: make_task(name, **opts).num_instances for name, opts in options.items()}


OUTCOME_KEYS = ("task", "options", "runs", "episodes", "solved_per_instance")
"""What an arm keeps of each task's eval result: enough for `agentrl compare`'s paired
comparison of any two evaluations (`ops.eval.compare.compare_reports`)."""


def summary(report: dict, checkpoint: str, seconds: float, argv: list[str]) -> dict[str, Any]:
    """What an arm keeps of an ``agentrl eval --out`` report."""
    tasks = report["tasks"].items()
    return {
        "outcomes": {"tasks": {t: {k: r[k] for k in OUTCOME_KEYS if k in r} for t, r in tasks}},
        "checkpoint": checkpoint,
        "seconds": seconds,
        "argv": argv,
        "pass_rate": {t: r["pass_rate_mean"] for t, r in tasks},
        "pass_rate_std": {t: r["pass_rate_std"] for t, r in tasks},
        "reward": {t: r["reward_mean"] for t, r in tasks},
        "statuses": {t: r["statuses"] for t, r in tasks},
    }


def reuse_evaluation(path: Path, model: str) -> dict[str, Any]:
    """A base evaluation written earlier by ``agentrl eval --out`` (its JSON), in the form
    `evaluate` returns; the base model is the same for every arm, so one run serves all."""
    from agentrl.trainer import resolve_model

    report = json.loads(Path(path).read_text())
    if report.get("checkpoint") not in (model, str(resolve_model(model))):
        raise SystemExit(f"{path} evaluated {report.get('checkpoint')!r}, not {model!r}")
    return summary(report, model, report.get("seconds", 0.0), ["reused", str(path)])


SFT_SECONDS = "sft-seconds.json"
"""The warm start's wall-clock seconds, written by its arm into the run directory beside
``sft.json`` (which is `agentrl sft`'s record), so a reuse reports what it cost."""


def warm_start_seconds(
    source: Path, record: dict[str, Any], args: argparse.Namespace
) -> float | None:
    """The seconds of the warm start in ``source`` (`reuse_warm_start`), the first known of:
    the measure its arm wrote beside it (`SFT_SECONDS`); the source arm's results file
    (``<results>/<source dir name>.json``), unless that reused a warm start itself; the time
    from the source's config file to its SFT record less its base evaluation; None where
    none is known (a config written, or copied, after the SFT)."""
    if (source / SFT_SECONDS).exists():
        return float(json.loads((source / SFT_SECONDS).read_text())["seconds"])
    made = Path(args.results) / f"{source.name}.json" if args.results else None
    if made is not None and made.exists():
        earlier_sft = json.loads(made.read_text()).get("sft", {})
        if (
            earlier_sft.get("version") == int(record["version"])
            and "reused_from" not in earlier_sft
        ):
            return float(earlier_sft["seconds"])
    seconds = record["created_at"] - source.with_suffix(".yaml").stat().st_mtime
    base_eval = source / "eval-base.json"  # the source arm evaluated the base model first
    if base_eval.exists():
        seconds -= json.loads(base_eval.read_text()).get("seconds", 0.0)
    return seconds if seconds > 0 else None


def reuse_warm_start(
    source: Path, run_dir: Path, cfg: dict[str, Any], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The warm start of an earlier arm's run directory ``source``, copied into ``run_dir``
    (its checkpoint, SFT record and KL reference), so every arm starts RL from the same
    weights; with its before-RL evaluation when that used the same settings, else None.

    The warm start must have been made for the same model and tasks with ``--sft-steps``
    and ``--sft-lr`` as given now. Its seconds: `warm_start_seconds`."""
    source = Path(source)
    earlier = yaml.safe_load(source.with_suffix(".yaml").read_text())
    for key in ("model", "tasks"):
        if earlier.get(key) != cfg.get(key):
            raise SystemExit(f"{source}: its {key} differ from this arm's; cannot reuse it")
    record = json.loads((source / "sft.json").read_text())
    version = int(record["version"])
    steps = sum(1 for line in (source / "sft.jsonl").read_text().splitlines() if line.strip())
    if steps != args.sft_steps:
        raise SystemExit(f"{source}: {steps} SFT steps, not --sft-steps {args.sft_steps}")
    for name in (f"checkpoints/v{version:06d}", "sft_reference"):
        shutil.copytree(source / name, run_dir / name)
    for name in ("sft.json", "sft.jsonl", SFT_SECONDS):
        if (source / name).exists():
            shutil.copy2(source / name, run_dir / name)
    seconds = warm_start_seconds(source, record, args)
    sft = {"steps": steps, "seconds": seconds, "version": version, "lr": args.sft_lr}
    sft["reused_from"] = str(source)
    report_path = source / f"eval-v{version:06d}.json"
    if not report_path.exists():
        return sft, None
    report = json.loads(report_path.read_text())
    rollout = cfg.get("rollout", {})
    same = (report.get("episodes"), report.get("runs"), report.get("seed")) == (
        args.eval_episodes,
        args.eval_runs,
        args.seed,
    ) and all(report.get(k) == rollout.get(k) for k in ("max_tokens", "max_new_tokens"))
    if not same:
        return sft, None
    shutil.copy2(report_path, run_dir / report_path.name)
    shutil.copy2(report_path.with_suffix(".md"), run_dir / report_path.with_suffix(".md").name)
    weights = str(run_dir / f"checkpoints/v{version:06d}")
    return sft, summary(report, weights, report.get("seconds", 0.0), ["reused", str(report_path)])


BFCL_MAX_TOKENS = 8192
"""Context of a BFCL evaluation: multi-turn entries carry ~6,000 tokens of tool schemas."""


def evaluate_bfcl(weights: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``agentrl eval`` of the ``--bfcl`` categories (``bfcl:<category>``), greedy: accuracy
    and entries run per category, BFCL's checker's verdicts as the pass rate."""

    items = [c.strip().partition("=") for c in args.bfcl.split(",") if c.strip()]
    argv = ["eval", "--checkpoint", weights, "--tasks", ",".join(f"bfcl:{c}" for c, _, _ in items)]
    argv += ["--episodes", str(args.bfcl_episodes or "all"), "--runs", "1", "--temperature", "0"]
    for category, _, n in items:  # CATEGORY=N: its first N entries instead
        argv += ["--task-episodes", f"bfcl:{category}={n}"] if n else []
    argv += ["--max-tokens", str(BFCL_MAX_TOKENS), "--max-new-tokens", str(args.bfcl_max_new)]
    argv += ["--concurrency", "8", "--seed", str(args.seed), "--out", str(out)]
    start = time.monotonic()
    agentrl(argv)
    report = json.loads(out.with_suffix(".json").read_text())
    return {
        "checkpoint": weights,
        "seconds": time.monotonic() - start,
        "argv": ["agentrl", *argv],
        "accuracy": {t.partition(":")[2]: r["pass_rate_mean"] for t, r in report["tasks"].items()},
        "entries": {t.partition(":")[2]: r["episodes"] for t, r in report["tasks"].items()},
    }


def _earlier_bfcl(weights: str, out: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """The BFCL evaluation already in ``out``'s JSON when it was made of the same weights
    with the same categories, entries and settings (an interrupted ``--bfcl-only`` resumes)."""
    from agentrl.trainer import resolve_model

    path = out.with_suffix(".json")
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    items = [c.strip().partition("=") for c in args.bfcl.split(",") if c.strip()]
    want = {f"bfcl:{c}": int(n) if n else args.bfcl_episodes or None for c, _, n in items}
    got = {t: r["episodes"] for t, r in report["tasks"].items()}
    same = (
        report["checkpoint"] == str(resolve_model(weights))
        and set(got) == set(want)
        and all(n is None or got[t] == n for t, n in want.items())
        and (report["temperature"], report["max_tokens"]) == (0.0, BFCL_MAX_TOKENS)
        and report["max_new_tokens"] == args.bfcl_max_new
    )
    if not same:
        return None
    tasks = report["tasks"].items()
    return {
        "checkpoint": weights,
        "seconds": report["seconds"],
        "argv": ["reused", str(path)],
        "accuracy": {t.partition(":")[2]: r["pass_rate_mean"] for t, r in tasks},
        "entries": {t.partition(":")[2]: r["episodes"] for t, r in tasks},
    }


def bfcl_of_arms(args: argparse.Namespace, work: Path) -> None:
    """``--bfcl-only``: BFCL of the model as shipped, of the shared before-RL checkpoint and
    of each arm's last checkpoint, added to ``learning-<arm>.json`` under ``bfcl``."""
    from learning_report import load_results

    arms = load_results(args.results)
    done: dict[str, dict[str, Any]] = {}

    def once(weights: str, out: Path) -> dict[str, Any]:
        if weights not in done:
            out.parent.mkdir(parents=True, exist_ok=True)
            done[weights] = _earlier_bfcl(weights, out, args) or evaluate_bfcl(weights, out, args)
            print(f"BFCL {weights}: {done[weights]['accuracy']}", flush=True)
        return done[weights]

    for arm, data in arms.items():
        run_dir = work / "runs" / data["config"]["run"]
        found = checkpoints(run_dir)
        model = data["config"]["model"]
        weights = {}
        for which in ("before", "after"):
            version = data[f"{which}_version"]
            if version not in found and version != 0:  # v0 is the model as shipped
                raise SystemExit(f"{arm}: checkpoint v{version} is not in {run_dir}/checkpoints")
            weights[which] = str(found.get(version, model))
        data["bfcl"] = {"base": once(model, args.results / "bfcl-base.md")}
        for which in ("before", "after"):
            out = run_dir / f"bfcl-v{data[f'{which}_version']:06d}.md"
            data["bfcl"][which] = once(weights[which], out)
        path = args.results / f"learning-{arm}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"[{arm}] BFCL added to {path}", flush=True)


def warm_start(
    cfg_path: Path, steps: int, lr: float | None = None, batch: int | None = None
) -> float:
    """``agentrl sft --config C --steps N [--lr LR] [--batch-episodes B]`` (`agentrl`); its
    wall-clock seconds."""
    start = time.monotonic()
    argv = ["sft", "--config", str(cfg_path), "--steps", str(steps)]
    argv += ["--lr", str(lr)] if lr is not None else []
    argv += ["--batch-episodes", str(batch)] if batch is not None else []
    agentrl(argv)
    return time.monotonic() - start


def agentrl(argv: list[str]) -> None:
    """``agentrl ARGV`` in a process of its own (this interpreter's agentrl), so the memory
    of its model, optimiser and engine goes back when it ends: run in this process, a
    warm start's and an evaluation's 10 GB stayed resident beside the training run's
    supervisor (21 of 24 GB in use during RL)."""
    code = subprocess.run([sys.executable, "-m", "agentrl.ops.cli.agentrl", *argv]).returncode
    if code != 0:
        raise SystemExit(f"agentrl {shlex.join(argv)} exited {code}")


def train(
    cfg_path: Path, run_dir: Path, args: argparse.Namespace, start_version: int
) -> dict[str, Any]:
    """The supervisor in a subprocess, stopped by SIGTERM (it drains) when ``--minutes`` have
    passed or ``--max-steps`` updates are on disk, whichever comes first."""
    # this interpreter's agentrl (a venv's), whether or not its scripts are on PATH
    argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
    argv += ["start", "--config", str(cfg_path)]
    argv += ["--progress-every", "60"]
    log_path = run_dir / "supervisor.out"
    start = time.monotonic()
    deadline = start + args.minutes * 60
    stopped_by = "exit"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                last = max(checkpoints(run_dir), default=start_version)
                if args.max_steps and last - start_version >= args.max_steps:
                    stopped_by = "steps"
                elif time.monotonic() >= deadline:
                    stopped_by = "budget"
                if stopped_by != "exit":
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(args.drain_timeout)
                    except subprocess.TimeoutExpired:
                        stopped_by += ", killed after the drain timeout"
                        proc.kill()
                        proc.wait()
                    break
                prune_checkpoints(run_dir, {start_version}, args.eval_every)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(min(2.0, max(0.1, deadline - time.monotonic())))
        finally:
            if proc.poll() is None:  # this process is being interrupted: do not leave it behind
                proc.send_signal(signal.SIGTERM)
                proc.wait(args.drain_timeout)
    seconds = time.monotonic() - start
    if proc.returncode != 0:  # a drained supervisor exits 0, also after SIGTERM
        tail = log_path.read_text(errors="replace")[-3000:]
        if max(checkpoints(run_dir), default=start_version) <= start_version:
            raise SystemExit(f"{shlex.join(argv)} exited {proc.returncode}:\n{tail}")
        # the updates it wrote are still measured; the exit code goes into the results
        print(f"{shlex.join(argv)} exited {proc.returncode} (see {log_path}):\n{tail}")
    prune_checkpoints(run_dir, {start_version}, args.eval_every)
    return {"argv": argv, "seconds": seconds, "exit_code": proc.returncode,
            "stopped_by": stopped_by, "log": str(log_path)}  # fmt: skip


def training_curve(run_dir: Path) -> list[dict[str, float]]:
    """Per update: version, time and every ``env/<entry>/success`` of metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [
        {
            k: v
            for k, v in m.items()
            if k in ("version", "time", "rollout/success")
            or (k.startswith("env/") and k.endswith("/success"))
        }
        for m in rows
    ]


def run_arm(arm: str, base: dict[str, Any], args: argparse.Namespace, work: Path) -> Path:
    """One arm end to end; the path of its results JSON."""
    t0 = time.monotonic()
    cfg = derive(base, arm, run_root=work / "runs", seed=args.seed)
    run_dir = work / "runs" / cfg["run"]
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run: the supervisor would resume from old checkpoints
    run_dir.mkdir(parents=True)
    cfg_path = run_dir.with_suffix(".yaml")
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    print(f"[{arm}] config {cfg_path}", flush=True)
    base = None
    if args.base_eval:  # an earlier evaluation of the model as shipped, on the same tasks
        base = reuse_evaluation(args.base_eval, cfg["model"])
        print(f"[{arm}] base model (from {args.base_eval}): {base['pass_rate']}", flush=True)
    elif args.eval_base:  # the model as shipped, before any warm start
        base = evaluate(cfg, cfg["model"], run_dir / "eval-base.md", args)
        print(f"[{arm}] base model: {base['pass_rate']}", flush=True)
    sft = {"steps": args.sft_steps, "seconds": 0.0, "version": 0, "lr": args.sft_lr}
    sft["batch_episodes"] = args.sft_batch
    before = None
    if args.warm_start_from:
        sft, before = reuse_warm_start(args.warm_start_from, run_dir, cfg, args)
        print(f"[{arm}] warm start from {args.warm_start_from}: v{sft['version']}", flush=True)
    elif args.sft_steps:
        sft["seconds"] = warm_start(cfg_path, args.sft_steps, args.sft_lr, args.sft_batch)
        (run_dir / SFT_SECONDS).write_text(json.dumps({"seconds": sft["seconds"]}) + "\n")
        sft["version"] = max(checkpoints(run_dir), default=0)
        print(f"[{arm}] warm start: {args.sft_steps} steps in {sft['seconds']:.0f} s", flush=True)
    v0 = sft["version"]
    first = checkpoints(run_dir).get(v0)
    weights = str(first) if first else cfg["model"]
    if before is None:
        before = evaluate(cfg, weights, run_dir / f"eval-v{v0:06d}.md", args)
    evals = {v0: before}
    print(f"[{arm}] before (v{v0}): {evals[v0]['pass_rate']}", flush=True)
    bfcl: dict[str, Any] = {}
    if args.bfcl:
        if args.eval_base or args.base_eval:
            bfcl["base"] = evaluate_bfcl(cfg["model"], run_dir / "bfcl-base.md", args)
        bfcl["before"] = evaluate_bfcl(weights, run_dir / f"bfcl-v{v0:06d}.md", args)
    rl = train(cfg_path, run_dir, args, v0)
    found = checkpoints(run_dir)
    last = max(found, default=sft["version"])
    rl["updates"] = last - sft["version"]
    print(f"[{arm}] RL: {rl['updates']} updates in {rl['seconds']:.0f} s ({rl['stopped_by']})")
    for v in sorted(found):
        if v > sft["version"] and (v == last or (args.eval_every and v % args.eval_every == 0)):
            evals[v] = evaluate(cfg, str(found[v]), run_dir / f"eval-v{v:06d}.md", args)
            print(f"[{arm}] v{v}: {evals[v]['pass_rate']}", flush=True)
    if args.bfcl:
        after = str(found.get(last, weights))
        bfcl["after"] = evaluate_bfcl(after, run_dir / f"bfcl-v{last:06d}.md", args)
    result = {
        "arm": arm,
        "command": shlex.join([sys.executable, *sys.argv]),
        "config": cfg,
        "seeds": {"run": args.seed, "eval": args.seed},
        "eval_settings": {
            "episodes": args.eval_episodes,
            "runs": args.eval_runs,
            "split": "test",
        },
        "budget_minutes": args.minutes,
        "sft": sft,
        "rl": rl,
        "before_version": sft["version"],
        "after_version": last,
        "eval": {str(v): e for v, e in sorted(evals.items())},
        "base": base["pass_rate"] if base else None,
        "base_eval": base,
        "before": evals[sft["version"]]["pass_rate"],
        "after": evals[last]["pass_rate"],
        "training": training_curve(run_dir),
        **({"bfcl": bfcl} if bfcl else {}),
        "wall_seconds": time.monotonic() - t0,
    }
    out = args.results / f"learning-{arm}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if (run_dir / "metrics.jsonl").exists():  # every update's metrics: the report's signal table
        shutil.copyfile(run_dir / "metrics.jsonl", args.results / f"metrics-{arm}.jsonl")
    print(f"[{arm}] wrote {out} ({result['wall_seconds']:.0f} s)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=HERE / "learning.yaml", help="base config")
    parser.add_argument("--arm", choices=[*ARMS, "all"], default="all")
    parser.add_argument("--minutes", type=float, default=40.0, help="RL wall clock per arm")
    parser.add_argument("--max-steps", type=int, help="also stop after N RL updates")
    parser.add_argument("--sft-steps", type=int, default=0, help="warm start steps (0 = none)")
    parser.add_argument(
        "--warm-start-from",
        type=Path,
        help="reuse the warm start (and its evaluation) of an earlier arm's run directory",
    )
    parser.add_argument("--sft-lr", type=float, help="warm start lr (default: learner.lr)")
    parser.add_argument(
        "--sft-batch", type=int, help="warm start episodes per step (default: the RL batch's)"
    )
    parser.add_argument(
        "--eval-base", action="store_true", help="also evaluate the model as shipped first"
    )
    parser.add_argument(
        "--base-eval", type=Path, help="reuse this `agentrl eval --out` JSON of the base model"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=100,
                        help="test instances per task (every one where a task has fewer); "
                        "the same instances before and after, compared pairwise")  # fmt: skip
    parser.add_argument("--eval-runs", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=10, help="also evaluate v%%N==0")
    parser.add_argument("--drain-timeout", type=float, default=600.0, help="seconds after SIGTERM")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--work", type=Path, default=Path("."), help="runs go to WORK/runs/")
    parser.add_argument("--report", action="store_true", help="table and plot from --results")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 steps, temp dir")
    parser.add_argument(
        "--bfcl",
        help="BFCL categories to evaluate, CATEGORY or CATEGORY=N entries (held out; needs "
        "bfcl-eval), e.g. simple_python,multiple,multi_turn_base=4",
    )
    parser.add_argument("--bfcl-episodes", type=int, default=50, help="first N entries (0: all)")
    parser.add_argument("--bfcl-max-new", type=int, default=256, help="tokens per BFCL turn")
    parser.add_argument(
        "--bfcl-only", action="store_true", help="BFCL of the arms in --results (see doc)"
    )
    args = parser.parse_args()
    if args.report:
        print(write_report(args.results).table, end="")
        return
    if args.bfcl_only:
        if not args.bfcl:
            raise SystemExit("--bfcl-only needs --bfcl CATEGORIES")
        bfcl_of_arms(args, args.work.resolve())
        print(write_report(args.results).table, end="")
        return
    base = yaml.safe_load(args.config.read_text())
    if args.smoke:
        return smoke(base, args)
    arms = list(ARMS) if args.arm == "all" else [args.arm]
    for arm in arms:
        run_arm(arm, base, args, args.work.resolve())
        run_dir = args.work.resolve() / "runs" / f"learning-{arm}"
        if args.sft_steps and not args.warm_start_from:  # one warm start serves every arm
            args.warm_start_from = run_dir
        if args.eval_base:  # and one evaluation of the model as shipped
            args.eval_base, args.base_eval = False, run_dir / "eval-base.json"
    files = write_report(args.results)
    print(files.table, end="")
    print(f"wrote {files.table_path} and {files.plot_path}")


def smoke(base: dict[str, Any], args: argparse.Namespace) -> None:
    """Every arm's config derived and validated; one arm (--arm, default full) run with the
    tiny model: 1 SFT step, 2 RL updates, 1 test episode per task; the report built; all in a
    temp dir."""
    from agentrl.ops import ConfigError, parse_config

    base = _merge(base, SMOKE)
    with tempfile.TemporaryDirectory(prefix="agentrl-learning-smoke-") as tmp:
        work = Path(tmp)
        for arm in ARMS:
            try:
                parse_config(derive(base, arm, run_root=work / "runs", seed=args.seed))
            except ConfigError as exc:
                raise SystemExit(f"arm {arm}: {exc}") from exc
        args.results, args.max_steps, args.eval_every = work / "results", 2, 0
        args.eval_episodes, args.eval_runs = 1, 1
        args.sft_steps = args.sft_steps or 1  # the warm start path too
        args.minutes = min(args.minutes, 5.0)
        for arm in ["full"] if args.arm == "all" else [args.arm]:
            run_arm(arm, base, args, work)
        files = write_report(args.results)
        print(files.table, end="")
        print(f"plot: {files.plot_path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
