"""MegatronLearner's resumable state: TP=2 -> TP=1 resharding, and a learner restarted after
a checkpoint continuing from it with no trajectory lost or trained twice."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pykka
import pytest
import torch

from agentrl.actors import LearnerActor, TopologySpec
from agentrl.messages import Topology, Trajectory, connect, encode
from agentrl.messages._memory import reset_memory_broker
from agentrl.ops import latest_checkpoint
from agentrl.trainer.megatron import MegatronLearner
from agentrl.trainer.megatron._launch import WorkerDied
from tests.unit.records import trajectory

from .learner_cases import (
    HYPER,
    TOL,
    hf_weights,
    make_batch,
    max_metric_diff,
    max_weight_diff,
    save_model,
)
from .tiny import VOCAB


@pytest.mark.slow
def test_a_tp2_state_resumes_at_tp1_with_the_same_weights_and_moments(tmp_path: Path):
    model_dir = save_model("llama", tmp_path / "llama")
    state = tmp_path / "learner_state"
    first, second = make_batch(1), make_batch(2)
    tp2 = MegatronLearner(model_dir, tp=2, state_dir=state, **HYPER)
    try:
        tp2.step(first)
        tp2.save(tmp_path / "v1")  # + learner_state/v000001, in TP=2 shards
        expected = tp2.step(second)
        tp2.save(tmp_path / "v2")
        tp2._procs[0].kill()  # a dead rank is reported, not waited on
        tp2._procs[0].wait()
        with pytest.raises(WorkerDied, match="rank 1"):
            tp2.step(first)
    finally:
        tp2.close()
    assert (state / "v000001" / "metadata.json").exists()

    # Started from the *original* weights at version 1: weights and AdamW moments must
    # both come from the TP=2 state, resharded to TP=1.
    tp1 = MegatronLearner(model_dir, tp=1, version=1, state_dir=state, **HYPER)
    try:
        tp1.save(tmp_path / "r1")
        assert max_weight_diff(hf_weights(tmp_path / "v1"), hf_weights(tmp_path / "r1")) == 0.0
        got = tp1.step(second)
        tp1.save(tmp_path / "r2")
    finally:
        tp1.close()
    assert max_metric_diff(expected, got) < TOL, (expected, got)
    # Fresh moments would give a different second update (Adam's first step is ~lr * sign).
    assert max_weight_diff(hf_weights(tmp_path / "v2"), hf_weights(tmp_path / "r2")) < TOL


# --- a learner restarted after a checkpoint ------------------------------------------------


def _group(name: str, issued: int) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(issued)
    return [
        trajectory(
            [0] * 3 + [1] * (6 + i),
            group=name,
            reward=float(i),
            logprob=-5.0,
            episode_id=f"{name}-{i}",
            issued_version=issued,
            token_ids=torch.randint(0, VOCAB, (9 + i,), generator=gen).tolist(),
        )
        for i in range(2)
    ]


class _Run:
    """A learner actor on the memory broker with a MegatronLearner, like the supervisor's."""

    def __init__(self, broker: str, spec: TopologySpec, root: Path, model_dir: Path) -> None:
        self.broker, self.spec, self.root, self.model_dir = broker, spec, root, model_dir
        self.trained: dict[int, list[str]] = {}

    def until(self, steps: int) -> None:
        """Start from the newest checkpoint (as the supervisor does), stop at ``steps``
        updates of the run (``max_steps`` counts the run's, not this start's)."""
        latest = latest_checkpoint(self.root / "checkpoints")
        version, weights = latest if latest else (0, self.model_dir)
        backends: list[MegatronLearner] = []

        def factory() -> MegatronLearner:
            backends.append(
                MegatronLearner(
                    weights,
                    version=version,
                    reference_dir=self.model_dir,  # KL to the initial policy, as before
                    state_dir=self.root / "learner_state",
                    **HYPER,
                )
            )
            return backends[-1]

        done = threading.Event()
        ref = LearnerActor.start(
            broker=self.broker,
            topology=self.spec,
            backend_factory=factory,
            checkpoint_dir=self.root / "checkpoints",
            start_version=version,
            group_size=2,
            groups_per_batch=1,
            hard_staleness=8,
            prefetch=64,
            pad_id=0,
            max_steps=steps,
            on_batch=lambda v, batch: self.trained.setdefault(
                v, sorted(t.episode_id for t in batch)
            ),
            done=done,
        )
        try:
            assert done.wait(120), "the learner did not finish its steps"
        finally:
            ref.stop()  # unacked trajectories go back to the queue
            for backend in backends:
                backend.close()


def _publish(broker: str, spec: TopologySpec, groups: list[list[Trajectory]]) -> None:
    client = connect(broker, name="test-client")
    try:
        Topology(spec.run).declare(client, list(spec.pools), spec.trajectory_capacity)
        for group in groups:
            for t in group:
                client.publish("", Topology(spec.run).trajectories, encode(t, run=spec.run)).result(
                    5
                )
    finally:
        client.close()


def test_a_learner_restarted_after_a_checkpoint_continues_from_it(tmp_path: Path):
    model_dir = save_model("qwen2", tmp_path / "qwen2")
    groups = [_group("g1", 0), _group("g2", 1), _group("g3", 2)]
    runs = {}
    for label, stops in (("straight", [3]), ("restarted", [1, 3])):
        name = f"resume-{uuid.uuid4().hex[:8]}"
        broker, spec = f"memory://{name}", TopologySpec(f"r{name[-6:]}", ("current",), 64)
        try:
            _publish(broker, spec, groups)
            run = _Run(broker, spec, tmp_path / label, model_dir)
            for stop in stops:  # the first restarted run is killed after its checkpoint v1
                run.until(stop)
            runs[label] = run
        finally:
            pykka.ActorRegistry.stop_all()
            reset_memory_broker(name)

    straight, restarted = runs["straight"], runs["restarted"]
    # Each update trained the same group, none twice, none lost.
    assert (
        restarted.trained
        == straight.trained
        == {
            1: ["g1-0", "g1-1"],
            2: ["g2-0", "g2-1"],
            3: ["g3-0", "g3-1"],
        }
    )
    assert (tmp_path / "restarted" / "learner_state" / "v000001").exists() is False  # kept 2
    final = [hf_weights(tmp_path / label / "checkpoints" / "v000003") for label in runs]
    assert max_weight_diff(*final) < TOL  # the restart resumed the AdamW moments too


@pytest.mark.slow
def test_after_rank_0_fails_mid_step_close_kills_the_workers_instead_of_waiting(tmp_path):
    model_dir = save_model("llama", tmp_path / "llama")
    learner = MegatronLearner(model_dir, dp=2, **HYPER)
    worker = learner._procs[0]

    def fail(batch):  # rank 0 gives up after rank 1 has started the step's collectives
        raise RuntimeError("rank 0 failed")

    learner._rank.step = fail
    with pytest.raises(RuntimeError, match="rank 0 failed"):
        learner.step(make_batch(1))
    closer = threading.Thread(target=learner.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close() waited on a worker stuck in a collective"
    assert worker.returncode is not None
