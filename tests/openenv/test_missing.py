"""Without openenv-core, agentrl imports and the openenv task says how to install it.

Not marked ``openenv``: it runs in the unit env, where openenv-core is missing (here its
modules are hidden, so it runs the same where it is installed)."""

from __future__ import annotations

import sys

import pytest

from agentrl.environments import EnvError, make_task
from agentrl.environments.tasks.openenv import library


def test_the_openenv_task_without_the_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(library, "_modules", None)
    for name in ("openenv", "openenv.core", "openenv.core.generic_client"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` then raises ImportError
    with pytest.raises(library.OpenEnvMissing) as caught:
        make_task("openenv", url="http://127.0.0.1:9")
    assert isinstance(caught.value, EnvError) and isinstance(caught.value, ImportError)
    text = str(caught.value)
    assert "\n" not in text and "pip install -e '.[openenv]'" in text, text
