"""Checkpoint fan-out: announcement to every sampler serving the new version, against one write.

    python bench/fanout.py [--samplers 4] [--rounds 3] [--model smollm2] [--broker URL]
    python bench/fanout.py --smoke    # tiny model, 2 samplers, 2 rounds: seconds (CI)

A learner (`TorchLearner`, the real save path: HF safetensors + digest) writes
a checkpoint with perturbed weights and announces it on the checkpoints fanout
exchange; ``--samplers`` `SamplerActor`s on `TorchEngine`s verify the digest,
load the weights and heartbeat ``loaded`` with the version. Per round it prints
the write time (save + digest), the time from the announcement until the last
sampler serves the version, and their ratio (target: fan-out < 2x the write).
With ``--busy N`` every sampler has N generate requests in flight when the
checkpoint is announced (they finish on the old weights first).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch

from agentrl.actors import SamplerActor, TopologySpec, TorchEngine, declare
from agentrl.messages import (
    CheckpointReady,
    GenerateRequest,
    Heartbeat,
    Topology,
    connect,
    decode,
    encode,
)
from agentrl.trainer import TorchLearner, resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samplers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--broker", default=None, help="default: a fresh memory:// broker")
    parser.add_argument("--busy", type=int, default=0, help="requests in flight per sampler")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, 2 samplers, 2 rounds: checks it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.model, args.samplers, args.rounds = "tiny", 2, 2
    torch.set_num_threads(args.threads)

    run = f"fanout-{uuid.uuid4().hex[:6]}"
    broker = args.broker or f"memory://{run}"
    spec = TopologySpec(run, ("current",), 1024)
    names = Topology(run)
    model_dir = resolve_model(args.model)
    client = connect(broker, name=f"{run}-bench")
    declare(client, spec)

    loaded: dict[int, dict[str, float]] = {}
    cond = threading.Condition()

    def on_beat(delivery) -> None:
        beat = decode(delivery.body, expect=Heartbeat).payload
        if beat.labels.get("event") == "loaded":
            with cond:
                loaded.setdefault(int(beat.state["version"]), {})[beat.actor_id] = time.time()
                cond.notify_all()
        delivery.ack()

    client.bind(client.declare_queue(f"{run}.beats"), names.control, "heartbeat.#")
    client.consume(f"{run}.beats", on_beat, prefetch=64)

    print(f"model={args.model} samplers={args.samplers} busy={args.busy} broker={broker}")
    learner = TorchLearner(model_dir, kl_coef=0.0)  # only saves: no KL reference
    samplers = [
        SamplerActor.start(
            broker=broker,
            topology=spec,
            pool="current",
            every=1,
            engine_factory=lambda: TorchEngine(model_dir, max_batch=8),
            sampler_id=f"sampler-{i}",
            query_timeout=0.5,
        )
        for i in range(args.samplers)
    ]
    for ref in samplers:
        ref.proxy().stats().get()  # started: subscribed to the checkpoints exchange
    ratios = []
    try:
        with tempfile.TemporaryDirectory(prefix="agentrl-fanout-") as tmp:
            for version in range(1, args.rounds + 1):
                with torch.no_grad():
                    for param in learner.model.parameters():
                        param.add_(torch.randn_like(param), alpha=1e-3)
                out = Path(tmp) / f"v{version:06d}"
                start = time.perf_counter()
                digest = learner.save(out)
                write = time.perf_counter() - start
                replies = _keep_busy(client, names, run, args.busy * args.samplers)
                announced = time.time()
                ready = CheckpointReady(version, str(out), digest, announced)
                client.publish(names.checkpoints, "", encode(ready, run=run)).result(30)
                with cond:
                    ok = cond.wait_for(
                        lambda v=version: len(loaded.get(v, {})) == args.samplers, timeout=300
                    )
                if not ok:
                    raise SystemExit(f"v{version}: only {len(loaded.get(version, {}))} loaded")
                fanout = max(loaded[version].values()) - announced
                for future in replies:
                    future.result(300)
                ratios.append(fanout / write)
                print(
                    f"v{version}: write {write:.2f} s, all {args.samplers} samplers serving "
                    f"after {fanout:.2f} s, ratio {fanout / write:.2f}x"
                )
    finally:
        for ref in samplers:
            ref.stop()
        client.close()
    print(f"median ratio {statistics.median(ratios):.2f}x (target < 2x)")


def _keep_busy(client, names, run, n):
    """``n`` generate requests in flight (64 tokens each) on the pool."""
    futures = []
    for i in range(n):
        req = GenerateRequest(f"busy-{i}", "bench", [1, 2, 3, 4, 5], 64, 1.0, 1.0, [])
        futures.append(client.call(names.generate, "current", encode(req, run=run), timeout=300))
    time.sleep(1.0 if n else 0.0)  # let the samplers start decoding them
    return futures


if __name__ == "__main__":
    main()
