"""Without verifiers, agentrl imports and a verifiers task says how to install it.

Not marked ``verifiers``: it runs in the unit env, where verifiers is missing (here its
modules are hidden, so it runs the same where it is installed)."""

from __future__ import annotations

import sys

import pytest

from agentrl.environments import EnvError, make_task
from agentrl.environments.tasks.verifiers import library


def test_a_verifiers_task_without_the_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(library, "_modules", None)
    for name in ("verifiers", "verifiers.v1", "verifiers.v1.utils.loaders"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` then raises ImportError
    with pytest.raises(library.VerifiersMissing) as caught:
        make_task("verifiers:vf_arith")
    assert isinstance(caught.value, EnvError) and isinstance(caught.value, ImportError)
    text = str(caught.value)
    assert "\n" not in text and "pip install -e '.[verifiers]'" in text, text
