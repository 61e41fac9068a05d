"""The whole loop, all four actors, in-process broker, tiny model, two learner updates."""

import uuid

import pytest

from tests.smoke_helpers import run_smoke


@pytest.mark.slow
def test_two_learner_steps_on_the_in_process_broker(tmp_path):
    metrics = run_smoke(tmp_path, f"memory://smoke-{uuid.uuid4().hex[:6]}", "smoke")
    shares = {k for m in metrics for k in m if k.startswith("rollout/pool_share/")}
    assert shares <= {"rollout/pool_share/current", "rollout/pool_share/stale"}
