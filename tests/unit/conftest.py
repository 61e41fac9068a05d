"""Shared unit-test fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (with its ChatML chat template).

    Taken from the ``tiny`` model directory, built once into the model cache.
    """
    from agentrl.trainer._models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("tiny"))
