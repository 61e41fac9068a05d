"""The endpoint's cost: chat completions through it against the same engine called directly.

    python bench/serve.py [--model smollm2] [--requests 64] [--concurrency 8] [--tokens 32]
    python bench/serve.py --smoke    # tiny model, 16 requests: seconds (CI)

Both sides sample the same prompt (one user message, rendered by the model's chat template)
greedily (temperature 0, so both produce the same tokens) with the same ``--tokens`` limit
and ``--concurrency`` requests in flight:

- direct: `TorchEngine.submit` on the prompt ids, in this process;
- endpoint: the real `openai` client -> HTTP (FastAPI on uvicorn) -> the serve role ->
  the in-process broker -> a `SamplerActor` on a `TorchEngine` -> back.

It prints requests/s and latency p50/p90 of both, the throughput ratio endpoint / direct
and the p50 latency overhead in ms.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import openai

from agentrl.actors import TorchEngine
from agentrl.environments import ChatFormat
from agentrl.messages import ChatMessage
from agentrl.ops import Supervisor, configure_logging, parse_config
from agentrl.trainer import load_tokenizer, resolve_model

QUESTION = "Name three prime numbers and say why each is prime."


def timed(calls: int, concurrency: int, one) -> tuple[float, list[float]]:
    """Wall seconds for ``calls`` calls of ``one()`` with ``concurrency`` in flight, and
    each call's seconds."""
    latencies: list[float] = []
    lock = threading.Lock()

    def run(_: int) -> None:
        start = time.perf_counter()
        one()
        with lock:
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(run, range(calls)))
    return time.perf_counter() - start, latencies


def direct(args, fmt: ChatFormat, prompt: list[int]) -> tuple[float, list[float]]:
    engine = TorchEngine(resolve_model(args.model), max_batch=args.concurrency)
    try:
        params = dict(max_new_tokens=args.tokens, temperature=0.0, top_p=1.0)

        def one() -> None:
            engine.submit(prompt, stop_ids=fmt.stop_ids, **params).result(600)

        one()  # warm-up
        return timed(args.requests, args.concurrency, one)
    finally:
        engine.close()


def endpoint(args, tmp: Path) -> tuple[float, list[float]]:
    cfg = parse_config(
        {
            "run": "bench-serve",
            "broker": f"memory://bench-serve-{uuid.uuid4().hex[:6]}",
            "model": args.model,
            "output_dir": str(tmp),
            "rollout": {"max_tokens": 1024, "max_new_tokens": args.tokens},
            "pools": {"current": {"max_batch": args.concurrency}},
            "serve": {"port": 0},
        }
    )
    supervisor = Supervisor(cfg, ("sampler", "serve"))
    thread = threading.Thread(
        target=lambda: supervisor.run(progress_every=3600, install_signals=False)
    )
    thread.start()
    try:
        while supervisor.server is None:
            if not thread.is_alive():
                raise SystemExit("the endpoint did not start")
            time.sleep(0.05)
        client = openai.OpenAI(
            base_url=supervisor.server.url, api_key=supervisor.server.api_key, max_retries=0
        )
        messages = [{"role": "user", "content": QUESTION}]

        def one() -> None:
            client.chat.completions.create(
                model=args.model, messages=messages, max_tokens=args.tokens, temperature=0.0
            )

        one()  # warm-up
        return timed(args.requests, args.concurrency, one)
    finally:
        supervisor.done.set()
        thread.join(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens per request")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 16 requests")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.requests, args.concurrency, args.tokens = "tiny", 16, 4, 8
    configure_logging("warning")
    fmt = ChatFormat(load_tokenizer(resolve_model(args.model)))
    prompt = fmt.prompt_ids([ChatMessage(role="user", content=QUESTION)])
    results = {"direct": direct(args, fmt, prompt)}
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-serve-") as tmp:
        results["endpoint"] = endpoint(args, Path(tmp))
    print(f"{args.model}: {args.requests} requests, {args.concurrency} in flight, "
          f"up to {args.tokens} new tokens, greedy")  # fmt: skip
    p50 = {}
    for name, (wall, latencies) in results.items():
        latencies.sort()
        p50[name] = statistics.median(latencies)
        p90 = latencies[int(0.9 * (len(latencies) - 1))]
        print(f"  {name:<9} {args.requests / wall:7.2f} requests/s  latency p50 "
              f"{p50[name] * 1e3:7.1f} ms  p90 {p90 * 1e3:7.1f} ms")  # fmt: skip
    ratio = (args.requests / results["endpoint"][0]) / (args.requests / results["direct"][0])
    print(f"ratio endpoint / direct requests/s: {ratio:.2f}")
    print(f"latency overhead p50: {(p50['endpoint'] - p50['direct']) * 1e3:+.1f} ms")


if __name__ == "__main__":
    main()
