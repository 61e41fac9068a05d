"""The live progress line (`ops._progress`): batch metrics, and the first minutes before."""

from __future__ import annotations

import threading

from agentrl.messages import Trajectory
from agentrl.ops._progress import EpisodeTally, format_progress, format_summary


def _traj(task: str, reward: float, env_reward: float, status: str = "completed", **metrics):
    return Trajectory(
        episode_id=f"{task}-{reward}-{len(metrics)}",
        group_id="g",
        task=task,
        index=0,
        sample_idx=0,
        group_size=1,
        issued_version=0,
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        versions=[],
        pools=[],
        reward=reward,
        env_reward=env_reward,
        status=status,
        num_turns=1,
        timings={},
        metrics=dict(metrics),
    )


def test_the_tally_counts_per_task_and_keeps_untrained_episodes_apart():
    tally = EpisodeTally()
    tally.add(_traj("db", 1.0, 1.0))
    tally.add(_traj("db", -0.2, 0.0, "task_limit_reached"))
    tally.add(_traj("kg", 0.0, 0.0))
    tally.add(_traj("kg", -0.2, 0.0, "task_error", infra_failure=1.0))
    # db: rewards 1.0 and -0.2 -> mean +0.40, one success of two
    assert tally.snapshot() == {
        "db": (2, 0.4, 0.5),
        "kg": (1, 0.0, 0.0),
        "untrained": (1, 0.0, 0.0),
    }


def test_the_tally_is_safe_from_several_rollout_threads():
    tally = EpisodeTally()
    threads = [
        threading.Thread(target=lambda: [tally.add(_traj("os", 1.0, 1.0)) for _ in range(500)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tally.snapshot() == {"os": (2000, 1.0, 1.0)}


def test_before_the_first_update_the_line_shows_finished_episodes():
    tally = {"db": (3, 1 / 3, 1 / 3), "os": (2, -0.2, 0.0), "untrained": (1, 0.0, 0.0)}
    line = format_progress({}, {"episodes": 4}, tally, start_version=8, batch_episodes=16)
    assert line == (
        "v8 | before the first update: 5 episodes (16 per update) | db 3 r=+0.33 s=0.33 "
        "| os 2 r=-0.20 s=0.00 "
        "| untrained 1 | q episodes=4"
    )


def test_after_an_update_the_line_shows_the_batch_metrics():
    metrics = {
        "version": 9,
        "rollout/episodes_per_s": 0.5,
        "env/db/reward": 0.41,
        "env/db/success": 0.5,
        "learner/idle_ratio": 0.12,
    }
    line = format_progress(metrics, {"episodes": 4}, {"db": (3, 0.0, 0.0)}, start_version=8)
    assert line == "v9 | 0.50 ep/s | db r=+0.41 s=0.50 | idle 12% | q episodes=4"
    assert format_progress({}, {}) == "v0"  # nothing known yet, no tally: the version only


def test_the_end_of_run_summary_lists_every_task():
    tally = {"calculator": (12, 0.4318, 0.5), "db": (4, -0.2, 0.0), "untrained": (1, 0.0, 0.0)}
    assert format_summary("local", tally, 0, 3) == (
        "run local: v0 -> v3, 16 episodes on this node\n"
        "  calculator    12 episodes  reward +0.43  success 0.50\n"
        "  db             4 episodes  reward -0.20  success 0.00\n"
        "  untrained      1 episodes  (infra or sample errors)"
    )
