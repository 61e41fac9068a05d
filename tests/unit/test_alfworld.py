"""The alfworld task: generated ALFWorld-style scenes, the simulator's rules, the real adapter."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import threading
import types
import uuid
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments._protocol import InfraError, SessionClosed, Status
from agentrl.environments.tasks.alfworld.protocol import (
    available_actions,
    observation,
    opening,
)
from agentrl.environments.tasks.alfworld.real import (
    AlfworldDataError,
    AlfworldUnavailable,
    load_game_list,
)
from agentrl.environments.tasks.alfworld.scene import (
    OPENABLE,
    TASK_TYPES,
    Scene,
    generate,
    kind_of,
    solution,
)
from agentrl.environments.tasks.alfworld.task import NO_TOOL_CALL, NO_VALID_CALL, AlfworldTask
from agentrl.environments.tasks.alfworld.world import NOTHING, World, list_phrase
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops.cli import agentrl_env as cli_env

AGENTBENCH_ALFWORLD = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "alfworld" / "dev.json"
)


def _act(*commands: str) -> ChatMessage:
    calls = [
        ToolCall(f"c{i}", "take_action", json.dumps({"action": c})) for i, c in enumerate(commands)
    ]
    return ChatMessage("assistant", "", calls)


def _kitchen(task_type: str, target: str = "apple", destination: str | None = "countertop"):
    """A small hand-made kitchen: apples in the fridge, a knife and a mug outside."""
    receps = ("countertop 1", "fridge 1", "microwave 1", "sinkbasin 1", "drawer 1", "cabinet 1")
    placement = (
        ("apple 1", "fridge 1"),
        ("apple 2", "fridge 1"),
        ("knife 1", "countertop 1"),
        ("mug 1", "cabinet 1"),
    )
    return Scene(
        0, "kitchen", task_type, target, destination, receps, (5, 6, 7, 8, 9, 10), placement
    )


def _bedroom():
    receps = ("desk 1", "sidetable 1", "bed 1")
    placement = (("desklamp 1", "desk 1"), ("book 1", "bed 1"), ("pen 1", "sidetable 1"))
    return Scene(0, "bedroom", "look_at_obj", "book", None, receps, (1, 2, 3), placement)


def _play(world: World, *commands: str) -> list[str]:
    return [world.step(c).observation for c in commands]


# --- the built-in set and the check agents ---------------------------------------------------


def test_oracle_succeeds_everywhere_and_random_nowhere():
    env = make_task("alfworld")
    assert env.num_instances == 60
    assert check("alfworld", env, "oracle").success_rate == 1.0
    for seed in range(3):
        report = check("alfworld", env, "random", seed=seed)
        # random well-formed commands for 20 turns: observed 0/60 on seeds 0-2; bound 5%
        assert report.success_rate <= 0.05, report.format()


def test_the_planner_solves_every_type_over_many_seeds_and_no_goal_holds_at_the_start():
    for seed in range(8):
        for index in range(48):
            scene = generate(index, TASK_TYPES[index % 6], seed)
            world = World(scene)
            assert not world.won(), scene
            for command in solution(scene):
                outcome = world.step(command)
                assert outcome.valid, (command, outcome, scene)
            assert world.won(), (scene.goal, solution(scene))


def test_scenes_are_deterministic_balanced_and_filtered():
    assert generate(7, "pick_two_obj", 3) == generate(7, "pick_two_obj", 3)
    assert generate(7, "pick_two_obj", 3) != generate(7, "pick_two_obj", 4)
    env = AlfworldTask(num_instances=60)
    counts = {t: 0 for t in TASK_TYPES}
    for i in range(60):
        counts[env.task_type(i)] += 1
    assert set(counts.values()) == {10}
    rooms = {env.scene(i).room for i in range(60)}
    assert rooms == {"kitchen", "bedroom", "bathroom", "livingroom"}
    only = AlfworldTask(num_instances=12, task_types=["look_at_obj", "pick_heat_then_place"])
    assert {only.scene(i).task_type for i in range(12)} == {"look_at_obj", "pick_heat_then_place"}
    assert {only.scene(i).room for i in range(12) if only.task_type(i) == "look_at_obj"} <= {
        "bedroom",
        "livingroom",
    }
    assert check("alfworld", only, "oracle").success_rate == 1.0
    with pytest.raises(ValueError, match="task_types"):
        AlfworldTask(task_types=["make_coffee"])
    with pytest.raises(IndexError):
        env.start(60)


def test_goal_texts_follow_alfworld():
    texts = {t: generate(i, t).goal for i, t in enumerate(TASK_TYPES)}
    assert texts["pick_and_place"].startswith("put a ")
    assert texts["pick_clean_then_place"].startswith("put a clean ")
    assert texts["pick_heat_then_place"].startswith("put a hot ")
    assert texts["pick_cool_then_place"].startswith("put a cool ")
    assert texts["look_at_obj"].startswith("look at ")
    assert texts["look_at_obj"].endswith(" under the desklamp")
    assert texts["pick_two_obj"].startswith("put two ")


# --- the rules -----------------------------------------------------------------------------


def test_a_closed_receptacle_hides_its_contents_until_opened():
    world = World(_kitchen("pick_and_place"))
    arrive, take = _play(world, "go to fridge 1", "take apple 1 from fridge 1")
    assert arrive == "You arrive at loc 6. The fridge 1 is closed." and take == NOTHING
    assert _play(world, "examine fridge 1") == ["The fridge 1 is closed."]
    opened = world.step("open fridge 1").observation
    assert (
        opened
        == "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1, and a apple 2."
    )
    assert _play(world, "close fridge 1", "take apple 1 from fridge 1") == [
        "You close the fridge 1.",
        NOTHING,
    ]
    assert _play(world, "go to countertop 1") == [
        "You arrive at loc 5. On the countertop 1, you see a knife 1."
    ]
    # every openable receptacle of a generated scene starts closed
    scene = generate(1, "pick_cool_then_place")
    fresh = World(scene)
    for recep in scene.receptacles:
        if kind_of(recep) in OPENABLE:
            assert fresh.describe(recep) == f"The {recep} is closed."


def test_one_object_in_hand_at_a_time_and_only_from_where_you_are():
    world = World(_kitchen("pick_and_place"))
    assert world.step("take knife 1 from countertop 1").observation == NOTHING  # not there yet
    assert _play(world, "go to countertop 1", "take knife 1 from countertop 1") == [
        "You arrive at loc 5. On the countertop 1, you see a knife 1.",
        "You pick up the knife 1 from the countertop 1.",
    ]
    assert _play(world, "inventory") == ["You are carrying: a knife 1."]
    _play(world, "go to fridge 1", "open fridge 1")
    assert world.step("take apple 1 from fridge 1").observation == NOTHING  # hands full
    assert world.step("put knife 1 in/on fridge 1").observation == NOTHING  # knives don't fit
    _play(world, "go to countertop 1", "put knife 1 in/on countertop 1")
    assert _play(world, "inventory") == ["You are not carrying anything."]
    assert world.step("go to countertop 1").observation == NOTHING  # already there


def test_put_only_into_the_open_receptacle_you_are_at():
    world = World(_kitchen("pick_and_place", "mug", "cabinet"))
    _play(world, "go to cabinet 1", "open cabinet 1", "take mug 1 from cabinet 1")
    _play(world, "close cabinet 1", "go to countertop 1")
    assert world.step("put mug 1 in/on cabinet 1").observation == NOTHING  # not at it
    world.step("go to cabinet 1")
    assert world.step("put mug 1 in/on cabinet 1").observation == NOTHING  # closed
    world.step("open cabinet 1")
    assert world.step("put mug 1 in cabinet 1").observation == NOTHING  # ALFWorld says in/on
    assert world.step("put mug 1 in/on cabinet 1").observation == (
        "You put the mug 1 in/on the cabinet 1."
    )
    assert world.won()


def test_heat_needs_the_object_in_hand_at_the_microwave():
    world = World(_kitchen("pick_heat_then_place"))
    world.step("go to microwave 1")
    assert world.step("heat apple 1 with microwave 1").observation == NOTHING  # not in hand
    _play(world, "go to fridge 1", "open fridge 1", "take apple 1 from fridge 1")
    assert world.step("heat apple 1 with microwave 1").observation == NOTHING  # not at it
    _play(world, "go to countertop 1", "put apple 1 on countertop 1")
    assert not world.won()  # a cold apple does not count
    _play(world, "take apple 1 from countertop 1", "go to microwave 1")
    assert world.step("heat apple 1 with fridge 1").observation == NOTHING  # wrong appliance
    assert world.step("heat apple 1 with microwave 1").observation == (
        "You heat the apple 1 using the microwave 1."
    )
    assert world.step("examine apple 1").observation == "This is a hot apple 1."
    _play(world, "go to countertop 1", "put apple 1 in/on countertop 1")
    assert world.won()


def test_cool_and_clean_need_their_appliance_and_a_fitting_object():
    world = World(_kitchen("pick_clean_then_place", "knife", "drawer"))
    _play(world, "go to countertop 1", "take knife 1 from countertop 1", "go to fridge 1")
    assert world.step("cool knife 1 with fridge 1").observation == NOTHING  # knives don't cool
    assert world.step("clean knife 1 with fridge 1").observation == NOTHING
    assert _play(world, "go to sinkbasin 1", "clean knife 1 with sinkbasin 1")[1] == (
        "You clean the knife 1 using the sinkbasin 1."
    )
    _play(world, "go to drawer 1", "open drawer 1", "put knife 1 in/on drawer 1")
    assert world.won()
    cool = World(_kitchen("pick_cool_then_place", "mug", "countertop"))
    _play(cool, "go to cabinet 1", "open cabinet 1", "take mug 1 from cabinet 1", "go to fridge 1")
    assert cool.step("cool mug 1 with fridge 1").valid
    _play(cool, "go to microwave 1", "heat mug 1 with microwave 1")  # hot again, not cool
    _play(cool, "go to countertop 1", "put mug 1 in/on countertop 1")
    assert not cool.won()


def test_pick_two_needs_two_distinct_objects_in_one_receptacle():
    world = World(_kitchen("pick_two_obj", "apple", "countertop"))
    _play(world, "go to fridge 1", "open fridge 1", "take apple 1 from fridge 1")
    _play(world, "go to countertop 1", "put apple 1 in/on countertop 1")
    assert not world.won()
    _play(world, "take apple 1 from countertop 1", "put apple 1 in/on countertop 1")
    assert not world.won()  # the same apple twice
    _play(world, "go to fridge 1", "take apple 2 from fridge 1", "go to countertop 1")
    world.step("put apple 2 in/on countertop 1")
    assert world.won()


def test_look_at_needs_the_object_in_hand_and_the_lamp_on():
    world = World(_bedroom())
    _play(world, "go to desk 1")
    assert world.step("use desklamp 1").observation == "You turn on the desklamp 1."
    assert not world.won()  # lamp on, nothing in hand
    assert world.step("take desklamp 1 from desk 1").observation == NOTHING
    _play(world, "go to bed 1", "take book 1 from bed 1")
    assert not world.won()  # book in hand, lamp elsewhere
    world.step("go to desk 1")
    assert world.won()
    other = World(_bedroom())
    _play(other, "go to bed 1", "take book 1 from bed 1", "go to desk 1")
    assert not other.won()  # lamp off
    assert other.step("toggle desklamp 1").observation == NOTHING  # not an ALFWorld command
    assert other.step("use desklamp 1").observation == "You turn on the desklamp 1."
    assert other.won()
    # ALFWorld's goal asks for a lamp once toggled: using it again keeps the goal
    assert other.step("use desklamp 1").observation == "You turn on the desklamp 1."
    assert other.won()
    wrong = World(_bedroom())
    _play(wrong, "go to sidetable 1", "take pen 1 from sidetable 1", "go to desk 1")
    wrong.step("use desklamp 1")
    assert not wrong.won()  # the wrong object


def test_unknown_and_misspelled_commands_do_nothing():
    world = World(_kitchen("pick_and_place"))
    for command in ["dance", "go to moon 1", "take apple from fridge 1", "", "open apple 1"]:
        outcome = world.step(command)
        assert (outcome.observation, outcome.valid) == (NOTHING, False)
    # exact commands only, as TextWorld plays them (the task matches free text first)
    assert not world.step("Go To Fridge 1.").valid and not world.step("inv").valid
    assert world.step("look").observation == (
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, "
        "a countertop 1, a drawer 1, a fridge 1, a microwave 1, and a sinkbasin 1."
    )
    assert world.step("  go to fridge 1 ").valid  # surrounding spaces are stripped
    assert (
        world.step("look").observation
        == "You are facing the fridge 1. Next to it, you see nothing."
    )
    assert (
        list_phrase([]) == "nothing"
        and list_phrase(["a 1", "b 2", "c 3"]) == "a a 1, a b 2, and a c 3"
    )


# --- the environment protocol --------------------------------------------------------------


def test_a_session_step_by_step_with_metrics():
    env = make_task("alfworld")
    start = env.start(0)
    plan = env.solution(0)
    game = World(env.scene(0))
    step = env.interact(start.session, _act("dance", plan[0]))  # only the first call plays
    # "dance" shares no word with any command: BLEU 0, played as it is
    assert step.status == Status.RUNNING
    assert [m.content for m in step.messages] == [NOTHING + available_actions(game.admissible())]
    step = env.interact(start.session, _act(plan[0]))
    arrived = game.step(plan[0]).observation
    assert arrived.startswith("You arrive at loc")  # the engine's text, shown without it
    assert step.messages[0].content == observation(arrived) + available_actions(game.admissible())
    assert step.messages[0].tool_call_id == "c0" and step.messages[0].name == "take_action"
    for command in plan[1:-1]:
        assert env.interact(start.session, _act(command)).status == Status.RUNNING
    final = env.interact(start.session, _act(plan[-1], "look"))
    assert (final.status, final.reward, final.finish) == (Status.COMPLETED, 1.0, True)
    assert len(final.messages) == 1
    assert final.metrics["env/invalid_commands"] == 1.0
    assert final.metrics["env/matched_actions"] == 0.0
    assert final.metrics["env/actions"] == float(len(plan) + 1)
    assert final.metrics["env/level"] == 2.0 and final.metrics["env/bad_calls"] == 0.0
    assert final.metrics["env/success_pick_and_place"] == 1.0
    with pytest.raises(SessionClosed):
        env.interact(start.session, _act("look"))


AGENTBENCH_TASK = "AgentBench src/server/tasks/alfworld/task.py"


@pytest.mark.parametrize(
    ("message", "reply"),
    [
        (ChatMessage("assistant", "I will go to the fridge."), NO_TOOL_CALL),
        (ChatMessage("assistant", '<tool_call>{"name": "take_action", "arg'), NO_TOOL_CALL),
        (ChatMessage("assistant", "", [ToolCall("c0", "take_action", "{}")]), NO_VALID_CALL),
        (ChatMessage("assistant", "", [ToolCall("c0", "take_action", "[1, 2]")]), NO_VALID_CALL),
        (
            ChatMessage("assistant", "", [ToolCall("c0", "take_action", '{"action": 3}')]),
            NO_VALID_CALL,
        ),
    ],
)
def test_bad_calls_are_answered_as_agentbench_does_and_the_episode_goes_on(message, reply):
    """Parity with AgentBench src/server/tasks/alfworld/task.py: no tool call -> the user
    message of line 160 ("No executable tool calls found. Please call a tool instead"),
    arguments that are not an object with a string first value -> the user message of
    line 179 ("No valid tool calls found. Please call a tool instead."); both `continue`
    the loop (lines 163, 182), so the episode runs until max_step (line 149)."""
    assert NO_TOOL_CALL == "No executable tool calls found. Please call a tool instead"
    assert NO_VALID_CALL == "No valid tool calls found. Please call a tool instead."
    env = make_task("alfworld")
    start = env.start(0)
    step = env.interact(start.session, message)
    assert (step.status, step.reward, step.finish) == (Status.RUNNING, 0.0, False)
    assert [(m.role, m.content) for m in step.messages] == [("user", reply)]
    for command in env.solution(0):  # the model can still solve it afterwards
        step = env.interact(start.session, _act(command))
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert step.metrics["env/bad_calls"] == 1.0


def test_agentbench_plays_the_first_call_whatever_its_name_and_argument_key():
    """Parity with AgentBench alfworld/task.py:166-173: tool_calls[0] only, its first argument
    value is the action (the name is never checked), lower-cased and cut at the first line
    (utils.py:31, process_action)."""
    env = make_task("alfworld")
    start = env.start(0)
    first = env.solution(0)[0]
    calls = [
        ToolCall("c0", "go_to", json.dumps({"cmd": first.upper() + "\nthen more"})),
        ToolCall("c1", "take_action", json.dumps({"action": "look"})),
    ]
    step = env.interact(start.session, ChatMessage("assistant", "", calls))
    assert len(step.messages) == 1 and step.messages[0].tool_call_id == "c0"
    game = World(env.scene(0))
    expected = observation(game.step(first).observation) + available_actions(game.admissible())
    assert step.messages[0].content == expected


def test_the_turn_limit_counts_bad_calls_and_ends_with_reward_zero():
    """Parity with AgentBench alfworld/task.py: every assistant message is one of the max_step
    iterations (line 149, default 20 in configs/tasks/alfworld.yaml line 10); running out
    ends TASK_LIMIT_REACHED with result 0 (lines 217-223)."""
    env = make_task("alfworld")
    assert env.turn_limit(2) == 20 and env.max_turns == 20
    start = env.start(0)
    for _ in range(19):
        step = env.interact(start.session, ChatMessage("assistant", "thinking"))
        assert step.status == Status.RUNNING
    step = env.interact(start.session, ChatMessage("assistant", "still thinking"))
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.messages[0].content == NO_TOOL_CALL and step.metrics["env/bad_calls"] == 20.0


def test_the_same_action_three_times_after_three_actions_fails():
    """Parity with AgentBench alfworld/task.py:208-213: with more than 3 logged actions and
    the last 3 outputs equal -> result 0, AGENT_INVALID_ACTION; the check runs before the
    goal test (line 215)."""
    env = make_task("alfworld")
    start = env.start(0)
    assert env.interact(start.session, _act("inventory")).status == Status.RUNNING
    for _ in range(2):
        assert env.interact(start.session, _act("look")).status == Status.RUNNING
    step = env.interact(start.session, _act("look"))
    assert (step.status, step.reward, step.finish) == (Status.AGENT_INVALID_ACTION, 0.0, True)
    other = env.start(0)  # three in a row, but only three actions: goes on
    for _ in range(3):
        assert env.interact(other.session, _act("look")).status == Status.RUNNING


def test_turn_limit_and_cancel():
    env = make_task("alfworld", max_turns=3)
    start = env.start(1)
    assert env.interact(start.session, _act("look")).status == Status.RUNNING
    assert env.interact(start.session, _act("dance")).status == Status.RUNNING
    step = env.interact(start.session, _act("inventory"))
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.metrics["env/invalid_commands"] == 1.0 and step.metrics["env/turns"] == 3.0
    other = env.start(1)
    env.cancel(other.session)
    env.cancel(other.session)  # idempotent
    with pytest.raises(SessionClosed):
        env.interact(other.session, _act("look"))


def test_sessions_run_in_parallel_threads_without_sharing_state():
    env = make_task("alfworld", num_instances=12)
    rewards: dict[int, float] = {}

    def play(index: int) -> None:
        start = env.start(index)
        for command in env.solution(index):
            step = env.interact(start.session, _act(command))
        rewards[index] = step.reward

    threads = [threading.Thread(target=play, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert rewards == {i: 1.0 for i in range(12)}


def test_cli_check(capsys):
    assert cli_env.main(["check", "--task", "alfworld", "--agent", "oracle"]) == 0
    assert "task alfworld, agent oracle: 60/60 succeeded (1.000)" in capsys.readouterr().out
    assert cli_env.main(["check", "--task", "alfworld", "--agent", "random"]) == 0
    assert "agent random: 0/60 succeeded" in capsys.readouterr().out


# --- the real ALFWorld backend ---------------------------------------------------------------


@pytest.mark.skipif(
    not AGENTBENCH_ALFWORLD.exists(), reason=f"no AgentBench sample at {AGENTBENCH_ALFWORLD}"
)
def test_the_agentbench_game_list_loads():
    games = load_game_list(AGENTBENCH_ALFWORLD)
    assert len(games) == 20
    assert {g.task_type for g in games} == set(TASK_TYPES)
    assert all(g.path.startswith("json_2.1.1/") and g.path.endswith("game.tw-pddl") for g in games)
    assert games[0].task_type == "pick_and_place" and "SoapBottle" in games[0].path


@pytest.mark.skipif(
    not AGENTBENCH_ALFWORLD.exists(), reason=f"no AgentBench sample at {AGENTBENCH_ALFWORLD}"
)
def test_without_the_packages_and_games_the_real_backend_says_what_is_missing(
    monkeypatch, tmp_path
):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(AlfworldUnavailable) as info:
        make_task("alfworld", backend="alfworld", data=str(AGENTBENCH_ALFWORLD))
    message = str(info.value)
    assert "'alfworld' is not installed" in message and "'textworld' is not installed" in message
    assert "ALFWORLD_DATA is not set" in message
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(AlfworldUnavailable, match=r"20 of 20 game files missing under .*json_2"):
        make_task("alfworld", backend="alfworld", data=str(AGENTBENCH_ALFWORLD))
    with pytest.raises(AlfworldUnavailable, match="is not a directory"):
        make_task(
            "alfworld",
            backend="alfworld",
            data=str(AGENTBENCH_ALFWORLD),
            alfworld_data=str(tmp_path / "nowhere"),
        )
    with pytest.raises(ValueError, match="needs data="):
        make_task("alfworld", backend="alfworld")


def test_a_data_file_is_never_silently_ignored_by_the_generated_backend():
    with pytest.raises(ValueError, match="cannot play"):
        make_task("alfworld", data=str(AGENTBENCH_ALFWORLD))
    with pytest.raises(ValueError, match="cannot play"):
        make_task("alfworld", backend="generated", alfworld_data="/somewhere")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("not json", r"games.json: not JSON"),
        ('["a.tw-pddl"]', r"games.json: expected an object"),
        ('{"make_coffee": ["a.tw-pddl"]}', r"unknown task type 'make_coffee'"),
        ('{"look_at_obj": "a.tw-pddl"}', r"look_at_obj: expected a list"),
        ('{"look_at_obj": ["a.tw-pddl", 7]}', r"look_at_obj\[1\]: not a game file path"),
        ("{}", r"games.json: no games"),
    ],
)
def test_a_bad_game_list_names_the_entry(tmp_path, text, error):
    path = tmp_path / "games.json"
    path.write_text(text)
    with pytest.raises(AlfworldDataError, match=error):
        load_game_list(path)


class _FakeState(dict):
    """textworld.GameState: a dict with a ``feedback`` attribute."""

    feedback = ""


class _FakeTextWorldEnv:
    """Plays a game file holding ``{"index", "task_type"}`` with the simulator, the
    way TextWorld's PDDL backend answers (welcome banner, ``won``, walkthrough)."""

    def __init__(self, path: str, infos, wrappers) -> None:
        spec = json.loads(Path(path).read_text())
        self.world = World(generate(spec["index"], spec["task_type"]))
        self.infos, self.wrappers, self.closed = infos, wrappers, False

    def reset(self) -> _FakeState:
        state = _FakeState(won=False, admissible_commands=self.world.admissible())
        state.feedback = self.world.intro()  # the banner, the room, the goal
        if "walkthrough" in self.infos.extras:
            state["extra.walkthrough"] = solution(self.world.scene)
        return state

    def step(self, command: str):
        if command == "crash":
            raise RuntimeError("the PDDL planner died")
        outcome = self.world.step(command)
        state = _FakeState(won=self.world.won(), admissible_commands=self.world.admissible())
        state.feedback = outcome.observation
        return state, int(state["won"]), state["won"]

    def close(self) -> None:
        self.closed = True


def _install_fake_alfworld(monkeypatch) -> list[_FakeTextWorldEnv]:
    started: list[_FakeTextWorldEnv] = []

    class AlfredDemangler:
        def __init__(self, shuffle: bool = False) -> None:
            self.shuffle = shuffle

    def start(path, request_infos=None, wrappers=()):
        assert any(isinstance(w, AlfredDemangler) and not w.shuffle for w in wrappers)
        assert request_infos.won and request_infos.admissible_commands
        assert "gamefile" in request_infos.extras
        started.append(_FakeTextWorldEnv(path, request_infos, wrappers))
        return started[-1]

    def module(name: str, **attrs) -> None:
        fake = types.ModuleType(name)
        fake.__spec__ = importlib.machinery.ModuleSpec(name, None)
        fake.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, fake)

    module("textworld", start=start, EnvInfos=types.SimpleNamespace)
    module("fast_downward")
    module("alfworld")
    module("alfworld.agents")
    module("alfworld.agents.environment")
    module("alfworld.agents.environment.alfred_tw_env", AlfredDemangler=AlfredDemangler)
    return started


def _game_files(root: Path, per_type: int = 2) -> Path:
    listing: dict[str, list[str]] = {}
    for n, task_type in enumerate(TASK_TYPES * per_type):
        relative = f"json_2.1.1/valid_unseen/{task_type}-{n}/trial_T0/game.tw-pddl"
        (root / relative).parent.mkdir(parents=True)
        (root / relative).write_text(json.dumps({"index": n, "task_type": task_type}))
        listing.setdefault(task_type, []).append(relative)
    (root / "dev.json").write_text(json.dumps(listing))
    return root / "dev.json"


def test_the_real_backend_plays_textworld_games(monkeypatch, tmp_path):
    started = _install_fake_alfworld(monkeypatch)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    data = _game_files(tmp_path)
    env = make_task("alfworld", backend="alfworld", data=str(data), split="all")
    assert env.num_instances == 12
    train, test = (
        make_task("alfworld", backend="alfworld", data=str(data), split=side)
        for side in ("train", "test")
    )
    assert train.num_instances + test.num_instances == 12 and test.num_instances >= 1
    train_games = {train.describe(i) for i in range(train.num_instances)}
    assert not train_games & {test.describe(i) for i in range(test.num_instances)}
    with pytest.raises(ValueError, match="level 2 only"):
        make_task("alfworld", backend="alfworld", data=str(data), levels=[0])
    assert check("alfworld", env, "oracle").success_rate == 1.0  # the games' walkthroughs
    assert check("alfworld", env, "random").success_rate <= 0.1
    assert started and all(game.closed for game in started)
    start = env.start(4)  # a look_at_obj game
    game = started[-1].world
    assert start.messages[1].content == opening(game.intro(), game.admissible())
    assert start.messages[1].content.startswith("Here is your task. You are in the middle of a")
    assert "Welcome to TextWorld" not in start.messages[1].content
    step = env.interact(start.session, _act("dance"))
    assert step.messages[0].content == NOTHING + available_actions(game.admissible())
    assert step.status == Status.RUNNING
    first = solution(game.scene)[0]
    step = env.interact(start.session, _act(first))
    fresh = World(game.scene)
    arrived = fresh.step(first).observation
    assert arrived.startswith("You arrive at loc ")
    assert step.messages[0].content == observation(arrived) + available_actions(fresh.admissible())
    env.cancel(start.session)
    assert started[-1].closed
    broken = env.start(0)
    with pytest.raises(InfraError, match="the PDDL planner died"):
        env.interact(broken.session, _act("crash"))
    assert started[-1].closed
    with pytest.raises(SessionClosed):
        env.interact(broken.session, _act("look"))
    only = make_task(
        "alfworld", backend="alfworld", data=str(data), task_types=["pick_two_obj"], split="all"
    )
    assert only.num_instances == 2 and only.describe(0).startswith("[pick_two_obj] json_2.1.1/")
    (tmp_path / json.loads(data.read_text())["look_at_obj"][1]).unlink()
    with pytest.raises(AlfworldUnavailable, match=r"1 of 12 game files missing"):
        make_task("alfworld", backend="alfworld", data=str(data))


# --- the whole loop ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_alfworld_task_through_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://smoke-alf-{uuid.uuid4().hex[:6]}", "smoke-alf", steps=1)
    raw["tasks"] = {"alfworld": {"options": {"max_turns": 2, "num_instances": 12}}}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    (metrics,) = [
        json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["env/alfworld/episodes"] == 4 and "env/alfworld/reward" in metrics


# --- levels and the split --------------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 1, 2])
def test_every_level_is_solved_by_the_oracle_and_not_by_random(level):
    env = make_task("alfworld", levels=[level], num_instances=120, split="test")
    assert check("alfworld", env, "oracle").success_rate == 1.0
    # random well-formed commands: observed 0/300 per level on seed 0; bound 5%
    assert check("alfworld", env, "random").success_rate <= 0.05
    demo = make_task("alfworld", levels=[level], num_instances=20, demo=True)
    assert check("alfworld", demo, "oracle").success_rate == 1.0


def test_level_goals_and_turn_limits():
    env = make_task("alfworld", levels=[0, 1], num_instances=40)
    assert [env.level(i) for i in range(4)] == [0, 1, 0, 1]
    assert (env.turn_limit(0), env.turn_limit(1), env.max_turns) == (5, 8, 8)
    take, place = env.scene(0), env.scene(1)
    obj = f"{take.target} 1"
    assert take.goal == f"take the {obj} from the {take.source}"
    assert env.solution(0) == [f"go to {take.source}", f"take {obj} from {take.source}"]
    assert place.goal.endswith(f", then put it in/on the {place.destination}")
    assert (
        f"\nYour task is to: {place.goal}. AVAILABLE ACTIONS: " in env.start(1).messages[1].content
    )
    assert make_task("alfworld", levels=[0], max_turns=9).turn_limit(0) == 9
    start = env.start(0)  # level 0 ends at its own limit of 5
    for command in ["look", "inventory", "look", "inventory"]:
        assert env.interact(start.session, _act(command)).status == Status.RUNNING
    assert env.interact(start.session, _act("look")).status == Status.TASK_LIMIT_REACHED
    with pytest.raises(ValueError, match="levels"):
        make_task("alfworld", levels=[3])
    with pytest.raises(ValueError, match="split"):
        make_task("alfworld", split="dev")


def test_holding_another_object_or_putting_it_elsewhere_is_not_the_goal():
    env = make_task("alfworld", levels=[1], num_instances=10)
    for index in range(10):
        scene = env.scene(index)
        world = World(scene)
        plan = env.solution(index)
        for command in plan[:2]:
            assert world.step(command).valid
        assert not world.won()  # taken but not placed
        elsewhere = next(
            r
            for r in scene.receptacles
            if r not in (scene.destination, scene.source) and kind_of(r) not in OPENABLE
        )
        world.step(f"go to {elsewhere}")
        world.step(f"put {scene.target} 1 in/on {elsewhere}")
        assert not world.won()


@pytest.mark.parametrize("level", [0, 1, 2])
def test_train_and_test_never_share_a_scene_and_are_deterministic(level):
    from agentrl.environments.tasks.alfworld.levels import scene_key
    from agentrl.environments.tasks.toolkit.split import check_disjoint

    train = make_task("alfworld", levels=[level], num_instances=300, split="train")
    test = make_task("alfworld", levels=[level], num_instances=300, split="test")
    train_keys = [scene_key(train.scene(i)) for i in range(300)]
    test_keys = [scene_key(test.scene(i)) for i in range(300)]
    check_disjoint(train_keys, test_keys, "alfworld")
    assert len(set(test_keys)) >= 290 and len(set(train_keys)) >= 290  # hundreds distinct
    again = make_task("alfworld", levels=[level], num_instances=300, split="test")
    assert [again.scene(i) for i in range(20)] == [test.scene(i) for i in range(20)]
    other_seed = make_task("alfworld", levels=[level], num_instances=300, split="test", seed=1)
    assert [other_seed.scene(i) for i in range(20)] != [test.scene(i) for i in range(20)]
