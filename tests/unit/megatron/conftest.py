"""Megatron tests: skipped as a whole when megatron-core is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "megatron.core", reason="megatron-core not installed (pip install -e '.[megatron]')"
)
