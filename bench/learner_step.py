"""Learner step: today's float32 update against its cheaper modes, on the same batch.

    python bench/learner_step.py [--model smollm2] [--episodes 8] [--tokens 1100] [--trained 0.12]
    python bench/learner_step.py --trace runs/<run>/trace.sqlite --groups 2   # real episodes
    python bench/learner_step.py --smoke    # tiny model, 4 short episodes, one a copy (CI)
    python bench/learner_step.py --device cuda --repeats 3   # on a GPU (peak memory too)

An agent episode is mostly context (system prompt, tool schemas, tool results); the
learner trains only its assistant tokens. The torch learner computes the LM head and the
softmax over the vocabulary at the trained positions only (``trainer/_scoring.py``); this
bench times one GRPO update (``TorchLearner.step``: forward and backward of the policy, the
KL reference's forward, the AdamW step) both ways on the same synthetic batch:
``--episodes`` episodes of ``--tokens`` tokens, ``--turns`` assistant turns each making
``--trained`` of the tokens, as the learning benchmark's runs have them (levels 0+1 with
dynamic sampling, full arm: episodes of 700-1,600 tokens, 8-15% of them trained). Each way
gets a fresh learner on the same weights and runs ``--repeats`` updates after one untimed
warm-up; the median is reported. Both ways score the trained tokens before their first
update; the sums of those logprobs must agree.

A third way, **bfloat16 autocast** (``learner.autocast``: float32 weights, gradients and
AdamW; the forward's matrix products in bfloat16, AMX on this CPU; the log-softmax in
float32), runs on the trained positions too. Against today's float32 (trained positions)
it prints its seconds and ratio, the mean and largest |Δ logprob| of the trained tokens
before the update, how far its first update lands from float32's, relative to the
update's size (``||W_bf16 - W_fp32|| / ||W_fp32 - W_0||``), and the cosine of that update's
gradient (clipped, before AdamW) to float32's. The distance overstates a small gradient
error: AdamW's first step moves each weight by about the learning rate times the sign of
its gradient, so a weight whose gradient is near 0 in float32 may move the full step the
other way. The cosine reads the gradient itself. ``--repeats 0`` compares without timing.

**bfloat16 compute** (``learner.bf16_compute``: the passes on a bfloat16 copy of the float32
masters, refreshed once per update; activations, norms and attention in bfloat16; the
gradients added into float32 after each micro-batch) runs alone (``bf16``) and with the
shared prompt (``shared+bf16``), compared like autocast.

**Copies once** (``learner.dedup_rows``: rows alike token for token forwarded once, each
keeping its own loss term; the same update) runs with each shared way (``shared+dedup``,
``shared+autocast+dedup``, ``shared+bf16+dedup``) where the batch has copies: real batches
do (a sharp policy samples one episode several times), random ones only with ``--copies``.
Every other way, today's float32 included, forwards every row.

Real episodes (``--trace runs/<run>/trace.sqlite``): ``--groups N`` groups the run
trained, with their rewards (``--trace-groups first``: the first N groups whatever became
of them, rewards 1, 0, ..., as this bench read them before), or ``--trace-update V``, the
run's own batch of update V.

**LoRA** (``learner.lora``: rank ``--lora-rank`` adapters on every linear layer, the base
frozen and serving as the KL reference, AdamW on the adapters only) runs alone and with the
shared prompt and autocast. LoRA is another update by design, so it is compared by its
seconds, its checkpoint's size (the adapters, against the full model's float32 safetensors)
and the trained tokens' logprobs before its first update (the base's: B = 0).

All ways run in this one process, one after the other, with ``--threads`` torch threads
(default: the cores), on ``--device`` (default ``cpu``; on CUDA each update is timed to
its last kernel and each way's peak allocated memory is printed). Prints seconds per
update of each way and their ratios. ``--ways`` names the ways to run beside today's
float32 (which always runs: every ratio is against it), e.g. ``--ways shared+autocast``
for the headline alone; by default the flags above choose them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrl.messages import Trajectory
from agentrl.trainer import LoraSpec, TorchLearner, _scoring, build_batch, resolve_model
from agentrl.trainer._device import (
    BFLOAT16_MIN_SPEEDUP,
    DeviceUnavailable,
    bfloat16_note,
    bfloat16_speed,
    resolve_device,
)
from agentrl.trainer._distinct_rows import distinct_rows


def synthetic_batch(
    episodes: int,
    tokens: int,
    turns: int,
    trained: float,
    vocab: int,
    *,
    shared: float = 0.0,
    copies: int = 0,
):
    """``episodes`` trajectories of ``tokens`` random ids; each has ``turns`` assistant
    segments, together ``trained`` of its tokens, each after a stretch of context. With
    ``shared``, the first ``shared`` of each episode's tokens are its group's common prompt
    (the same ids for the 4 members), the turns after it. With ``copies`` (0-2), the last
    ``copies`` members of each group are copies of the member two places before them, token
    for token and reward for reward, as a sharp policy samples them."""
    gen = torch.Generator().manual_seed(0)
    assistant = max(1, round(tokens * trained / turns))
    prompt = round(tokens * shared)
    context = max(1, (tokens - prompt - assistant * turns) // turns)
    mask = ([0] * context + [1] * assistant) * turns
    mask = [0] * (tokens - len(mask)) + mask
    prompts = [torch.randint(1, vocab, (prompt,), generator=gen).tolist() for _ in range(episodes)]
    out = []
    rows: list[list[int]] = []
    for i in range(episodes):
        ids = prompts[i // 4] + torch.randint(1, vocab, (tokens - prompt,), generator=gen).tolist()
        if i % 4 >= 4 - copies:
            ids = rows[i - 2]
        rows.append(ids)
        reward = float(i % 2)  # groups of 4 with spread: every episode trains
        out.append(
            Trajectory(
                episode_id=f"e{i}",
                group_id=f"g{i // 4}",
                task="bench",
                index=i // 4,
                sample_idx=i % 4,
                group_size=4,
                issued_version=0,
                token_ids=ids,
                loss_mask=mask,
                logprobs=[-2.0 * m for m in mask],
                versions=[0 if m else -1 for m in mask],
                pools=["current"],
                reward=reward,
                env_reward=reward,
                status="completed",
                num_turns=turns,
                timings={},
                metrics={},
            )
        )
    return build_batch(out, pad_id=0)


def traced_batch(path: Path, groups: int, pick: str = "trained", update: int | None = None):
    """A batch of real episodes from a run's trace store (``runs/<run>/trace.sqlite``):
    ``groups`` whole groups, one task after another (task A's first group, task B's first,
    ..., then their second groups), as sampled: their tokens, masks and the sampler's
    logprobs. ``pick``: ``trained``, groups the run trained, with the rewards they were
    trained with (a run drops flat groups: these are what its learner computed);
    ``first``, the first groups in the store whatever became of them, their rewards
    alternating 1, 0 within each group so every group trains (what this bench read
    before `trained` existed: its members can be one episode 8 times). ``update``: instead,
    the batch of that update of the run, whole: every group trained into version
    ``update``, with its rewards."""
    from agentrl.actors._trace_store import EpisodeFilter, TraceReader

    as_trained = pick == "trained" or update is not None  # the run's groups, its rewards
    reader = TraceReader(path)
    try:
        by_task: dict[str, list[str]] = {}
        for summary in reader.episodes(EpisodeFilter(), limit=100_000):
            if as_trained and summary.outcome != "trained":
                continue
            if update is not None and summary.version != update:
                continue
            seen = by_task.setdefault(summary.task, [])
            if summary.group_id not in seen:
                seen.append(summary.group_id)
        if update is not None:
            chosen = {g for gs in by_task.values() for g in gs}
            if not chosen:
                raise SystemExit(f"{path}: no group was trained into version {update}")
        else:
            tasks = sorted(by_task)
            order = [g for i in range(groups) for t in tasks for g in by_task[t][i : i + 1]]
            chosen = set(order[:groups])
            if len(chosen) < groups:
                raise SystemExit(f"{path}: {len(chosen)} {pick} groups, not {groups}")
        out = []
        for summary in reader.episodes(EpisodeFilter(), limit=100_000):
            if summary.group_id not in chosen:
                continue
            trace = reader.episode(summary.episode_id)
            reward = summary.reward if as_trained else float(summary.sample_idx % 2)
            out.append(
                Trajectory(
                    episode_id=summary.episode_id,
                    group_id=summary.group_id,
                    task=summary.task,
                    index=summary.index,
                    sample_idx=summary.sample_idx,
                    group_size=8,
                    issued_version=0,
                    token_ids=trace.token_ids,
                    loss_mask=trace.loss_mask,
                    logprobs=trace.logprobs,
                    versions=[0 if m else -1 for m in trace.loss_mask],
                    pools=["current"],
                    reward=reward,
                    env_reward=reward,
                    status="completed",
                    num_turns=summary.num_turns,
                    timings={},
                    metrics={},
                )
            )
    finally:
        reader.close()
    return build_batch(out, pad_id=0)


def time_updates(
    model_dir,
    batch,
    args,
    *,
    sliced=True,
    autocast=False,
    share=False,
    checkpointing=None,
    lora=None,
    bf16=False,
    dedup=False,
):
    """One way: median seconds per update (nan with ``--repeats 0``), the trained tokens'
    logprobs before the first update ``[B, L]``, the weights after the first (untimed)
    update and its clipped gradient by parameter name (on the CPU), the MB of the
    checkpoint's safetensors that ``save`` writes, and the peak GiB allocated on a CUDA
    device (0 on the CPU)."""
    cuda = args.device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    original = _scoring.slices_logits
    if not sliced:
        _scoring.slices_logits = lambda model: False
    try:
        learner = TorchLearner(
            model_dir,
            micro_batch_tokens=args.micro_batch_tokens,
            gradient_checkpointing=(
                args.gradient_checkpointing if checkpointing is None else checkpointing
            ),
            autocast=autocast,
            share_prefix=share,
            lora=lora,
            bf16_compute=bf16,
            dedup_rows=dedup,
            device=args.device,
        )
        if share and not learner.share_prefix:
            raise SystemExit("the shared prompt is off for this model")
        scored = learner.logprobs(batch)  # the trained tokens' logprobs: every way must agree
        batch = dataclasses.replace(batch, old_logprobs=scored)
        gradient = {}
        names = {id(p): n for n, p in learner.model.named_parameters()}

        def keep_gradient(optimizer, *_):  # the first update's (clipped) gradient, by name
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        gradient[names[id(p)]] = p.grad.detach().to("cpu", copy=True)

        hook = learner.optimizer.register_step_pre_hook(keep_gradient)
        learner.step(batch)  # warm-up, and the update compared across ways
        hook.remove()
        first = {k: v.detach().cpu().clone() for k, v in learner.model.state_dict().items()}
        seconds = []
        for _ in range(args.repeats):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            learner.step(batch)
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
        with tempfile.TemporaryDirectory() as out:
            learner.save(out)
            size = sum(p.stat().st_size for p in Path(out).glob("*.safetensors")) / 2**20
        del learner
        median = statistics.median(seconds) if seconds else float("nan")
        return median, scored.cpu(), first, gradient, size, peak
    finally:
        _scoring.slices_logits = original


WAYS = (
    "every-position",
    "autocast",
    "bf16",
    "shared",
    "shared+autocast",
    "shared+bf16",
    "shared+dedup",
    "shared+autocast+dedup",
    "shared+bf16+dedup",
    "lora",
    "lora+shared+autocast",
)
"""The ways `--ways` names, in the order they run (after today's float32)."""


def parse_ways(text: str) -> list[str]:
    ways = [w.strip() for w in text.split(",") if w.strip()]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown ways {unknown}: choose from {', '.join(WAYS)}")
    return ways


def default_ways(args, copies: bool) -> list[str]:
    """The ways the flags choose: every position always; autocast (with bfloat16 compute),
    the shared prompt and LoRA as ``--autocast``, ``--shared-prompt`` and ``--lora-rank``
    say; the shared ways again with copies once where the batch has ``copies``."""
    ways = ["every-position"]
    if args.autocast:  # (and bfloat16 compute beside it)
        ways += ["autocast", "bf16"]
    if args.shared_prompt:
        shared = ["shared", "shared+autocast", "shared+bf16"] if args.autocast else ["shared"]
        ways += shared + ([f"{w}+dedup" for w in shared] if copies else [])
    if args.lora_rank:
        ways.append("lora")
        if args.shared_prompt and args.autocast:
            ways.append("lora+shared+autocast")
    return ways


def update_distance(a: dict, b: dict, base: dict) -> float:
    """||a - b|| / ||a - base|| over the tensors of ``base``: two updates of it compared."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in base)
    den = sum(float((a[k].double() - base[k].double()).pow(2).sum()) for k in base)
    return (num / den) ** 0.5 if den else float("inf")


def gradient_cosine(a: dict, b: dict) -> float:
    """cos(a, b) of two gradients by parameter name, over the names they share, summed in
    float64 as `update_distance`."""
    names = a.keys() & b.keys()
    dot = sum(float((a[k].double() * b[k].double()).sum()) for k in names)
    na = sum(float(a[k].double().pow(2).sum()) for k in names) ** 0.5
    nb = sum(float(b[k].double().pow(2).sum()) for k in names) ** 0.5
    return dot / (na * nb) if na and nb else float("nan")


def _timed(seconds: float) -> str:
    return "untimed (--repeats 0)" if seconds != seconds else f"{seconds:.3f} s per update"


def _peak(gib: float) -> str:
    return f", peak {gib:.1f} GiB allocated" if gib else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1100)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--trained", type=float, default=0.12, help="share of trained tokens")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                        default=True, help="as bench/learning*.yaml")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed updates per way after the compared one (0: compare "
                             "logprobs and first updates only, untimed)")  # fmt: skip
    parser.add_argument("--autocast", action=argparse.BooleanOptionalAction,
                        help="also time bfloat16 autocast and compute (default: where bfloat16 "
                             "matrix products are faster than float32's here)")  # fmt: skip
    parser.add_argument("--shared", type=float, default=0.7,
                        help="share of each episode that is its group's common prompt")  # fmt: skip
    parser.add_argument("--copies", type=int, choices=(0, 1, 2), default=0,
                        help="members of a group of 4 that copy another")  # fmt: skip
    parser.add_argument("--shared-prompt", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the shared prompt (no gradient checkpointing)")  # fmt: skip
    parser.add_argument("--lora-rank", type=int, default=16,
                        help="also time LoRA at this rank (0: not)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--ways", type=parse_ways, help=f"comma-separated: {', '.join(WAYS)}")
    parser.add_argument("--trace", type=Path,
                        help="real episodes: a run's trace.sqlite")  # fmt: skip
    parser.add_argument("--groups", type=int, default=2, help="with --trace: whole groups")
    parser.add_argument("--trace-update", type=int, metavar="V",
                        help="with --trace: the run's own batch of update V (the groups "
                             "trained into version V; not --groups, --trace-groups)")  # fmt: skip
    parser.add_argument("--trace-groups", choices=("trained", "first"), default="trained",
                        help="with --trace: groups the run trained, with their rewards, or the "
                             "first ones whatever became of them (rewards 1, 0, ...)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny model, 4 episodes, one a copy")
    args = parser.parse_args()
    if args.smoke:  # every way, whatever the CPU: the tiny model runs them in seconds
        args.model, args.episodes, args.tokens = "tiny", 4, 96  # --repeats as given (1)
        args.copies = 1  # the ways that forward copies once run too
        args.autocast = True if args.autocast is None else args.autocast
    if not 0 < args.trained < 1:
        raise SystemExit("--trained must be between 0 and 1")
    torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)  # the project's one check: a clear line
    except (ValueError, DeviceUnavailable) as error:
        raise SystemExit(f"--device: {error}") from None
    if args.autocast is None:
        speed = bfloat16_speed(args.device)
        args.autocast = speed >= BFLOAT16_MIN_SPEEDUP
        if not args.autocast:
            print(
                f"bfloat16 ways left out: {bfloat16_note(speed)} (--autocast times them anyway)",
                flush=True,
            )
    model_dir = resolve_model(args.model)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    if args.trace:
        batch = traced_batch(args.trace, args.groups, args.trace_groups, args.trace_update)
        lengths = batch.attention_mask.sum(dim=1)
        chosen = (
            f"update {args.trace_update}'s {len(set(batch.group_index.tolist()))} groups"
            if args.trace_update is not None
            else f"{args.groups} {args.trace_groups} groups"
        )
        what = (
            f"{batch.num_rows} real episodes of {args.trace} ({chosen}: "
            f"{', '.join(sorted(set(batch.tasks)))}), {int(lengths.min())}-{int(lengths.max())} "
            f"tokens, {int(lengths.sum())} in all, {int(batch.num_tokens)} trained"
        )
    else:
        batch = synthetic_batch(
            args.episodes,
            args.tokens,
            args.turns,
            args.trained,
            vocab,
            shared=args.shared,
            copies=args.copies,
        )
        what = (
            f"{args.episodes} episodes x {args.tokens} tokens, {int(batch.num_tokens)} "
            f"trained, groups of 4 sharing the first {args.shared:.0%}"
        )
    kinds = len(distinct_rows(batch).rows)
    what += f"; {kinds} of the {batch.num_rows} rows distinct"
    where = f"{args.threads} threads"
    if args.device.type == "cuda":
        where = f"device {args.device} ({torch.cuda.get_device_name(args.device)})"
    print(
        f"batch: {what}; {where}; gradient checkpointing "
        f"{'on' if args.gradient_checkpointing else 'off'}",
        flush=True,
    )
    from safetensors.torch import load_file

    base = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        base.update(load_file(str(path)))
    ways = args.ways if args.ways is not None else default_ways(args, kinds < batch.num_rows)
    if "every-position" in ways:
        full, scored_full, _, _, _, peak = time_updates(model_dir, batch, args, sliced=False)
        print(f"logits at every position:      {_timed(full)}{_peak(peak)}", flush=True)
    kept, scored, first, grad, full_mb, peak = time_updates(model_dir, batch, args, sliced=True)
    print(f"logits at trained positions:   {_timed(kept)}{_peak(peak)}", flush=True)
    if "every-position" in ways:
        if args.repeats:
            print(f"ratio trained-only / every position: {kept / full:.3f}")
        logp_full, logp_kept = float(scored_full.sum()), float(scored.sum())
        print(f"sum of the trained tokens' logprobs: {logp_full:.4f} and {logp_kept:.4f}")
        if abs(logp_full - logp_kept) > 1e-5 * max(1.0, abs(logp_full)):
            raise SystemExit("the two ways score the trained tokens differently")
    mask = batch.loss_mask.bool()
    tied = {k: v for k, v in base.items() if k in first}
    lora = LoraSpec(rank=args.lora_rank or 16, alpha=2.0 * (args.lora_rank or 16))
    r = lora.rank
    how_of = {
        "autocast": ("bf16 autocast", dict(autocast=True)),
        "bf16": ("bf16 compute", dict(bf16=True)),
        "shared": ("shared prompt", dict(share=True, checkpointing=False)),
        "shared+autocast": ("shared prompt + bf16 autocast",
                            dict(share=True, checkpointing=False, autocast=True)),
        "shared+bf16": ("shared prompt + bf16 compute",
                        dict(share=True, checkpointing=False, bf16=True)),
        "shared+dedup": ("shared prompt + copies once",
                         dict(share=True, checkpointing=False, dedup=True)),
        "shared+autocast+dedup": ("shared prompt + copies once + bf16 autocast",
                                  dict(share=True, checkpointing=False, autocast=True, dedup=True)),
        "shared+bf16+dedup": ("shared prompt + copies once + bf16 compute",
                              dict(share=True, checkpointing=False, bf16=True, dedup=True)),
        "lora": (f"lora r{r}", dict(lora=lora)),
        "lora+shared+autocast": (f"lora r{r} + shared prompt + bf16 autocast",
                                 dict(lora=lora, share=True, checkpointing=False, autocast=True)),
    }  # fmt: skip
    ways = [how_of[w] for w in WAYS if w in ways and w in how_of]
    for label, how in ways:
        seconds, scored_way, first_way, grad_way, mb, peak = time_updates(
            model_dir, batch, args, **how
        )
        gap = (scored_way - scored).abs()[mask]
        print(f"{label}: {_timed(seconds)}{_peak(peak)}", flush=True)
        if args.repeats:
            print(f"ratio {label} / float32 trained positions: {seconds / kept:.3f}")
        apart = ""
        if "lora" not in how:  # LoRA's update is another one by design: not compared so
            distance = update_distance(first, first_way, tied)
            cosine = gradient_cosine(grad, grad_way)
            apart = (
                f"; first update {distance:.4f} of its size apart, its gradient's cosine to "
                f"float32's {cosine:.5f}"
            )
        print(
            f"{label} against float32: |d logprob| mean {float(gap.mean()):.5f} "
            f"max {float(gap.max()):.5f} nats on {int(mask.sum())} trained tokens{apart}",
            flush=True,
        )
        if "lora" in how:
            print(f"checkpoint {label}: {mb:.2f} MB, float32 full model {full_mb:.2f} MB")


if __name__ == "__main__":
    main()
