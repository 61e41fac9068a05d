"""Device names: spelling checked in the config, availability where a component is built."""

from __future__ import annotations

import pytest
import torch

from agentrl.actors.engines.torch import TorchEngine
from agentrl.ops import ConfigError, parse_config
from agentrl.trainer import DeviceUnavailable, TorchLearner, resolve_device
from agentrl.trainer._device import device_problem, rank_device


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:3", "auto"])
def test_accepted_names(name):
    assert device_problem(name) is None


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:x", "mps0", "", 0, None])
def test_other_names_are_refused_with_the_accepted_ones_listed(name):
    problem = device_problem(name)
    assert problem is not None and "cpu, cuda, cuda:N or auto" in problem
    with pytest.raises(ValueError, match="is not a device"):
        resolve_device(name)


def test_cpu_and_auto_without_cuda_resolve_to_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert rank_device("cpu", 3) == torch.device("cpu")


def test_cuda_without_a_gpu_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable) as info:
        resolve_device("cuda")
    message = str(info.value)
    assert "\n" not in message and "sees no CUDA device" in message and "cpu or auto" in message


def test_rank_r_goes_to_gpu_r_modulo_the_gpus_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert [rank_device("cuda", r) for r in range(3)] == [
        torch.device("cuda", 0),
        torch.device("cuda", 1),
        torch.device("cuda", 0),
    ]
    assert rank_device("cuda:1", 0) == torch.device("cuda", 1)
    with pytest.raises(DeviceUnavailable, match="only 2 CUDA device"):
        resolve_device("cuda:2")


def test_the_config_lists_bad_learner_and_pool_devices_together():
    raw = {
        "run": "r",
        "tasks": {"calculator": {}},
        "learner": {"device": "gpu"},
        "pools": {"current": {"device": "cuda:x"}, "stale": {"every": 2, "device": "cuda:1"}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    text = str(info.value)
    assert "learner.device: 'gpu' is not a device" in text
    assert "pools.current.device: 'cuda:x' is not a device" in text
    assert "pools.stale" not in text  # spelling only: a GPU node may run that pool


def test_a_pool_without_a_device_follows_the_learner():
    cfg = parse_config({"run": "r", "tasks": {"calculator": {}}, "learner": {"device": "auto"}})
    assert cfg.learner.device == "auto"
    assert all(p.device is None for p in cfg.pools.values())


def test_the_torch_learner_refuses_a_device_it_cannot_see(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable):
        TorchLearner(tmp_path / "no-model-needed", device="cuda")


def test_the_torch_engine_refuses_a_device_it_cannot_see(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable):
        TorchEngine(tmp_path / "no-model-needed", device="cuda:0")
