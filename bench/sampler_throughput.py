"""Sampler throughput: TorchEngine against `transformers` `generate`, side by side, one process.

    python bench/sampler_throughput.py [--model smollm2] [--dtype float32] [--requests 16]
    python bench/sampler_throughput.py --smoke    # tiny model, 4 requests, few tokens (CI)

Two workloads, both with ``--requests`` concurrent sequences and every
generation forced to its full length (no stop tokens) so both sides produce
exactly the same number of tokens:

- **single turn**: distinct chat prompts (~40 tokens), ``--new-tokens`` each.
  HF: one `generate` call on the left-padded batch. Pure decoding speed.
- **agent episodes**: the calculator task's real prompts (system prompt, tool
  schema and demonstration, ~400 tokens), ``--requests / 8`` GRPO groups of 8,
  ``--turns`` turns of ``--turn-tokens`` tokens each, a tool result appended
  between turns. HF: one `generate` call per turn on the left-padded batch of
  all episodes, recomputing each full conversation (generate keeps no cache
  between calls). Engine: each episode submits its next turn when its last one
  returns (continuous batching, prefix reuse).

Each side runs in its own child process, one after the other, so each gets the
machine to itself and, as when deployed, one thread of its process does all the
torch work (a second thread's OpenMP parallel regions run slower on this machine).
Prints tokens/s of each side and the ratio (target: engine >= 3x HF).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch

from agentrl.actors import TorchEngine
from agentrl.environments import ChatFormat, make_task
from agentrl.messages import ChatMessage
from agentrl.trainer import load_causal_lm, load_tokenizer, resolve_device, resolve_model

OBSERVATION = ChatMessage(role="tool", content='{"result": 42}', name="calculate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--workload", choices=["single", "episodes", "both"], default="both")
    parser.add_argument("--side", choices=["hf", "engine"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, 4 short requests: checks it runs"
    )
    args = parser.parse_args()
    if args.smoke:  # the children get --smoke too (they re-read sys.argv)
        args.model, args.requests, args.new_tokens = "tiny", 4, 8
        args.turns, args.turn_tokens = 2, 4
    if args.side is not None:
        print(json.dumps(_measure(args)))
        return
    print(
        f"model={args.model} dtype={args.dtype} device={args.device} requests={args.requests} "
        f"threads={args.threads}"
    )
    results = {side: _child(side) for side in ("hf", "engine")}
    hf, eng = results["hf"], results["engine"]
    if "single" in hf:
        _report("single turn", hf["single"], eng["single"], eng["single_tokens"])
    if "episodes" in hf:
        print(
            f"episodes: {eng['episodes_shape']}; engine prompt positions: "
            f"{eng['computed']} computed, {eng['reused']} reused "
            f"({eng['reused'] / max(1, eng['computed'] + eng['reused']):.0%})"
        )
        _report("agent episodes", hf["episodes"], eng["episodes"], eng["episodes_tokens"])


def _child(side: str) -> dict:
    """Run this script for one side in a fresh process; its last stdout line is JSON."""
    argv = [sys.executable, __file__, *sys.argv[1:], "--side", side]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _measure(args) -> dict:
    """Seconds per workload for one side (``args.side``), in this process."""
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    out: dict = {}
    if args.side == "hf":
        model = load_causal_lm(model_dir, dtype=getattr(torch, args.dtype)).eval()
        model.to(resolve_device(args.device))
        ids = tok("hello there", return_tensors="pt").to(model.device)
        with torch.inference_mode():
            model.generate(**ids, max_new_tokens=4, do_sample=False)  # warm-up
    else:
        engine = TorchEngine(
            model_dir, device=args.device, dtype=args.dtype, max_batch=args.requests, seed=0
        )
        _submit(engine, [1, 2, 3], 4).result()  # warm-up
    try:
        if args.workload in ("single", "both"):
            prompts = _single_prompts(tok, args.requests)
            if args.side == "hf":
                out["single"] = _hf_single(model, tok, prompts, args.new_tokens)
            else:
                out["single"] = _engine_single(engine, prompts, args.new_tokens)
            out["single_tokens"] = args.requests * args.new_tokens
        if args.workload in ("episodes", "both"):
            fmt = ChatFormat(tok)
            task = make_task("calculator")
            tools = task.tools
            groups = max(1, args.requests // 8)
            firsts = [
                fmt.prompt_ids(task.start(g).messages, tools)
                for g in range(groups)
                for _ in range(8)
            ][: args.requests]
            obs = fmt.observation_ids(
                [ChatMessage(role="assistant", content="")], [OBSERVATION], tools
            )
            out["episodes_tokens"] = len(firsts) * args.turns * args.turn_tokens
            out["episodes_shape"] = (
                f"{len(firsts)} x {args.turns} turns x {args.turn_tokens} tokens, first prompt "
                f"{len(firsts[0])} tokens, tool result {len(obs)} tokens"
            )
            if args.side == "hf":
                out["episodes"] = _hf_episodes(
                    model, tok, firsts, obs, args.turns, args.turn_tokens
                )
            else:
                before = engine.stats()
                out["episodes"] = _engine_episodes(
                    engine, firsts, obs, args.turns, args.turn_tokens
                )
                after = engine.stats()
                out["computed"] = after["prefill_computed"] - before["prefill_computed"]
                out["reused"] = after["prefill_reused"] - before["prefill_reused"]
    finally:
        if args.side == "engine":
            engine.close()
    return out


def _single_prompts(tok, n: int) -> list[list[int]]:
    topics = ["a cat", "the sea", "a robot", "winter", "a library", "trains", "the moon", "bread"]
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Write story {i} about {topics[i % len(topics)]}."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def _hf_generate(model, tok, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """One HF `generate` call on the left-padded batch; exactly ``new_tokens`` per prompt."""
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            pad_token_id=pad,
        )
    return out[:, width:].tolist()


def _hf_single(model, tok, prompts, new_tokens) -> float:
    start = time.perf_counter()
    _hf_generate(model, tok, prompts, new_tokens)
    return time.perf_counter() - start


def _submit(engine, prompt, n):
    return engine.submit(prompt, max_new_tokens=n, temperature=1.0, top_p=1.0, stop_ids=[])


def _engine_single(engine, prompts, new_tokens) -> float:
    start = time.perf_counter()
    futures = [_submit(engine, p, new_tokens) for p in prompts]
    for f in futures:
        assert len(f.result().token_ids) == new_tokens
    return time.perf_counter() - start


def _hf_episodes(model, tok, firsts, obs, turns, turn_tokens) -> float:
    start = time.perf_counter()
    convs = [list(p) for p in firsts]
    for _ in range(turns):
        outs = _hf_generate(model, tok, convs, turn_tokens)
        convs = [c + o + obs for c, o in zip(convs, outs, strict=True)]
    return time.perf_counter() - start


def _engine_episodes(engine, firsts, obs, turns, turn_tokens) -> float:
    done = threading.Semaphore(0)

    def run(prompt: list[int], turn: int) -> None:
        future = _submit(engine, prompt, turn_tokens)

        def next_turn(f) -> None:
            gen = f.result()
            if turn + 1 < turns:
                run(prompt + gen.token_ids + obs, turn + 1)
            else:
                done.release()

        future.add_done_callback(next_turn)

    start = time.perf_counter()
    for prompt in firsts:
        run(list(prompt), 0)
    for _ in firsts:
        done.acquire()
    return time.perf_counter() - start


def _report(name: str, hf_seconds: float, engine_seconds: float, tokens: int) -> None:
    hf_rate, eng_rate = tokens / hf_seconds, tokens / engine_seconds
    print(
        f"{name}: HF generate {hf_rate:.0f} tok/s ({hf_seconds:.1f} s), "
        f"TorchEngine {eng_rate:.0f} tok/s ({engine_seconds:.1f} s), "
        f"ratio {eng_rate / hf_rate:.2f}x (target >= 3x)"
    )


if __name__ == "__main__":
    main()
