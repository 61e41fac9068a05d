"""The torch sampler engine (CPU or CUDA): batched token generation over a Hugging Face causal LM.

`TorchEngine` runs one background thread that owns the model. `submit` queues a
request and returns a future; the thread admits queued requests into the running
batch whenever there is room (continuous batching, up to ``max_batch`` rows),
prefills them, and decodes one token for every row per step, reusing the KV
cache. Each row's result is independent of what it is batched with (up to float
rounding). Finished rows leave the batch at once.

Recorded logprobs: for ``temperature > 0`` the logprob of the sampled token under
``log_softmax(logits / temperature)`` — the distribution *before* top-p
truncation, which is what the learner recomputes from the same logits. Top-p only
decides which tokens may be drawn. For ``temperature == 0`` (greedy) it is
``log_softmax(logits)`` at the argmax.

Weights: `load` reads and checks a checkpoint in the caller's thread and stages
it; the engine then stops admitting requests, lets the rows in flight finish on
the old weights (they report the old version), copies the new tensors into the
existing module and resumes admission with the new version.

How rows run through the model is an executor's job (`executors`): Llama-family
models take `SlotExecutor` (a lean forward over a slot KV cache with prefix
reuse: a prompt that shares a prefix with a running request or a recently
finished one only computes the rest), anything else `HFExecutor` (the HF
forward over a left-padded `DynamicCache`). Per-row sampling is in `sampling`.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from agentrl.trainer import load_causal_lm
from agentrl.trainer._device import resolve_device
from agentrl.trainer._lora import LoraError, is_adapter, merged_state

from ..base import (
    EngineError,
    Generation,
    QueuedEngine,
    WeightsMismatch,
    check_fits,
    safetensors_files,
    tied_names,
)
from .executors import Executor, HFExecutor, SlotExecutor
from .kvbatch import _Row
from .llama import unsupported
from .sampling import sample_tokens

log = structlog.get_logger(__name__)


@dataclass
class _Staged:
    """Weights read by load(), waiting for the batch to drain."""

    state: dict[str, torch.Tensor]
    version: int
    future: Future


class TorchEngine(QueuedEngine):
    """A continuously batching generation engine over an HF causal LM (CPU by default, or CUDA)."""

    _request_type = _Row

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch: int = 16,
        seed: int = 0,
        version: int = 0,
        prefix_cache_tokens: int = 16384,
        executor: str = "auto",
    ) -> None:
        """Load ``model_dir`` and start the engine thread.

        ``device``: a device name (``cpu``, ``cuda``, ``cuda:N``, ``auto``;
        ``agentrl.trainer._device``), resolved once here: the model, its KV cache
        and the logits live there. ``prefix_cache_tokens`` bounds the positions of
        finished sequences kept for prefix reuse (0 turns it off). ``executor`` is
        ``"auto"`` (the slot executor when the model supports it), ``"slot"`` or ``"hf"``.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if executor not in ("auto", "slot", "hf"):
            raise ValueError(f"executor must be auto, slot or hf, got {executor!r}")
        self._device = resolve_device(device)
        self._dtype = getattr(torch, dtype)
        self._max_batch = max_batch
        self._seeds = torch.Generator().manual_seed(seed)  # per-row seeds when none given
        self._init_queue(version)
        # The model is loaded and run on the engine thread only: torch's OpenMP parallel
        # regions from a second thread of the same process ran ~40% slower here (libgomp
        # throttles its spin-waiting once more threads than cores are in its teams).
        built: Future[str | None] = Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(built, model_dir, executor, prefix_cache_tokens),
            name="torch-engine",
            daemon=True,
        )
        self._thread.start()
        reason = built.result()  # raises what loading the model raised
        log.info(
            "engine started",
            model=str(model_dir),
            device=str(self._device),
            dtype=dtype,
            max_batch=max_batch,
            executor=type(self._exec).__name__,
            fallback_reason=reason if executor == "auto" else None,
        )

    # --- public API ----------------------------------------------------------------------

    def load(self, model_dir: str | Path, version: int) -> Future[None]:
        """Stage a safetensors checkpoint; it replaces the weights once rows in flight finish.

        Requests submitted after this returns get the new weights. The future
        resolves when the new weights are in place. A LoRA adapter checkpoint stages its
        base's weights with the adapter merged (`trainer._lora.merged_state`), so the
        engine then holds base + adapter whatever it held before.
        """
        model_dir = Path(model_dir)
        if is_adapter(model_dir):
            try:
                state = merged_state(model_dir)
            except LoraError as exc:
                raise WeightsMismatch(str(exc)) from exc
        else:
            state = _read_safetensors(model_dir)
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        check_fits(shapes, self._shapes, self._tied, model_dir)
        return self._stage(_Staged(state=state, version=version, future=Future()))

    @property
    def device(self) -> torch.device:
        """Where the model, its KV cache and the logits live (resolved at construction)."""
        return self._device

    def stats(self) -> dict[str, int]:
        """Counters: prompt positions computed and reused (prefix reuse), saved prefixes."""
        with self._lock:
            return dict(self._exec.stats())

    # --- engine thread -------------------------------------------------------------------

    def _build(self, model_dir, executor: str, prefix_cache_tokens: int) -> str | None:
        """Load the model and its executor (engine thread); the slot executor's refusal."""
        self._model = load_causal_lm(model_dir, dtype=self._dtype)
        self._model.to(self._device).eval()
        reason = unsupported(self._model)
        if executor == "slot" and reason is not None:
            raise ValueError(f"the slot executor cannot run {model_dir}: {reason}")
        self._exec: Executor
        if executor == "hf" or reason is not None:
            self._exec = HFExecutor(self._model)
        else:
            self._exec = SlotExecutor(
                self._model, slots=self._max_batch, prefix_budget=prefix_cache_tokens
            )
        self._shapes = {k: tuple(v.shape) for k, v in self._model.state_dict().items()}
        self._tied = tied_names(self._model)  # may be absent from checkpoints
        return reason

    def _run(self, built: Future, model_dir, executor: str, prefix_cache_tokens: int) -> None:
        pin_threads()
        try:
            with torch.inference_mode():
                built.set_result(self._build(model_dir, executor, prefix_cache_tokens))
        except BaseException as exc:  # the constructor raises it
            built.set_exception(exc)
            return
        try:
            with torch.inference_mode():
                while self._round():
                    pass
        except BaseException as exc:
            error = EngineError(f"engine thread failed: {exc!r}")
            error.__cause__ = exc
            log.exception("engine thread failed")
            with self._lock:
                if self._closed is None:
                    self._closed = error
        with self._lock:
            reason = self._closed
            leftovers = list(self._queue) + list(self._exec.rows)
            self._queue.clear()
            staged, self._staged = self._staged, None
        for future in [r.future for r in leftovers] + ([staged.future] if staged else []):
            if not future.done():
                future.set_exception(reason)
        log.info("engine stopped", unfinished_requests=len(leftovers))

    def _round(self) -> bool:
        """One scheduling round: maybe swap weights, admit, decode a step. False to stop."""
        staged = None
        admitted: list[_Row] = []
        with self._lock:
            idle = lambda: not (self._exec.rows or self._queue or self._staged)  # noqa: E731
            while self._closed is None and idle():
                self._lock.wait()
            if self._closed is not None:
                return False
            if self._staged is not None and not self._exec.rows:
                staged, self._staged = self._staged, None
            if self._staged is None and staged is None:
                room = self._max_batch - len(self._exec.rows)
                while self._queue and len(admitted) < room:
                    row = self._queue.popleft()
                    if row.future.set_running_or_notify_cancel():
                        admitted.append(row)
        if staged is not None:
            self._apply(staged)
            return True
        if admitted:
            self._prefill(admitted)
        elif self._exec.rows:
            self._sample(self._exec.decode(), list(self._exec.rows))
        return True

    def _apply(self, staged: _Staged) -> None:
        self._model.load_state_dict(staged.state, strict=False)
        with self._lock:
            self._exec.reset()
            self._version = staged.version
        staged.future.set_result(None)
        log.info("weights loaded", version=staged.version)

    def _prefill(self, rows: list[_Row]) -> None:
        for row in rows:
            row.version = self._version
            seed = (
                row.seed
                if row.seed is not None
                else int(torch.randint(2**62, (), generator=self._seeds))
            )
            # On the CPU whatever the engine's device: one uniform per row and step is
            # drawn from it (`sample_tokens`), so a seed draws the same tokens everywhere.
            row.generator = torch.Generator().manual_seed(seed)
        self._sample(self._exec.admit(rows), rows)

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> None:
        """Sample a token for each of ``rows`` (one logits row each); retire finished rows."""
        tokens, logprobs = sample_tokens(
            logits,
            temperatures=[r.temperature for r in rows],
            top_ps=[r.top_p for r in rows],
            generators=[r.generator for r in rows],
        )
        done: list[_Row] = []
        for row, tok, lp in zip(rows, tokens, logprobs, strict=True):
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            if tok in row.stop_ids or len(row.token_ids) >= row.max_new_tokens:
                reason = "stop" if tok in row.stop_ids else "length"
                row.future.set_result(Generation(row.token_ids, row.logprobs, row.version, reason))
                done.append(row)
        if done:
            with self._lock:
                self._exec.drop(done)

    # --- helpers -------------------------------------------------------------------------


def pin_threads() -> None:
    """Make this thread's OpenMP regions use torch's thread count.

    ``torch.set_num_threads`` sets OpenMP's count only for the thread that calls
    it; a new thread starts with one per core, and oneDNN's and MKL's own parallel
    regions use that. Measured here: with torch at 1 thread, a oneDNN matmul on a
    new thread still ran on 2 cores (CPU/wall 1.98) and slowed the learner that had
    the other core about 2x. Every thread that computes calls this first.
    """
    torch.set_num_threads(torch.get_num_threads())


def _read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint directory."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in safetensors_files(model_dir):
        try:
            state.update(load_file(str(path)))
        except (OSError, ValueError) as exc:
            raise WeightsMismatch(f"cannot read {path}: {exc}") from exc
    return state
