"""TP=2 and PP=2 over gloo in 2 spawned processes: logits against HF, gather_hf_state.

One spawn per layout serves both tiny models (process start and imports dominate).
"""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.megatron._dist import run_workers

from .tiny import MODELS, VOCAB, hf_logits, hf_state, input_ids
from .workers import logits_and_gather

KINDS = ("llama", "qwen2")


def _check_gathered(result: dict, kind: str) -> None:
    config, model = MODELS[kind]()
    want = hf_state(model, config)
    got = result["hf_state"]
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


@pytest.mark.slow
def test_tp2_logits_and_gather():
    ranks = run_workers(logits_and_gather, 2, 2, 1, KINDS, timeout=120.0)
    for kind in KINDS:
        want = hf_logits(MODELS[kind]()[1], input_ids())
        # each rank holds 151 of the 302 padded vocabulary columns; rank 1's last is padding
        shards = [r[kind]["shard"] for r in ranks]
        assert [s.shape[-1] for s in shards] == [151, 151]
        logits = torch.cat(shards, dim=-1)
        assert torch.isinf(logits[..., VOCAB]).all()
        torch.testing.assert_close(logits[..., :VOCAB], want, atol=1e-5, rtol=0)
        for r in ranks:  # gathered over TP: the full padded vocabulary on every rank
            torch.testing.assert_close(r[kind]["full"][..., :VOCAB], want, atol=1e-5, rtol=0)
        _check_gathered(ranks[0][kind], kind)
        assert ranks[1][kind]["hf_state"] is None


@pytest.mark.slow
def test_pp2_logits_and_gather():
    ranks = run_workers(logits_and_gather, 2, 1, 2, KINDS, timeout=120.0)
    for kind in KINDS:
        want = hf_logits(MODELS[kind]()[1], input_ids())
        assert ranks[0][kind]["shard"] is None  # first stage: no logits
        torch.testing.assert_close(ranks[1][kind]["shard"], want, atol=1e-5, rtol=0)
        _check_gathered(ranks[0][kind], kind)
