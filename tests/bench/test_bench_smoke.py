"""Every script in bench/ runs its --smoke mode to the end and prints its figures.

Each runs in a subprocess, as a user would run it (``python bench/X.py --smoke``), so a
bench that rots (an interface it uses changed) fails CI. Run with ``tox -e bench``.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = [pytest.mark.bench, pytest.mark.slow]

# bench -> lines (regular expressions) its smoke output must hold: the figures it reports
FIGURES = {
    "async_vs_sync.py": [
        r"eta=0: \d+ episodes in [\d.]+s = [\d.]+ episodes/s",
        r"eta=2: \d+ episodes in [\d.]+s = [\d.]+ episodes/s",
        r"ratio async/sync episodes/s: [\d.]+x",
        r"real: tiny, 3 updates of 4 episodes, sampler on core \d+, learner on core \d+",
        r"per update \(eta=0\): sampling S = [\d.]+ s, training T = [\d.]+ s",
        r"bound \(S \+ T\) / max\(S, T\) = [\d.]+x; ratio / bound = \d+%",
    ],
    "fanout.py": [r"v1: write [\d.]+ s, all 2 samplers serving after [\d.]+ s", r"median ratio"],
    "sampler_throughput.py": [
        r"single turn: HF generate \d+ tok/s .* TorchEngine \d+ tok/s",
        r"agent episodes: HF generate \d+ tok/s .* TorchEngine \d+ tok/s",
    ],
    "env_controller.py": [
        r"unloaded step overhead \(\d+ steps\): p50 [\d.]+ ms",
        r"20 sessions started in",
        r"loaded step overhead: p50 [\d.]+ ms",
        r"finished 20, errors 0",
    ],
    "transport.py": [
        r"raw pika +\d+ msg/s",
        r"agentrl durable +\d+ msg/s",
        r"ratio agentrl transient / raw pika: [\d.]+",
        r"ratio agentrl durable / agentrl transient: [\d.]+",
        r"round trip through the broker \(50 RPCs\): p50 [\d.]+ ms",
    ],
    "serve.py": [
        r"direct +[\d.]+ requests/s +latency p50 +[\d.]+ ms",
        r"endpoint +[\d.]+ requests/s +latency p50 +[\d.]+ ms",
        r"ratio endpoint / direct requests/s: [\d.]+",
        r"latency overhead p50: [+-][\d.]+ ms",
    ],
    "chunked_scoring.py": [
        r"whole logits, N=600: peak RSS \d+ MiB, \+-?\d+ MiB above heads, hidden states and "
        r"their gradients, [\d.]+ s",
        r"chunks of 128, N=600: peak RSS \d+ MiB, \+-?\d+ MiB above heads",
        r"ratio chunks / whole at N=600: peak above held -?[\d.]+, time [\d.]+; logprob sums "
        r"differ by [\d.e+-]+, entropy sums by [\d.e+-]+",
        r"chunks, N=600 against N=300: peak above held -?[\d.]+x",
    ],
    "optimizer_step.py": [
        r"foreach: \d+M parameters, holds \d+ MiB, peak RSS \d+ MiB \(\+\d+ MiB\), \d+ ms per step",
        r"fused: \d+M parameters, holds \d+ MiB, peak RSS \d+ MiB \(\+\d+ MiB\), \d+ ms per step",
        r"ratio fused / foreach: peak RSS [\d.]+, time per step [\d.]+",
    ],
    "gpu.py": [
        r"device: cpu \(CPU, \d+ cores\); torch ",
        r"sampler float32 4 requests, single turn: HF generate \d+ tok/s .* TorchEngine \d+ tok/s",
        r"sampler bfloat16 4 requests, agent episodes: HF generate \d+ tok/s",  # the largest
        r"learner torch float32 2x96: [\d.]+ s per update, peak ",
        r"learner torch bfloat16 4x96: [\d.]+ s per update, peak ",
        r"learner megatron float32 2x96: [\d.]+ s per update, peak ",
    ],
    "learner_step.py": [
        r"logits at every position: +[\d.]+ s per update",
        r"logits at trained positions: +[\d.]+ s per update",
        r"ratio trained-only / every position: [\d.]+",
        r"bf16 autocast: [\d.]+ s per update",
        r"ratio shared prompt / float32 trained positions: [\d.]+",
        r"ratio shared prompt \+ bf16 autocast / float32 trained positions: [\d.]+",
        r"shared prompt against float32: \|d logprob\| mean 0\.0000\d.*; first update [\d.]+ of "
        r"its size apart, its gradient's cosine to float32's (?:1\.00000|0\.9999\d)",
        r"; 3 of the 4 rows distinct;",  # --smoke: one member of the group copies another
        r"ratio shared prompt \+ copies once / float32 trained positions: [\d.]+",
        r"shared prompt \+ copies once against float32: \|d logprob\| mean 0\.0000\d",
        r"ratio shared prompt \+ copies once \+ bf16 compute / float32 trained positions: ",
        r"lora r16: [\d.]+ s per update",
        r"lora r16 against float32: \|d logprob\| mean 0\.00000 max 0\.00000",  # B = 0
        r"checkpoint lora r16: [\d.]+ MB, float32 full model [\d.]+ MB",
        r"ratio lora r16 \+ shared prompt \+ bf16 autocast / float32 trained positions: [\d.]+",
    ],
    "learning.py": [
        r"\[full\] warm start: 1 steps in \d+ s",
        r"\[full\] before \(v1\): \{",
        r"\[full\] RL: \d+ updates in \d+ s \(steps\)",
        r"\| \*\*mean\*\* \| (?:[\d.]+|n/a) \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \|",
        r"\| full \| \d+ \| \d+ \| \d+ \| \d+ \| .+ \| \d+ \| (?:[\d.]+|nan) \|",  # signal
        r"\| full \| \*\*mean\*\* \| \d+ \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \| "  # paired
        r"\[[+-][\d.]+, [+-][\d.]+\] \|",
        r"plot: \d+ bytes",
    ],
}


def test_every_bench_has_a_smoke_test() -> None:
    scripts = [p.name for p in BENCH.glob("*.py") if not p.name.startswith(("_", "learning_"))]
    assert sorted(scripts) == sorted(FIGURES)


def _broker_answers() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), 1.0).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("script", sorted(FIGURES))
def test_smoke(script: str, tmp_path: Path) -> None:
    if script in ("env_controller.py", "transport.py", "async_vs_sync.py") and not (
        _broker_answers()
    ):
        # roles or env workers as processes talk over RabbitMQ; transport.py measures it
        if os.environ.get("AGENTRL_REQUIRE_BROKER") == "1":
            pytest.fail("no RabbitMQ broker at 127.0.0.1:5672 and AGENTRL_REQUIRE_BROKER=1")
        pytest.skip(f"{script} needs RabbitMQ at 127.0.0.1:5672")
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    for figure in FIGURES[script]:
        assert re.search(figure, proc.stdout), f"{script}: no {figure!r} in:\n{proc.stdout}"


def test_learner_step_on_a_cuda_device_that_is_not_there(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the GPU suite's machine runs --device cuda")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "learner_step.py"), "--smoke", "--device", "cuda"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    from agentrl.trainer._device import DeviceUnavailable, resolve_device

    with pytest.raises(DeviceUnavailable) as unavailable:
        resolve_device("cuda")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"--device: {unavailable.value}", proc.stderr


def test_learner_step_on_the_episodes_of_a_trace_store(tmp_path: Path) -> None:
    # --trace: real episodes, whole groups of a run's trace.sqlite (here scripted groups
    # of 4 members with a shared 20-token prompt, in the tiny model's vocabulary): two
    # trained into version 3 (in os, members 2 and 3 copy members 0 and 1), and before
    # them one dropped as flat
    from agentrl.actors._trace_store import TraceWriter
    from agentrl.trainer import build_batch
    from tests.unit.records import trajectory

    store = TraceWriter(tmp_path / "trace.sqlite", tokenizer="tiny")
    groups = {}
    for g, task in enumerate(("kg", "db", "os")):
        prompt = [(7 * g + i) % 50 + 1 for i in range(20)]
        members = []
        for m in range(4):
            turn = [(11 * (m % 2 if task == "os" else m) + i) % 50 + 1 for i in range(6 + m % 2)]
            if task != "os":
                turn += [3] * (m // 2)
            members.append(
                trajectory(
                    [0] * 20 + [1] * len(turn),
                    group=f"g{g}",
                    episode_id=f"g{g}-{m}",
                    task=task,
                    sample_idx=m,
                    token_ids=prompt + turn,
                    reward=0.0 if task == "kg" else float(m % 2),
                    group_size=4,
                )
            )
        groups[task] = members
    store.dropped(2, "no_spread", groups["kg"])
    trained = groups["db"] + groups["os"]
    store.trained(3, trained, build_batch(trained, pad_id=0))
    store.close()

    def bench(*flags: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(BENCH / "learner_step.py"), "--smoke", "--lora-rank", "0",
             "--trace", str(tmp_path / "trace.sqlite"), *flags],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout

    out = bench("--groups", "2")  # the run's trained groups, with their rewards
    assert "batch: 8 real episodes of" in out
    assert "(2 trained groups: db, os), 26-28 tokens, 214 in all, 54 trained" in out
    assert "; 6 of the 8 rows distinct;" in out
    for way in ("shared prompt + bf16 autocast", "shared prompt + copies once + bf16 compute"):
        assert f"ratio {way} / float32 trained positions" in out, way
    out = bench("--trace-update", "3", "--ways", "shared+dedup")  # that update's batch
    assert "(update 3's 2 groups: db, os), 26-28 tokens, 214 in all, 54 trained" in out
    assert re.search(r"shared prompt \+ copies once against float32: \|d logprob\| mean 0\.0", out)
    out = bench("--groups", "3", "--trace-groups", "first", "--ways", "shared")
    assert "(3 first groups: db, kg, os), 26-28 tokens, 322 in all, 82 trained" in out
    assert "; 10 of the 12 rows distinct;" in out
    with pytest.raises(AssertionError, match="no group was trained into version 2"):
        bench("--trace-update", "2")
    # --repeats 0: the logprobs and first updates compared, nothing timed
    out = bench("--trace-update", "3", "--ways", "shared+dedup", "--repeats", "0")
    assert "logits at trained positions:   untimed (--repeats 0)" in out
    assert "shared prompt + copies once: untimed (--repeats 0)" in out
    assert "ratio" not in out and "s per update" not in out
    assert re.search(r"copies once against float32: .* cosine to float32's (1\.0|0\.9999)", out)


def test_learner_step_gradient_cosine() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("learner_step", BENCH / "learner_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    a = {"w": torch.tensor([[3.0, 0.0]], dtype=torch.float64), "b": torch.tensor([4.0])}
    assert bench.gradient_cosine(a, a) == pytest.approx(1.0)
    assert bench.gradient_cosine(a, {k: -2 * v for k, v in a.items()}) == pytest.approx(-1.0)
    # over every tensor, not per tensor: (3*0 + 0*5 + 4*4) / (5 * sqrt(41))
    b = {"w": torch.tensor([[0.0, 5.0]], dtype=torch.float64), "b": torch.tensor([4.0])}
    assert bench.gradient_cosine(a, b) == pytest.approx(16 / (5 * 41**0.5))
    # a name only one side has (LoRA's adapters, a frozen weight) is left out
    assert bench.gradient_cosine(a, {**b, "extra": torch.ones(3)}) == pytest.approx(
        16 / (5 * 41**0.5)
    )
    assert math.isnan(bench.gradient_cosine(a, {"w": torch.zeros(1, 2)}))  # no direction
