"""A hostile agent choosing its own reward through `agentrl serve`: the real app, guard and
`EpisodeBook` on uvicorn, with the calculator task built in (no model: no completion is
made, so the book has no chat format). Classes: a non-finite reward (``1e309``, the
``NaN`` and ``Infinity`` literals), a reward outside ``serve.reward_range``, a reward of the
wrong type, a reward for a task its environment judges, a task of the run that runs on
environment workers opened as if it were the agent's own. Each is a 4xx with the reason,
and no trajectory with that reward is published."""

from __future__ import annotations

import http.client
import json
import math

import pytest

from agentrl.environments import make_task
from agentrl.ops.serve import ServeServer
from agentrl.ops.serve.episodes import EpisodeBook

KEY = "sk-test-" + "r" * 24
PENALTY = -0.2
HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


class BookService:
    """What the app calls: a real `EpisodeBook`; completions are not used here."""

    model, version = "fake", 0

    def __init__(self) -> None:
        self.published = []
        self.book = EpisodeBook(
            None,  # the chat format renders completions' prompts; none is made here
            envs={"calculator": make_task("calculator")},
            group_size=2,
            penalty=PENALTY,
            publish=self.published.append,
            version=lambda: 0,
            judged=frozenset({"calculator", "on-workers"}),
            reward_range=(0.0, 1.0),
        )

    def complete(self, *_args, **_kwargs):
        raise AssertionError("no completion is made in these tests")

    def close(self) -> None:
        pass


@pytest.fixture
def served():
    service = BookService()
    server = ServeServer(service, "127.0.0.1", 0, api_key=KEY, max_body_bytes=64 << 10,
                         max_concurrent=4)  # fmt: skip
    yield server, service
    server.close()


def _post(server, path: str, raw: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("POST", path, body=raw.encode(), headers=HEADERS)
        got = conn.getresponse()
        return got.status, json.loads(got.read())
    finally:
        conn.close()


def _open(server, task: str) -> str:
    status, body = _post(server, "/v1/episodes", json.dumps({"task": task, "group_size": 2}))
    assert status == 200, body
    return body["id"]


@pytest.mark.parametrize(
    "reward,why",
    [("1e309", "beyond a float's range"), ("-1e400", "beyond a float's range"),
     ("NaN", "NaN is not a JSON number"), ("Infinity", "Infinity is not a JSON number"),
     ("-Infinity", "-Infinity is not a JSON number")],
)  # fmt: skip
def test_a_non_finite_reward_is_malformed_json(served, reward, why):
    server, service = served
    episode = _open(server, "my-own-task")
    status, body = _post(server, f"/v1/episodes/{episode}/end", f'{{"reward": {reward}}}')
    assert status == 400 and why in body["error"]["message"], body
    assert service.published == []
    # the episode is still open: a finite reward in range ends it
    status, body = _post(server, f"/v1/episodes/{episode}/end", '{"reward": 0.5}')
    assert status == 200 and body["reward"] == 0.5
    assert [t.reward for t in service.published] == [0.5]


@pytest.mark.parametrize("reward", ["7.0", "-0.5", "1.0000001", "1e300", '"0.5"', "true"])
def test_a_reward_outside_the_range_or_not_a_number_is_refused(served, reward):
    server, service = served
    episode = _open(server, "my-own-task")
    status, body = _post(server, f"/v1/episodes/{episode}/end", f'{{"reward": {reward}}}')
    assert status == 400 and "reward" in body["error"]["message"], body
    assert service.published == []


def test_an_infinite_reward_cannot_reach_a_group(served):
    """The attack as played: both members of a group end, one with 1e309; before, the
    group's rewards held inf and its GRPO advantages were all NaN."""
    server, service = served
    first, second = _open(server, "my-own-task"), _open(server, "my-own-task")
    assert _post(server, f"/v1/episodes/{first}/end", '{"reward": 1e309}')[0] == 400
    assert _post(server, f"/v1/episodes/{first}/end", '{"reward": 1.0}')[0] == 200
    assert _post(server, f"/v1/episodes/{second}/end", '{"reward": 0.0}')[0] == 200
    rewards = [t.reward for t in service.published]
    assert rewards == [1.0, 0.0] and all(math.isfinite(r) for r in rewards)


def test_a_task_its_environment_judges_takes_no_reward_from_the_agent(served):
    server, service = served
    episode = _open(server, "calculator")
    for raw in ['{"reward": 1.0}', "{}", '{"reward": 1.0, "status": "task_limit_reached"}']:
        status, body = _post(server, f"/v1/episodes/{episode}/end", raw)
        assert status == 403, body
        assert "judged by its environment" in body["error"]["message"]
    assert service.published == []
    # giving up is allowed, for the run's penalty
    status, body = _post(server, f"/v1/episodes/{episode}/end", '{"status": "task_limit_reached"}')
    assert status == 200 and body["reward"] == PENALTY
    [traj] = service.published
    assert traj.reward == PENALTY and traj.env_reward == 0.0 and traj.status == "task_limit_reached"


def test_a_task_of_the_run_on_environment_workers_cannot_be_opened_as_the_agents_own(served):
    server, service = served
    status, body = _post(server, "/v1/episodes", '{"task": "on-workers"}')
    assert status == 400 and "environment workers" in body["error"]["message"], body
    assert service.book.open_count() == 0


@pytest.mark.parametrize("status_name", ["running", "won", ""])
def test_a_status_that_does_not_end_an_episode_is_refused(served, status_name):
    server, service = served
    episode = _open(server, "my-own-task")
    raw = json.dumps({"reward": 1.0, "status": status_name})
    status, body = _post(server, f"/v1/episodes/{episode}/end", raw)
    assert status == 400 and "status" in body["error"]["message"], body
    assert service.published == []


def test_nan_anywhere_in_a_body_is_malformed(served):
    server, service = served
    status, body = _post(server, "/v1/episodes", '{"task": "my-own-task", "group_size": NaN}')
    assert status == 400 and "NaN is not a JSON number" in body["error"]["message"], body
    assert service.book.open_count() == 0
