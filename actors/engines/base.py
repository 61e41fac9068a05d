"""What every sampler engine shares: its records, errors and request checks, the
weights-fit check, and `QueuedEngine`: the request queue and version bookkeeping.

An engine (TorchEngine, VLLMEngine) subclasses `QueuedEngine` and runs its own
thread that takes requests from ``_queue`` and applies ``_staged`` weights once
the requests in flight have finished; every public method here is thread-safe.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "EngineClosed",
    "EngineError",
    "Generation",
    "QueuedEngine",
    "SamplerEngine",
    "WeightsMismatch",
    "check_fits",
    "check_request",
    "safetensors_files",
    "tied_names",
]


@dataclass(frozen=True, slots=True)
class Generation:
    """The completion of one generate request."""

    token_ids: list[int]
    """Sampled token ids; ends with the stop token when finish_reason is 'stop'."""
    logprobs: list[float]
    """Logprob of each sampled token under the distribution it was drawn from (see module doc)."""
    version: int
    """Version of the weights that generated every token."""
    finish_reason: str
    """'stop' (a stop id was sampled) or 'length' (max_new_tokens reached)."""


class EngineError(Exception):
    """Raised when the engine fails to generate (the cause is chained)."""


class EngineClosed(EngineError):
    """Raised by submit/load on a closed engine; set on requests still pending at close()."""


class WeightsMismatch(EngineError):
    """Raised by load() when a checkpoint's tensors do not fit the engine's model."""


def check_request(prompt_ids, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """Raise ValueError for request parameters no engine accepts (shared by every engine)."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


class SamplerEngine(Protocol):
    """What a sampler needs from an engine. Every method is thread-safe."""

    version: int
    """Weights version that a request submitted now is generated with."""

    def submit(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_ids: Sequence[int],
        seed: int | None = None,
    ) -> Future[Generation]: ...

    def load(self, model_dir: str | Path, version: int) -> Future[None]: ...

    def close(self) -> None: ...


class QueuedEngine:
    """Request queue, staged loads, version labels and close shared by the engines.

    Subclasses call `_init_queue` in ``__init__``, set ``_request_type`` (a record
    built from ``submit``'s arguments plus ``future``) and ``_thread``, and serve
    ``_queue`` / ``_staged`` under ``_lock`` on that thread.
    """

    _request_type: type
    _thread: threading.Thread

    def _init_queue(self, version: int) -> None:
        self._lock = threading.Condition()
        self._queue: collections.deque[Any] = collections.deque()
        self._staged: Any = None  # a load waiting for the requests in flight
        self._version = version  # weights in the model
        self._target = version  # weights that the next admitted request gets
        self._closed: BaseException | None = None

    @property
    def version(self) -> int:
        """Weights version that a request submitted now is generated with."""
        with self._lock:
            return self._target

    @version.setter
    def version(self, value: int) -> None:
        """Relabel the weights in place (e.g. a run resumed from checkpoint ``value``)."""
        with self._lock:
            if self._staged is not None:
                raise EngineError("cannot relabel the version while a load is pending")
            self._version = self._target = value

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
        """Queue a request; the future resolves with its `Generation`."""
        check_request(prompt_ids, max_new_tokens, temperature, top_p)
        request = self._request_type(
            prompt_ids=list(prompt_ids),
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            stop_ids=frozenset(stop_ids),
            seed=seed,
            future=Future(),
        )
        with self._lock:
            self._check_open()
            self._queue.append(request)
            self._lock.notify_all()
        return request.future

    def generate_many(self, prompts: Sequence[list[int]], **params) -> list[Generation]:
        """Submit every prompt at once and wait for all results (in prompt order)."""
        futures = [self.submit(p, **params) for p in prompts]
        return [f.result() for f in futures]

    def _stage(self, staged: Any) -> Future[None]:
        """Make ``staged`` (with ``version`` and ``future``) the next weights; a load
        not yet applied is superseded (its future resolves at once)."""
        with self._lock:
            self._check_open()
            if self._staged is not None:
                self._staged.future.set_result(None)
            self._staged = staged
            self._target = staged.version
            self._lock.notify_all()
        return staged.future

    def close(self) -> None:
        """Stop the engine thread; pending and running requests fail with `EngineClosed`."""
        with self._lock:
            if self._closed is None:
                self._closed = EngineClosed("engine closed")
            self._lock.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise EngineClosed(f"engine is closed: {self._closed}") from self._closed


def tied_names(model) -> set[str]:
    """Parameter names that share storage with an earlier parameter (tied embeddings)."""
    first: dict[int, str] = {}
    params = model.named_parameters(remove_duplicate=False)
    return {name for name, p in params if first.setdefault(id(p), name) != name}


def check_fits(
    shapes: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    tied: set[str],
    source,
) -> None:
    """Raise `WeightsMismatch` unless a checkpoint's tensor ``shapes`` fit the model's.

    ``expected`` are the model's names and shapes; names in ``tied`` (tied
    embeddings) may be absent from the checkpoint. Shared by every engine.
    """
    problems = [
        f"{k}: shape {shape} != {expected[k]}"
        for k, shape in shapes.items()
        if k in expected and shape != expected[k]
    ]
    problems += [f"{k}: not a parameter of the model" for k in shapes if k not in expected]
    missing = [k for k in expected if k not in shapes and k not in tied]
    problems += [f"{k}: missing" for k in missing]
    if problems:
        raise WeightsMismatch(f"checkpoint {source}: " + "; ".join(problems[:10]))


def safetensors_files(model_dir: Path) -> list[Path]:
    """The files of a (possibly sharded) safetensors checkpoint directory, in order."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightsMismatch(f"no safetensors files in {model_dir}")
    return files
