"""Without reasoning-gym, agentrl imports and a reasoning_gym task says how to install it.

Not marked ``reasoning_gym``: it runs in the unit env, where reasoning-gym is missing (here
its modules are hidden, so it runs the same where it is installed)."""

from __future__ import annotations

import sys

import pytest

from agentrl.environments import EnvError, make_task
from agentrl.environments.tasks.reasoning_gym import library


def test_a_reasoning_gym_task_without_the_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(library, "_modules", None)
    for name in ("reasoning_gym", "reasoning_gym.factory", "reasoning_gym.utils"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` then raises ImportError
    with pytest.raises(library.ReasoningGymMissing) as caught:
        make_task("reasoning_gym:basic_arithmetic")
    assert isinstance(caught.value, EnvError) and isinstance(caught.value, ImportError)
    text = str(caught.value)
    assert "\n" not in text and "pip install -e '.[reasoning-gym]'" in text, text
