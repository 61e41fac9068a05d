"""The browser suite (`pytest -m browser`, `tox -e trace`): pages driven in Debian's
``chromium --headless``.

Every test here is marked ``browser`` and skipped, with the reason, where no chromium is
on the PATH (``apt-get install -y --no-install-recommends chromium``), unless
``AGENTRL_REQUIRE_BROWSER=1`` (as in CI: .ci/run), which makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REQUIRE_ENV = "AGENTRL_REQUIRE_BROWSER"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(browser: str, profile: Path, *args: str, timeout: float = 120.0) -> str:
    """Run headless chromium with ``args`` (a fresh profile under ``profile``); its stdout."""
    command = [
        browser,
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile / 'chromium-profile'}",
        *(["--no-sandbox"] if os.geteuid() == 0 else []),  # chromium refuses root otherwise
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise AssertionError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium executable; skips (or fails, with AGENTRL_REQUIRE_BROWSER=1) without one."""
    path = find_chromium()
    if path is None:
        reason = "no chromium on PATH (apt-get install -y --no-install-recommends chromium)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason} and {REQUIRE_ENV}=1")
        pytest.skip(f"{reason}; {REQUIRE_ENV}=1 makes this a failure")
    return path
