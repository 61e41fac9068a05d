"""EventWriter files read back by TensorBoard's own event reader."""

from __future__ import annotations

import pytest

from agentrl.ops.report.tensorboard import EventWriter, crc32c


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C catalogue check value
    assert crc32c(b"") == 0


def test_tensorboard_reads_the_scalars_back(tmp_path):
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is in the dev extra",
    )
    writer = EventWriter(tmp_path)
    writer.add_scalars(1, {"rollout/reward": 0.5, "learner/loss": -1.25}, wall_time=100.0)
    writer.add_scalars(2, {"rollout/reward": 0.75, "skip/nan": float("nan"), "skip/text": "x"})
    writer.add_scalars(3, {"skip/inf": float("inf")})  # nothing finite: no event at all
    writer.close()
    acc = accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["learner/loss", "rollout/reward"]
    assert [(e.step, e.value) for e in acc.Scalars("rollout/reward")] == [(1, 0.5), (2, 0.75)]
    (loss,) = acc.Scalars("learner/loss")
    assert (loss.step, loss.value, loss.wall_time) == (1, -1.25, 100.0)
