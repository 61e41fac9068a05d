"""The example tasksets of examples/verifiers importable by id, as verifiers resolves them."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verifiers"


@pytest.fixture(autouse=True)
def _example_tasksets(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
