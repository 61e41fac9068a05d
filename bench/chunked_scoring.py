"""The learner's scoring of N trained targets, as an update runs it: the LM head, the float32
log-softmax, the logprobs, the entropy and the KL reference's logprobs, then the backward
pass. Whole logits (``[N, V]`` at once, as before `trainer/_scoring.py` chunked them)
against chunks (`_scoring.score`): peak memory and time, each way and N in a process of
its own.

    python bench/chunked_scoring.py [--targets 1024,2048,8192] [--vocab 151936] [--hidden 896]
    python bench/chunked_scoring.py --smoke    # a 8,192 vocabulary: seconds (CI)

The defaults are Qwen2.5-0.5B's head (896 x 151,936). Each line prints the peak RSS
(counted from the resident bytes after the setup: Linux only) and the peak above what the
scoring holds anyway (the policy's and the reference's heads, the hidden states, their
gradients). The whole logits' peak grows with N x V (about 6 float32 copies: 30 GB at
N = 8,192); a size whose estimate exceeds 80% of the memory available is skipped and says
so. The chunks' peak is a few ``[C, V]`` copies whatever N is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from agentrl.trainer import _scoring
from agentrl.trainer._grpo import k3_kl, token_entropy, token_logprobs

WHOLE_COPIES = 6
"""float32 ``[N, V]`` copies the whole logits hold at their peak (the logits, their kept
log-softmax, the reference's logits, the entropy's transients, the backward's buffers)."""

TEMPERATURE = 0.8
KL_COEF = 0.1


def whole(head, reference, hidden, targets, advantages):
    """The scoring before chunks: `_scoring.logits_at`'s ``[N, V]`` logits, then
    `token_logprobs`, the reference's, the backward pass, `token_entropy` of the logits."""
    logits = head(hidden)
    logp = token_logprobs(logits[None], targets[None], TEMPERATURE)[0]
    with torch.no_grad():
        ref_logits = reference(hidden)
        ref_logp = token_logprobs(ref_logits[None], targets[None], TEMPERATURE)[0]
        del ref_logits
    loss = -(logp * advantages).sum() + KL_COEF * k3_kl(logp, ref_logp).sum()
    loss.backward()
    with torch.no_grad():
        entropy = token_entropy(logits.detach(), TEMPERATURE)
    return logp.detach(), entropy


def chunked(head, reference, hidden, targets, advantages):
    """The scoring now: `_scoring.score` from the hidden states, the reference's too."""
    logp, entropy = _scoring.score(
        _scoring.AtTargets(hidden, head), targets, TEMPERATURE, entropy=True
    )
    with torch.no_grad():
        ref_logp, _ = _scoring.score(_scoring.AtTargets(hidden, reference), targets, TEMPERATURE)
    loss = -(logp * advantages).sum() + KL_COEF * k3_kl(logp, ref_logp).sum()
    loss.backward()
    return logp.detach(), entropy


WAYS = {"whole": whole, "chunked": chunked}


def one_way(way: str, targets: int, vocab: int, hidden: int, threads: int) -> dict:
    """Run in a fresh process: the peak RSS of one way at one N, undisturbed by the others."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    reference = torch.nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    states = torch.randn(targets, hidden).requires_grad_(True)
    ids = torch.randint(0, vocab, (targets,))
    advantages = torch.randn(targets)
    # a first call on 2 targets: what the way loads lazily (checkpoint's machinery) is in
    # "before", not in the figures
    WAYS[way](head, reference, states[:2].detach().requires_grad_(True), ids[:2], advantages[:2])
    head.weight.grad = None
    before = reset_peak_rss()
    start = time.perf_counter()
    logp, entropy = WAYS[way](head, reference, states, ids, advantages)
    seconds = time.perf_counter() - start
    peak = rss("VmHWM")
    grads = 4 * (head.weight.numel() + states.numel())  # allocated by the backward pass
    return {
        "way": way,
        "targets": targets,
        "chunk": _scoring.chunk_positions(vocab),
        "before": before,
        "held": before + grads,
        "peak": peak,
        "seconds": seconds,
        "logp_sum": float(logp.double().sum()),
        "entropy_sum": float(entropy.double().sum()),
    }


def rss(field: str = "VmRSS") -> int:
    """This process's resident bytes now (``VmRSS``) or at their peak (``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> int:
    """Start the peak over from what is resident now (Linux's ``clear_refs``, 5), so the
    setup's transients and the first call's are not in it; return the bytes resident."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss()


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="1024,2048,8192", help="values of N, commas")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk-bytes", type=int, default=_scoring.HEAD_CHUNK_BYTES)
    parser.add_argument("--smoke", action="store_true", help="vocabulary 8,192, hidden 64")
    parser.add_argument("--way", help=argparse.SUPPRESS)  # the child process's way
    args = parser.parse_args()
    if args.smoke:
        args.targets, args.vocab, args.hidden = "300,600", 8192, 64
        args.chunk_bytes = 4 * args.vocab * 128  # chunks of 128 targets: several per N
    _scoring.HEAD_CHUNK_BYTES = args.chunk_bytes
    sizes = [int(n) for n in args.targets.split(",")]
    if args.way:
        print(json.dumps(one_way(args.way, sizes[0], args.vocab, args.hidden, args.threads)))
        return
    mib = 1 << 20
    results: dict[tuple[str, int], dict] = {}
    for n in sizes:
        for way in WAYS:
            need = WHOLE_COPIES * 4 * n * args.vocab
            if way == "whole" and need > 0.8 * available_bytes():
                print(
                    f"whole logits, N={n}: skipped, needs ~{need / 2**30:.0f} GiB, "
                    f"{available_bytes() / 2**30:.0f} GiB available"
                )
                continue
            child = [sys.executable, __file__, "--way", way, "--targets", str(n)]
            child += ["--vocab", str(args.vocab), "--hidden", str(args.hidden)]
            child += ["--threads", str(args.threads), "--chunk-bytes", str(args.chunk_bytes)]
            out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
            r = results[way, n] = json.loads(out.strip().splitlines()[-1])
            name = "whole logits" if way == "whole" else f"chunks of {r['chunk']}"
            print(
                f"{name}, N={n}: peak RSS {r['peak'] / mib:.0f} MiB, "
                f"+{(r['peak'] - r['held']) / mib:.0f} MiB above heads, hidden states and "
                f"their gradients, {r['seconds']:.1f} s"
            )
    print(f"vocabulary {args.vocab}, hidden {args.hidden}, {args.threads} threads")
    for n in sizes:
        if ("whole", n) in results:
            w, c = results["whole", n], results["chunked", n]
            print(
                f"ratio chunks / whole at N={n}: peak above held "
                f"{(c['peak'] - c['held']) / (w['peak'] - w['held']):.3f}, "
                f"time {c['seconds'] / w['seconds']:.2f}; logprob sums differ by "
                f"{abs(c['logp_sum'] - w['logp_sum']):.2e}, entropy sums by "
                f"{abs(c['entropy_sum'] - w['entropy_sum']):.2e}"
            )
    low, high = results["chunked", sizes[0]], results["chunked", sizes[-1]]
    print(
        f"chunks, N={sizes[-1]} against N={sizes[0]}: peak above held "
        f"{(high['peak'] - high['held']) / (low['peak'] - low['held']):.2f}x"
    )


if __name__ == "__main__":
    main()
