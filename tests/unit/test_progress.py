"""The live progress line (`ops.run.progress`): batch metrics, and the first minutes before."""

from __future__ import annotations

import threading

from agentrl.messages import Trajectory
from agentrl.ops.run.progress import EpisodeTally, format_progress, format_summary


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


def test_every_line_after_an_update_says_what_is_in_flight_and_done_since_it():
    metrics = {"version": 9, "env/db/reward": 0.41, "env/db/success": 0.5}
    line = format_progress(metrics, {"episodes": 4}, {"db": (30, 0.0, 0.0)}, flight=(3, 5))
    assert line == "v9 | db r=+0.41 s=0.50 | 3 in flight, 5 finished since v9 | q episodes=4"
    # before the first update: the in-flight count beside the finished ones
    first = format_progress({}, {}, {"db": (2, 0.0, 0.0)}, batch_episodes=16, flight=(4, 2))
    assert first == "v0 | before the first update: 2 episodes (16 per update), 4 in flight | " \
        "db 2 r=+0.00 s=0.00"  # fmt: skip
    # a node without the learner: the announced version ends "before the first update"
    elsewhere = format_progress({}, {}, {"db": (2, 0.0, 0.0)}, flight=(1, 0), announced=3)
    assert elsewhere == "v3 | 1 in flight, 0 finished since v3"


def test_the_tally_counts_in_flight_and_restarts_its_count_at_each_update():
    tally = EpisodeTally()
    open_served = [2]
    tally.count_open(lambda: open_served[0])  # the endpoint's open episodes
    tally.running(+1)
    tally.running(+1)
    assert tally.in_flight() == 4
    tally.add(_traj("db", 1.0, 1.0))
    tally.running(-1)
    tally.add(_traj("db", 0.0, 0.0, infra_failure=1.0))  # untrained ones finished too
    assert (tally.in_flight(), tally.finished_since_update()) == (3, 2)
    tally.mark(1)
    assert (tally.version, tally.finished_since_update()) == (1, 0)
    tally.add(_traj("db", 1.0, 1.0))
    tally.mark(1)  # the same version announced again (a second listener): no restart
    assert tally.finished_since_update() == 1
    assert tally.snapshot()["db"] == (2, 1.0, 1.0)  # the totals go on over updates


def test_the_progress_line_follows_the_checkpoints_fanout(broker):
    from agentrl.actors import TopologySpec, declare
    from agentrl.messages import CheckpointReady, Topology, connect, encode
    from agentrl.ops.run.progress import Progress
    from tests.unit.test_actors import wait_for

    spec = TopologySpec(run="p", pools=("current",), trajectory_capacity=8)
    transport = connect(broker, name="status")
    declare(transport, spec)
    progress = Progress(transport, Topology("p"), ("current",), start_version=2)
    try:
        progress.tally.add(_traj("db", 1.0, 1.0))
        assert "before the first update: 1 episodes" in progress.line({})
        ready = CheckpointReady(version=3, uri="/x", digest="d", created_at=0.0)
        transport.publish(Topology("p").checkpoints, "", encode(ready, run="p")).result(5)
        wait_for(lambda: progress.tally.version == 3, what="the announcement")
        assert progress.line({}).startswith("v3 | 0 in flight, 0 finished since v3 | q ")
    finally:
        progress.close()


def test_served_episodes_are_counted_in_flight_and_when_they_end(
    tmp_path, broker, smollm_tokenizer
):
    from agentrl.messages import ChatMessage, GenerateResult
    from agentrl.ops import parse_config
    from agentrl.ops.serve import ServeService
    from tests.smoke_helpers import smoke_config

    cfg = parse_config(smoke_config(tmp_path, broker, "served"))
    tally = EpisodeTally()
    service = ServeService(cfg, smollm_tokenizer, version=0, node="n", on_episode=tally.add)
    tally.count_open(service.book.open_count)
    try:
        book = service.book
        episode, messages, tools = book.open("calculator")
        assert tally.in_flight() == 1
        book.prompt(episode, messages, tools)
        result = GenerateResult(request_id="r", token_ids=[1, 2], logprobs=[-0.1, -0.2],
                                version=0, pool="current", finish_reason="stop")  # fmt: skip
        book.sampled(episode, result, ChatMessage(role="assistant", content="7"), False)
        book.end(episode, 1.0)
        assert tally.in_flight() == 0 and tally.finished_since_update() == 1
        assert tally.snapshot() == {"calculator": (1, 1.0, 1.0)}
    finally:
        service.close()
