"""LearnerBackend conformance: the torch learner (tiny model) and the fake backend."""

import pytest

from agentrl.actors._fakes import FakeBackend
from agentrl.messages import Trajectory
from agentrl.trainer import TorchLearner, build_batch, checkpoint_digest, resolve_model
from tests.unit.records import trajectory


def _traj(i: int, reward: float) -> Trajectory:
    return trajectory(
        [0, 0, 1, 1, 1],
        reward=reward,
        logprob=-2.0,
        episode_id=f"e{i}",
        sample_idx=i,
        token_ids=[10 + i, 11, 12, 13, 14],
    )


@pytest.fixture(params=["torch", "fake"])
def backend(request):
    if request.param == "torch":
        return TorchLearner(resolve_model("tiny"), lr=1e-3)
    return FakeBackend()


def test_step_returns_the_documented_metrics(backend):
    stats = backend.step(build_batch([_traj(0, 1.0), _traj(1, 0.0)], pad_id=0))
    for key in ("learner/loss", "learner/tokens", "rollout/logprob_gap"):
        assert isinstance(stats[key], float), key
    assert stats["learner/tokens"] == 6.0  # 3 assistant tokens in each of 2 rows


def test_save_writes_a_digest_that_changes_with_the_weights(backend, tmp_path):
    batch = build_batch([_traj(0, 1.0), _traj(1, 0.0)], pad_id=0)
    backend.step(batch)
    first = backend.save(tmp_path / "a")
    assert (
        first
        == checkpoint_digest(tmp_path / "a")
        == (tmp_path / "a" / "DIGEST").read_text().strip()
    )
    backend.step(batch)
    assert backend.save(tmp_path / "b") != first
