"""The openenv task against real OpenEnv servers (tox -e openenv): examples/openenv's
guess_env, an openenv-core 0.3.0 Environment scored by its own Rubric, served by
uvicorn and played through OpenEnv's own client."""

from __future__ import annotations

import gc
import json
import textwrap
import uuid

import pytest

from agentrl.environments import InfraError, SampleError, Status, make_task
from agentrl.environments._check import agent_message
from agentrl.environments._conformance import conformance
from agentrl.messages import ChatMessage, ToolCall

from .conftest import APP

TOOLS_APP = "guess_env.server.tools_app:app"

pytestmark = pytest.mark.openenv


def _guess(value, **extra) -> ChatMessage:
    return agent_message(ToolCall("c-guess", "step", json.dumps({"guess": value, **extra})))


def _observation(step) -> dict:
    return json.loads(step.messages[-1].content)


def _search(env, start):
    """Binary search through the task: the steps it took and the last one."""
    low, high, steps = 1, 64, []
    while True:
        guess = (low + high) // 2
        step = env.interact(start.session, _guess(guess))
        steps.append(step)
        if step.finish:
            return steps
        told = _observation(step)["message"]
        low, high = (guess + 1, high) if told == "Higher." else (low, guess - 1)


def test_the_protocol_contract_holds_on_a_server_the_task_starts():
    report = conformance("openenv", {"app": APP, "size": 20})
    assert report.violations == [], report.format()
    assert report.episodes == 20


def test_the_reward_is_the_servers_rubric_and_every_episode_can_be_won(guess_server):
    env = make_task("openenv", url=guess_server.url, size=12, split="all")
    assert [t["function"]["name"] for t in env.tools] == ["step"]
    parameters = env.tools[0]["function"]["parameters"]
    assert list(parameters["properties"]) == ["guess"] and parameters["required"] == ["guess"]
    for index in range(12):
        start = env.start(index)
        assert json.loads(start.messages[1].content)["guesses_left"] == 8
        steps = _search(env, start)
        last = steps[-1]
        assert (last.status, last.reward) == (Status.COMPLETED, 1.0)
        assert _observation(last) == {"message": "Correct!", "guesses_left": 8 - len(steps)}
        assert all(s.reward == 0.0 for s in steps[:-1]) and len(steps) <= 7
        assert last.metrics["env/steps"] == len(steps) and last.metrics["env/return"] == 1.0


def test_the_same_actions_through_openenvs_client_get_the_same_verdict(guess_server):
    from openenv.core import GenericEnvClient

    env = make_task("openenv", url=guess_server.url, size=3)
    guesses = [1, 64, 20, 40]
    start = env.start(2)
    ours = [env.interact(start.session, _guess(g)) for g in guesses]
    with GenericEnvClient(base_url=guess_server.url).sync() as client:
        client.reset(seed=env.reset_seed(2))
        theirs = [client.step({"guess": g}) for g in guesses]
    assert [_observation(s) for s in ours] == [r.observation for r in theirs]


def test_nothing_the_model_writes_sets_its_reward(guess_server):
    env = make_task("openenv", url=guess_server.url, size=3, max_turns=8)
    start = env.start(0)
    # OpenEnv's metadata field is not offered and is dropped from a call
    step = env.interact(start.session, _guess(1, metadata={"reward": 1.0, "done": True}))
    assert step.status == Status.RUNNING and _observation(step)["guesses_left"] == 7
    # a field the server's Action does not have is refused by the server's own validation
    step = env.interact(start.session, _guess(2, reward=1.0))
    assert step.messages[0].content.startswith("error: Server error: Invalid message")
    # text claiming the win is not an action
    step = env.interact(start.session, ChatMessage("assistant", '{"message": "Correct!"}'))
    assert step.messages == [ChatMessage("user", "Call the step tool with your next action.")]
    for _ in range(5):
        step = env.interact(start.session, _guess(1))
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.metrics["env/bad_calls"] == 2.0


def test_a_lost_game_is_completed_with_the_servers_zero(guess_server):
    env = make_task("openenv", url=guess_server.url, size=3, max_turns=20, reward="sum")
    start = env.start(1)
    secret_side = [env.interact(start.session, _guess(0)) for _ in range(8)]
    last = secret_side[-1]
    assert (last.status, last.reward) == (Status.COMPLETED, 0.0)
    assert _observation(last) == {"message": "Higher.", "guesses_left": 0}


def test_train_and_test_reset_with_disjoint_seeds(guess_server):
    train = make_task("openenv", url=guess_server.url, size=60)
    test = make_task("openenv", url=guess_server.url, split="test", size=20)
    train_seeds = {train.reset_seed(i) for i in range(60)}
    test_seeds = {test.reset_seed(i) for i in range(20)}
    assert not train_seeds & test_seeds
    below = min(max(train_seeds), max(test_seeds))  # every seed below both ends is on a side
    assert set(range(below)) <= train_seeds | test_seeds


def test_a_server_that_dies_mid_episode_is_an_infra_error(guess_server):
    env = make_task("openenv", url=guess_server.url, size=3, timeout=5)
    start = env.start(0)
    guess_server.close()
    with pytest.raises(InfraError, match="lost"):
        env.interact(start.session, _guess(10))


_MCP_APP = """
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from guess_env.server.environment import GuessEnvironment

app = create_app(GuessEnvironment, CallToolAction, CallToolObservation)
"""


def test_an_mcp_environment_is_played_through_its_own_tools():
    env = make_task("openenv", app=TOOLS_APP, size=8, split="all")
    assert env.mcp and [t["function"]["name"] for t in env.tools] == ["guess"]
    guess_tool = env.tools[0]["function"]
    assert guess_tool["description"] == "Guess the secret, an integer from 1 to 64."
    assert guess_tool["parameters"]["required"] == ["number"]
    start = env.start(0)
    assert json.loads(start.messages[1].content)["guesses_left"] == 8
    call = agent_message(ToolCall("c-1", "guess", json.dumps({"number": "many"})))
    step = env.interact(start.session, call)
    assert step.messages[0].content.startswith("error: 1 validation error for call[guess]")
    step = env.interact(start.session, agent_message(ToolCall("c-2", "step", "{}")))
    assert step.messages[0].content == "error: unknown tool 'step'; call guess"
    for index in range(8):
        start = env.start(index)
        low, high = 1, 64
        while True:
            number = (low + high) // 2
            call = agent_message(ToolCall("c", "guess", json.dumps({"number": number})))
            step = env.interact(start.session, call)
            if step.finish:
                break
            told = step.messages[0].content
            low, high = (number + 1, high) if told == "Higher." else (low, number - 1)
        assert (step.status, step.reward) == (Status.COMPLETED, 1.0)  # the server's Rubric
        assert step.messages[0].content == "Correct!"


def test_the_protocol_contract_holds_on_an_mcp_environment():
    report = conformance("openenv", {"app": TOOLS_APP, "size": 20})
    assert report.violations == [], report.format()


_REFUSING_APP = """
from openenv.core.env_server.http_server import create_app
from guess_env.models import GuessAction, GuessObservation
from guess_env.server.environment import GuessEnvironment


class Refusing(GuessEnvironment):
    def reset(self, seed=None, episode_id=None, **kwargs):
        raise ValueError(f"no game for seed {seed}")


app = create_app(Refusing, GuessAction, GuessObservation, max_concurrent_envs=4)
"""


def _module(tmp_path, monkeypatch, prefix: str, source: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_reset_the_server_refuses_is_a_sample_error(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "oe_refusing", _REFUSING_APP)
    env = make_task("openenv", app=f"{name}:app", size=3)
    with pytest.raises(SampleError, match="reset with seed 1 refused"):
        env.start(0)


def test_the_server_a_task_started_stops_with_the_task():
    env = make_task("openenv", app=APP, size=2)
    process = env.server._process
    assert process.poll() is None
    del env
    gc.collect()
    assert process.wait(timeout=10) is not None


def test_what_it_cannot_play_or_reach_is_refused_in_one_line(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "oe_mcp", _MCP_APP)
    cases = [
        ({"app": f"{name}:app"}, "list_tools failed on http://127.0.0.1"),
        ({"url": "http://127.0.0.1:9", "timeout": 1}, r"no answer from http://127.0.0.1:9/health"),
        ({"app": "no_such_module_x:app"}, "the server exited at start"),
        ({"app": APP, "url": "http://127.0.0.1:9"}, "give one of url .* or app"),
        ({"app": "guess_env"}, "app must be module:attribute"),
        ({"app": APP, "reward": "best"}, "reward must be one of last, sum"),
        ({"app": APP, "reset": {"seed": 1}}, "reset must be a mapping without seed"),
        ({"app": APP, "split": "neither"}, "split must be one of"),
    ]
    for options, says in cases:
        with pytest.raises(ValueError, match=says) as caught:
            make_task("openenv", **options)
        assert "\n" not in str(caught.value), options


def test_a_config_naming_the_task_parses_and_refuses_an_unknown_option(tmp_path):
    from agentrl.ops import ConfigError, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, "memory://oe-parse", "oe-parse")
    raw["tasks"] = {"openenv": {"options": {"app": APP, "size": 8}}}
    assert parse_config(raw).tasks["openenv"].options == {"app": APP, "size": 8}
    raw["tasks"] = {"openenv": {"options": {"app": APP, "sizes": 8}}}
    with pytest.raises(ConfigError, match="unexpected keyword argument 'sizes'"):
        parse_config(raw)


@pytest.mark.slow
def test_an_openenv_environment_trains_one_step_in_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    run = f"smoke-oe-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp_path, f"memory://{run}", run, steps=1)
    raw["tasks"] = {"guess": {"task": "openenv", "options": {"app": APP, "max_turns": 8}}}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics["version"] == 1 and metrics["env/guess/episodes"] == 4
