"""Fixtures of the BFCL tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (the ``tiny`` model's)."""
    from agentrl.trainer._models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("tiny"))
