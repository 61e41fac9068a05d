"""Fakes of the engine and learner backend, for unit tests and the scheduling benchmark.

Both pass the same conformance suites as the real implementations
(tests/unit/engine_suite.py, tests/unit/backend_suite.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from agentrl.trainer import TrainBatch, checkpoint_digest

from .engines.base import EngineClosed, EngineError, Generation, check_request

__all__ = ["FakeBackend", "ScriptedEngine"]


class ScriptedEngine:
    """A SamplerEngine whose completions come from a function of the prompt.

    `respond(prompt_ids, version)` returns the token ids the "model" would
    write; the engine applies the stop ids and `max_new_tokens` exactly like a
    real engine (a response without a stop id ends as 'length', so scripts
    end their turns with one). `latency(n_tokens)` gives the seconds a request takes (0 by
    default; the benchmark uses a realistic per-token latency). Each token's
    logprob is `logprob`.
    """

    def __init__(
        self,
        respond: Callable[[list[int], int], list[int]],
        *,
        latency: Callable[[int], float] = lambda n: 0.0,
        logprob: float = -1.0,
        concurrency: int = 16,
        version: int = 0,
    ) -> None:
        self._respond = respond
        self._latency = latency
        self._logprob = logprob
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="scripted-engine")
        self._pending: set[Future] = set()
        self._closed = False
        self.version = version
        self.loads: list[tuple[str, int]] = []

    def submit(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_ids: Sequence[int],
        seed: int | None = None,
    ) -> Future[Generation]:
        check_request(prompt_ids, max_new_tokens, temperature, top_p)
        with self._lock:
            if self._closed:
                raise EngineClosed("engine closed")
            version = self.version
            future: Future[Generation] = Future()
            self._pending.add(future)
        self._pool.submit(
            self._generate, future, list(prompt_ids), max_new_tokens, stop_ids, version
        )
        return future

    def _generate(self, future, prompt_ids, max_new_tokens, stop_ids, version) -> None:
        try:
            tokens = list(self._respond(prompt_ids, version))[:max_new_tokens]
        except BaseException as exc:  # the "model" broke: the request fails, like a real engine
            with self._lock:
                self._pending.discard(future)
            future.set_exception(EngineError(f"scripted response failed: {exc!r}"))
            return
        finish = "length"
        for i, tok in enumerate(tokens):
            if tok in stop_ids:
                tokens, finish = tokens[: i + 1], "stop"
                break
        delay = self._latency(len(tokens))
        if delay > 0:
            time.sleep(delay)  # simulated decoding time
        gen = Generation(tokens, [self._logprob] * len(tokens), version, finish)
        with self._lock:
            if future not in self._pending:
                return  # failed by close()
            self._pending.discard(future)
        future.set_result(gen)

    def load(self, model_dir: str | Path, version: int) -> Future[None]:
        with self._lock:
            if self._closed:
                raise EngineClosed("engine closed")
            self.version = version
            self.loads.append((str(model_dir), version))
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, set()
        for future in pending:
            future.set_exception(EngineClosed("engine closed"))
        self._pool.shutdown(wait=False, cancel_futures=True)


class FakeBackend:
    """A LearnerBackend that counts steps instead of training.

    `step_time` seconds are spent per update (the benchmark uses it to model
    a real learner); `save` writes a placeholder file whose digest changes
    every step.
    """

    def __init__(self, *, step_time: float = 0.0) -> None:
        self.step_time = step_time
        self.steps = 0
        self.batches: list[TrainBatch] = []

    def step(self, batch: TrainBatch) -> dict[str, float]:
        if self.step_time > 0:
            time.sleep(self.step_time)  # simulated update time
        self.steps += 1
        self.batches.append(batch)
        tokens = float(batch.loss_mask.sum())
        return {"learner/loss": 0.0, "learner/tokens": tokens, "rollout/logprob_gap": 0.0}

    def save(self, out_dir: str | Path) -> str:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # Not loadable weights: only a ScriptedEngine "loads" them.
        (out / "model.safetensors").write_bytes(f"fake weights, step {self.steps}".encode())
        digest = checkpoint_digest(out)
        (out / "DIGEST").write_text(digest + "\n")
        return digest
