"""learner.backend: megatron in the run config, and what the supervisor derives from it."""

from __future__ import annotations

import pytest

from agentrl.ops import ConfigError, parse_config
from agentrl.ops.run.engines import node_torch_threads


def test_megatron_layout_parses_and_derives_the_world_size():
    cfg = parse_config(
        {"run": "m", "learner": {"backend": "megatron", "megatron": {"tp": 2, "dp": 3}}}
    )
    assert cfg.learner.backend == "megatron"
    assert (cfg.learner.megatron.tp, cfg.learner.megatron.pp, cfg.learner.megatron.dp) == (2, 1, 3)
    assert cfg.learner.megatron.world == 6
    assert cfg.learner.megatron.state_every == 1 and cfg.learner.megatron.keep_states == 2


def test_every_megatron_problem_is_listed_at_once():
    raw = {
        "run": "m",
        "learner": {
            "backend": "deepspeed",
            "megatron": {"tp": 0, "pp": -1, "dp": "two", "state_every": 0, "keep_states": -1},
        },
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert sorted(info.value.problems) == sorted(
        [
            "learner.megatron.dp: expected int, got 'two'",
            "learner.backend: 'deepspeed' is not available (known: torch, megatron)",
            "learner.megatron.tp: must be >= 1",
            "learner.megatron.pp: must be >= 1",
            "learner.megatron.state_every: must be >= 1",
            "learner.megatron.keep_states: must be >= 0 (0 keeps all)",
        ]
    )


def test_each_learner_rank_counts_as_a_compute_process(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    torch_cfg = parse_config({"run": "m"})  # one engine + one learner process
    megatron_cfg = parse_config(
        {"run": "m", "learner": {"backend": "megatron", "megatron": {"tp": 2, "dp": 1}}}
    )
    roles = ("sampler", "learner")
    assert node_torch_threads(torch_cfg, roles) == 4  # 8 cores / 2
    assert node_torch_threads(megatron_cfg, roles) == 2  # 8 cores / (1 engine + 2 ranks)


def test_the_megatron_learner_defaults_are_the_run_configs():
    import inspect

    from agentrl.ops.config.schema import LearnerConfig
    from agentrl.trainer.megatron import MegatronLearner
    from agentrl.trainer.megatron._launch import MegatronSpec

    config = LearnerConfig()
    defaults = inspect.signature(MegatronLearner.__init__).parameters
    for name in ("lr", "kl_coef", "is_cap", "warmup_steps", "weight_decay", "grad_clip"):
        assert defaults[name].default == getattr(config, name), name
        assert getattr(MegatronSpec("m"), name) == getattr(config, name), name
