"""Megatron tests: skipped as a whole when megatron-core is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "megatron.core", reason="megatron-core not installed (pip install -e '.[megatron]')"
)


@pytest.fixture(scope="module")
def parallel():
    """A single-process group (gloo on CPU) with TP=1, PP=1 for one test module."""
    from agentrl.trainer.megatron import destroy_parallel, init_parallel

    init_parallel(1, 1, seed=3)
    yield
    destroy_parallel()
