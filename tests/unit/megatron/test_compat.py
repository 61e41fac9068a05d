"""The CPU shim: each redirected CUDA path works on a CPU-only torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

# Imported by name before the shim runs, as a learner module might.
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32, get_grad_norm_fp32

from agentrl.trainer.megatron import build_gpt_model, ensure_cpu_compat, load_hf_into

from .tiny import MODELS, hf_state, input_ids

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the shim is CPU-only")


def test_importing_the_package_does_not_import_megatron():
    code = (
        "import sys, agentrl.trainer, agentrl.trainer.megatron; "
        "assert 'megatron' not in sys.modules, sorted(m for m in sys.modules if 'megatron' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_idempotent(parallel):
    from megatron.core.transformer import utils

    patched = utils.torch
    ensure_cpu_compat()
    assert utils.torch is patched and utils.torch is not torch


def test_causal_mask_on_cpu(parallel):
    from megatron.core.transformer.utils import get_default_causal_mask

    mask = get_default_causal_mask(3)
    assert mask.device.type == "cpu"
    assert mask.tolist() == [[False, True, True], [False, False, True], [False, False, False]]


def test_rng_tracker_forks_the_cpu_generator(parallel):
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    before = torch.get_rng_state()
    with get_cuda_rng_tracker().fork():
        inside = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)  # default stream restored
    with get_cuda_rng_tracker().fork():
        again = torch.rand(4)
    assert not torch.equal(inside, again)  # the tracked stream advanced
    assert not torch.equal(torch.rand(4), inside)


def test_grad_norm_and_clip_on_cpu(parallel):
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([3.0, 4.0])
    assert get_grad_norm_fp32([param.grad]) == pytest.approx(5.0)  # sqrt(3^2 + 4^2)
    clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=5.0)
    # coefficient 1 / (5 + 1e-6): [3, 4] -> [0.6, 0.8]
    torch.testing.assert_close(param.grad, torch.tensor([0.6, 0.8]))


def test_forward_backward_schedule_on_cpu(parallel):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    config, hf = MODELS["llama"]()
    model = build_gpt_model(config)
    load_hf_into(model, hf_state(hf, config), config)
    ids = input_ids()

    def step(batches, model):
        batch = next(batches)
        out = model(batch, torch.arange(batch.shape[1]).expand_as(batch), None, labels=batch)

        def loss_func(per_token):
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach()}

        return out, loss_func

    result = get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter([ids]),
        model=[model],
        num_microbatches=1,
        seq_length=ids.shape[1],
        micro_batch_size=ids.shape[0],
    )
    assert torch.isfinite(result[0]["loss"])
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
