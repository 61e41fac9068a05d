"""The alfworld task's conversation is AgentBench's: prompt, tool, opening, AVAILABLE ACTIONS,
observations, the BLEU match of free text, and the admissible commands of the simulator."""

from __future__ import annotations

import random

from agentrl.environments import make_task
from agentrl.environments._protocol import Status
from agentrl.environments.tasks.alfworld.agents import random_command
from agentrl.environments.tasks.alfworld.protocol import (
    LEVEL_PROMPT,
    SYSTEM_PROMPT,
    match_action,
    observation,
    opening,
    sentence_bleu,
)
from agentrl.environments.tasks.alfworld.scene import TASK_TYPES, Scene, generate
from agentrl.environments.tasks.alfworld.task import AlfworldTask
from agentrl.environments.tasks.alfworld.world import NOTHING, Outcome, World
from tests.unit.test_alfworld import _act, _bedroom, _kitchen


def test_the_system_prompt_and_tool_are_agentbenchs():
    """AgentBench alfworld/task.py:110-114 (the instruction, typos kept) and
    configs/tasks/alfworld.yaml:11-25 (the tool)."""
    env = make_task("alfworld")
    system, _ = env.start(2).messages
    assert system.role == "system" and system.content == SYSTEM_PROMPT
    assert SYSTEM_PROMPT.startswith(
        "Interact with a household to solve a task. Imagine you are an intelligent agent in a "
        "household environment and your target is to perform actions to complete) the task goal."
    )
    assert 'if the environment output "Nothing happened", that means the previous action' in (
        SYSTEM_PROMPT
    )
    assert SYSTEM_PROMPT.endswith(
        "you should try more options.\n Reminder:\n1. the action must be chosen from the given "
        "available actions. Any actions except provided available actions will be regarded as "
        "illegal.\n2. Always call the tool to hand in your next action and think when necessary."
    )
    assert env.tools == [
        {
            "type": "function",
            "function": {
                "name": "take_action",
                "description": "Take an action.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "action": {
                            "type": "string",
                            "description": "The action you would like to take",
                        }
                    },
                    "required": ["action"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    easy = AlfworldTask(levels=[0, 1])
    assert [easy.start(i).messages[0].content for i in (0, 1)] == [LEVEL_PROMPT, LEVEL_PROMPT]


def test_the_opening_message_is_agentbenchs():
    """AgentBench alfworld/task.py:134 (the banner paragraph dropped, the rest joined by one
    newline), :141 ("Here is your task. " + ...) and :125-128 (" AVAILABLE ACTIONS: " + the
    commands one a line + "\\n"); the room listed as ALFWorld lists it (by type, numbers
    descending: AgentBench's prompts/alfworld_multiturn_plan_first.json, "heat")."""
    scene = Scene(
        0,
        "kitchen",
        "pick_heat_then_place",
        "apple",
        "fridge",
        ("fridge 1", "cabinet 1", "microwave 1", "cabinet 2", "countertop 1"),
        (1, 2, 3, 4, 5),
        (("apple 1", "countertop 1"),),
    )
    world = World(scene)
    assert world.intro() == (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking "
        "quickly around you, you see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, and a "
        "microwave 1.\n\nYour task is to: put a hot apple in fridge."
    )
    assert opening(world.intro(), world.admissible()) == (
        "Here is your task. You are in the middle of a room. Looking quickly around you, you "
        "see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, and a microwave 1.\n"
        "Your task is to: put a hot apple in fridge. AVAILABLE ACTIONS: go to cabinet 1\n"
        "go to cabinet 2\ngo to countertop 1\ngo to fridge 1\ngo to microwave 1\ninventory\n"
        "look\n"
    )
    env = make_task("alfworld")
    user = env.start(2).messages[1]
    game = World(env.scene(2))
    assert user.role == "user"
    assert user.content == opening(game.intro(), game.admissible())
    assert f"\nYour task is to: {env.scene(2).goal}. AVAILABLE ACTIONS: go to " in user.content


def test_admissible_commands_are_alfworlds():
    """The commands AgentBench lists after each observation (alfworld/task.py:141, 189:
    info["admissible_commands"]): ALFWorld's actions whose preconditions hold (AgentBench's
    data/alfworld/logic/alfred.pddl, e.g. GotoLocation, PickupObject needs empty hands and an
    open receptacle, PutObject needs canContain, HeatObject a microwave open or not, as in
    prompts/alfworld_multiturn_plan_first.json "heat"), in their grammar's wording
    (alfred.twl2: "put {o} in/on {r}", ToggleObject is "use {o}"), sorted and deduplicated
    as TextWorld lists them; examine of an object only for the one in hand."""
    world = World(_kitchen("pick_heat_then_place"))
    go_all = [f"go to {r}" for r in sorted(world.scene.receptacles)]
    assert world.admissible() == [*go_all, "inventory", "look"]
    world.step("go to fridge 1")
    assert world.admissible() == [
        "examine fridge 1",
        *[g for g in go_all if g != "go to fridge 1"],
        "inventory",
        "look",
        "open fridge 1",
    ]
    world.step("open fridge 1")
    assert world.admissible()[-3:] == [
        "look",
        "take apple 1 from fridge 1",
        "take apple 2 from fridge 1",
    ]
    assert "close fridge 1" in world.admissible()
    world.step("take apple 1 from fridge 1")
    assert world.admissible() == [
        "close fridge 1",
        "cool apple 1 with fridge 1",
        "examine apple 1",
        "examine fridge 1",
        *[g for g in go_all if g != "go to fridge 1"],
        "inventory",
        "look",
        "put apple 1 in/on fridge 1",
    ]
    world.step("go to microwave 1")  # closed: heating works all the same
    assert world.admissible() == [
        "examine apple 1",
        "examine microwave 1",
        *[g for g in go_all if g != "go to microwave 1"],
        "heat apple 1 with microwave 1",
        "inventory",
        "look",
        "open microwave 1",
    ]
    lamp = World(_bedroom())
    lamp.step("go to desk 1")
    assert lamp.admissible() == [
        "examine desk 1",
        "go to bed 1",
        "go to sidetable 1",
        "inventory",
        "look",
        "use desklamp 1",
    ]


def test_the_simulator_plays_exactly_its_admissible_commands():
    """Every listed command applies and every other text observes "Nothing happens." (as
    TextWorld's PDDL backend plays only its valid commands), over random walks."""
    rng = random.Random(0)
    for index in range(24):
        scene = generate(index, TASK_TYPES[index % 6], seed=index)
        world = World(scene)
        receps, objects = list(scene.receptacles), [o for o, _ in scene.placement]
        for _ in range(40):
            allowed = world.admissible()
            assert allowed == sorted(set(allowed))
            other = random_command(receps, objects, rng)
            if other not in allowed:
                assert world.step(other) == Outcome(NOTHING, False), other
            command = rng.choice(allowed)
            outcome = world.step(command)
            assert outcome.valid and outcome.observation != NOTHING, command


def test_observations_lose_agentbenchs_arrival_prefix_only():
    """AgentBench alfworld/utils.py:16-19 (process_ob): a leading "You arrive at loc N. " goes,
    anything else stays; its prompts show arrivals as "On the toilet 1, you see ..."
    (prompts/alfworld_multiturn_plan_first.json)."""
    assert observation("You arrive at loc 12. On the toilet 1, you see a soapbar 4.") == (
        "On the toilet 1, you see a soapbar 4."
    )
    assert observation("You arrive at loc 3. The fridge 1 is closed.") == "The fridge 1 is closed."
    assert observation("You open the fridge 1. The fridge 1 is open.") == (
        "You open the fridge 1. The fridge 1 is open."
    )
    assert observation(NOTHING) == NOTHING


def test_sentence_bleu_is_nltks():
    """AgentBench alfworld/utils.py:8-14 scores with NLTK's sentence_bleu and smoothing
    method4; the expected values were computed by NLTK 3.10.4 (identical code in 3.8.1 and
    3.9.1), 108 further cases agreed to the last bit."""
    assert sentence_bleu("go to fridge 1", "go to the fridge") == 0.18616487055295167
    assert sentence_bleu("examine countertop 1", "examine") == 0.1353352832366127
    take = sentence_bleu("take apple 1 from countertop 1", "take apple")
    assert take == 0.029961687346935995
    assert sentence_bleu("go to cabinet 1", "go to cabinet 10") == 0.43146827293898643
    put = sentence_bleu("put apple 1 in/on fridge 1", "put the apple in the fridge 1")
    assert put == 0.09744264611591712
    assert sentence_bleu("go to countertop 1", "i want to go to countertop 1") == (
        0.41113361690051975
    )
    assert sentence_bleu("look", "x look") == 0.06754436142034707
    assert sentence_bleu("look", "dance") == 0.0 and sentence_bleu("look", "") == 0.0
    assert sentence_bleu("go to fridge 1", "go to fridge 1") == 1.0


def test_free_text_becomes_the_nearest_admissible_command():
    """AgentBench alfworld/utils.py:21-48 (process_action): lower-case, first line, exact
    commands kept, else the first command with the highest BLEU if above 0.01 (line 40),
    else the text itself; task.py:172-174 matches against the commands of the current state."""
    choices = ["examine countertop 1", "go to cabinet 1", "go to fridge 1", "inventory", "look"]
    assert match_action("Go To Fridge 1\nand then open it", choices) == "go to fridge 1"
    assert match_action("go to the fridge", choices) == "go to fridge 1"
    assert match_action("examine", choices) == "examine countertop 1"
    assert match_action("dance", choices) == "dance"  # nothing in common
    assert match_action("  LOOK ", choices) == "look"
    assert match_action("go to fridge", []) == "go to fridge"  # no commands: as it is
    # a tie goes to the first command: "go to" alone scores the same on both
    assert match_action("go to", choices) == "go to cabinet 1"
    env = make_task("alfworld")
    start = env.start(0)
    plan = env.solution(0)
    loose = [f"Please {plan[0].upper()} now", *plan[1:]]
    for text in loose:
        step = env.interact(start.session, _act(text))
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert step.metrics["env/matched_actions"] == 1.0
    assert step.metrics["env/invalid_commands"] == 0.0


ENGINE_TRANSCRIPT = [
    # (command, observation, admissible commands after it), recorded from the real engine
    ("go to countertop 1", "You arrive at loc 4. On the countertop 1, you see a apple 1.",
     ["examine countertop 1", "go to fridge 1", "go to microwave 1", "inventory", "look",
      "take apple 1 from countertop 1"]),
    ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1.",
     ["examine apple 1", "examine countertop 1", "go to fridge 1", "go to microwave 1",
      "inventory", "look", "put apple 1 in/on countertop 1"]),
    ("examine apple 1", "There's nothing special about apple 1.",
     ["examine apple 1", "examine countertop 1", "go to fridge 1", "go to microwave 1",
      "inventory", "look", "put apple 1 in/on countertop 1"]),
    ("go to microwave 1", "You arrive at loc 2. The microwave 1 is closed.",
     ["examine apple 1", "examine microwave 1", "go to countertop 1", "go to fridge 1",
      "heat apple 1 with microwave 1", "inventory", "look", "open microwave 1"]),
    ("heat apple 1 with microwave 1", "You heat the apple 1 using the microwave 1.",
     ["examine apple 1", "examine microwave 1", "go to countertop 1", "go to fridge 1",
      "heat apple 1 with microwave 1", "inventory", "look", "open microwave 1"]),
    ("examine apple 1", "This is a hot apple 1.",
     ["examine apple 1", "examine microwave 1", "go to countertop 1", "go to fridge 1",
      "heat apple 1 with microwave 1", "inventory", "look", "open microwave 1"]),
    ("go to fridge 1", "You arrive at loc 3. The fridge 1 is closed.",
     ["cool apple 1 with fridge 1", "examine apple 1", "examine fridge 1", "go to countertop 1",
      "go to microwave 1", "inventory", "look", "open fridge 1"]),
    ("put apple 1 in/on fridge 1", "Nothing happens.",
     ["cool apple 1 with fridge 1", "examine apple 1", "examine fridge 1", "go to countertop 1",
      "go to microwave 1", "inventory", "look", "open fridge 1"]),
    ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see nothing.",
     ["close fridge 1", "cool apple 1 with fridge 1", "examine apple 1", "examine fridge 1",
      "go to countertop 1", "go to microwave 1", "inventory", "look",
      "put apple 1 in/on fridge 1"]),
    ("put apple 1 in/on fridge 1", "You put the apple 1 in/on the fridge 1.",
     ["close fridge 1", "examine fridge 1", "go to countertop 1", "go to microwave 1",
      "inventory", "look", "take apple 1 from fridge 1"]),
]  # fmt: skip


def test_the_simulator_replays_a_real_engine_transcript():
    """Expected values recorded from the real engine (textworld 1.7.0, fast-downward-textworld,
    alfworld 0.4.2's AlfredDemangler) playing a hand-written problem with AgentBench's own
    data/alfworld/logic/alfred.pddl and alfred.twl2 (its 0.2.2-style grammar, goal "put a hot
    apple in fridge"): a countertop with an apple, a closed fridge, a closed microwave
    (docs/tasks.md, "Real ALFWorld"). Same opening, observations, won flag and admissible
    commands at every step; the engine numbered the locations 4, 3, 2."""
    scene = Scene(
        0,
        "kitchen",
        "pick_heat_then_place",
        "apple",
        "fridge",
        ("countertop 1", "fridge 1", "microwave 1"),
        (4, 3, 2),
        (("apple 1", "countertop 1"),),
    )
    world = World(scene)
    assert world.intro() == (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly "
        "around you, you see a countertop 1, a fridge 1, and a microwave 1.\n\nYour task is to: "
        "put a hot apple in fridge."
    )
    assert world.admissible() == [
        "go to countertop 1",
        "go to fridge 1",
        "go to microwave 1",
        "inventory",
        "look",
    ]
    for n, (command, seen, allowed) in enumerate(ENGINE_TRANSCRIPT):
        assert world.step(command).observation == seen, command
        assert world.admissible() == allowed, command
        assert world.won() == (n == len(ENGINE_TRANSCRIPT) - 1)
