"""The kg episode against AgentBench's KnowledgeGraph task (THUDM/AgentBench, commit 578c5e9).

Files cited: ``src/server/tasks/knowledgegraph/task.py`` (the episode),
``api.py`` (the actions), ``const.py`` (prompt, tools, one-shot),
``utils/logic_form_util.py`` (how a variable's query filters) and
``configs/tasks/kg.yaml`` (limits, ``kg-std``). The graph is the built-in one.
"""

from __future__ import annotations

import json

import pytest

from agentrl.environments import make_task
from agentrl.environments._protocol import Status
from agentrl.environments.tasks.kg.prompt import INSTRUCTIONS, ONE_SHOT, TOOLS
from agentrl.messages import ChatMessage, ToolCall

SILVER_HARBOR = "Silver Harbor"  # item 0 (kg_builtin_00), id m.0kf01, gold {m.0kp01}
NO_CALL = "No valid function calls found! Need to recheck the function calls."


def _say(*calls: tuple[str, object]) -> ChatMessage:
    return ChatMessage(
        "assistant",
        "",
        [
            ToolCall(f"c{i}", name, a if isinstance(a, str) else json.dumps(a))
            for i, (name, a) in enumerate(calls)
        ],
    )


def _env(**options):
    return make_task("kg", split="all", **options)


def _do(env, session, name: str, arguments: object) -> str:
    step = env.interact(session, _say((name, arguments)))
    assert step.status == Status.RUNNING, step
    return step.messages[0].content


def test_the_opening_messages_are_kg_std():
    """task.py lines 85-94: system message ``INSTRUCTIONS.format(max_round=...)``, the
    one-shot when ``one_shot`` (kg.yaml lines 26-30, ``kg-std``: true), then
    ``f'{question}\\nEntities: [{", ".join(entities)}]'``, names only; const.py lines 1-25
    (INSTRUCTIONS) and 200-311 (ONE_SHOT: 14 messages, ending ``Final Answer: #3``)."""
    messages = _env().start(0).messages
    assert messages[0].role == "system" and messages[0].content == INSTRUCTIONS.format(max_round=15)
    assert messages[0].content.startswith(" \nYou are an intelligent agent tasked with")
    assert "maximum of 15 actions" in messages[0].content
    assert "you must finish the task in 15 rounds!" in messages[0].content
    assert messages[1:15] == list(ONE_SHOT) and len(ONE_SHOT) == 14
    assert ONE_SHOT[0].content.startswith("Question: the bipropellant rocket engine")
    assert ONE_SHOT[1].tool_calls[0].name == "get_relations"
    assert ONE_SHOT[-1].content.endswith("Final Answer: #3")
    assert [(m.role, m.content) for m in messages[15:]] == [
        ("user", f"who directed silver harbor?\nEntities: [{SILVER_HARBOR}]")
    ]
    bare = _env(one_shot=False).start(0).messages
    assert [m.role for m in bare] == ["system", "user"]
    level0 = make_task("kg", levels=[0], generated=5, one_shot=False).start(0).messages
    assert "finish the task in 4 rounds!" in level0[0].content  # the level's own limit


def test_the_tools_are_agentbench_tools():
    """const.py lines 27-198: seven functions in this order, every parameter a required
    string, ``additionalProperties: False``; no tool gives the answer (INSTRUCTIONS)."""
    tools = _env().tools
    assert tools == TOOLS
    names = [t["function"]["name"] for t in tools]
    assert names == [
        "get_relations",
        "get_neighbors",
        "intersection",
        "get_attributes",
        "argmax",
        "argmin",
        "count",
    ]
    neighbors = tools[1]["function"]
    assert neighbors["description"] == (
        "Returns all entities connected to a given variable through a specified relation, "
        "can only be used after identifying valid relations with get_relations()."
    )
    assert neighbors["parameters"]["required"] == ["variable", "relation"]
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in tools)


def test_observations_and_the_entity_filter():
    """api.py lines 86, 106, 123, 144, 173: ``Observation: [...]`` and ``Observation:
    variable #N, which are instances of <range>`` / ``which is a number``, task.py lines
    178-180 numbering ``##``; logic_form_util.py line 675: a variable's query drops the
    entities its program names, so the films of Silver Harbor's genre leave it out."""
    env = _env()
    s = env.start(0).session
    assert _do(env, s, "get_relations", {"variable": SILVER_HARBOR}) == (
        "Observation: [film.film.country, film.film.directed_by, film.film.genre, "
        "film.film.starring]"
    )
    genre = {"variable": SILVER_HARBOR, "relation": "film.film.genre"}
    assert _do(env, s, "get_neighbors", genre) == (
        "Observation: variable #0, which are instances of film.film_genre"
    )
    films = {"variable": "#0", "relation": "film.film_genre.films_in_this_genre"}
    assert _do(env, s, "get_neighbors", films) == (
        "Observation: variable #1, which are instances of film.film"
    )
    # the genre's films are m.0kf01, 02, 04, 05, 09, 10: five without Silver Harbor
    assert s.variables[1].visible == {"m.0kf02", "m.0kf04", "m.0kf05", "m.0kf09", "m.0kf10"}
    assert _do(env, s, "count", {"variable": "#1"}) == "Observation: variable #2, which is a number"
    assert s.variables[2].visible == {"5"}
    assert _do(env, s, "get_attributes", {"variable": "#1"}) == (
        "Observation: [film.film.estimated_budget, film.film.initial_release_date, "
        "film.film.runtime]"
    )
    assert _do(env, s, "count", {"variable": "#2"}).startswith("Observation: variable #3,")
    assert s.variables[3].visible == {"5"}  # COUNT only marks the query: a count of a count
    assert _do(env, s, "get_relations", {"variable": "#2"}) == "Observation: []"


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({"variable": "#x"}, "invalid literal for int() with base 10: 'x'"),
        ({"variable": "#7"}, "list index out of range"),
        ({"variable": "#" + "9" * 5000}, "Exceeds the limit (4300 digits)"),
        ({"variable": ["#0"]}, "unhashable type: 'list'"),
        ({"variable": 3}, "expected string or bytes-like object, got 'int'"),
        ({"variable": "silver harbor"}, "get_relations: variable must be a variable or an entity"),
        ({"variable": "g.11b6"}, "get_relations: variable must be a variable or an entity"),
        ('["m.0kf01"]', "list indices must be integers or slices, not str"),
    ],
    ids=["not-a-number", "undefined", "5000-digits", "list", "int", "case", "g-id", "json-list"],
)
def test_arguments_are_read_as_agentbench_reads_them(arguments, why):
    """task.py lines 157-166 and 188-195: ``#N`` is ``variables_list[int(value[1:])]``,
    a name is looked up exactly (``value in entities``), anything else goes on as written,
    and whatever Python raises is ``Error processing tool call: <its words>``; api.py lines
    59-61: get_relations takes a variable or an id ``^([mf])\\.[\\w_]+$``."""
    env = _env()
    s = env.start(0).session
    shown = _do(env, s, "get_relations", arguments)
    assert shown.startswith(f"Error processing tool call: {why}"), shown


def test_a_negative_number_is_python_indexing_and_ids_work():
    """task.py line 162: ``variables_list[int('-1')]`` is the last variable."""
    env = _env()
    s = env.start(0).session
    _do(env, s, "get_neighbors", {"variable": "m.0kf01", "relation": "film.film.genre"})
    assert _do(env, s, "get_relations", {"variable": "#-1"}) == (
        "Observation: [film.film_genre.films_in_this_genre]"
    )


@pytest.mark.parametrize(
    ("calls", "why"),
    [
        (
            [("get_neighbors", {"variable": SILVER_HARBOR, "relation": "film.actor.film"})],
            "get_neighbors: relation must be a relation of the variable",
        ),
        (
            [("intersection", {"variable1": SILVER_HARBOR, "variable2": "m.0kf02"})],
            "'str' object has no attribute 'type'",
        ),
        (
            [
                ("get_neighbors", {"variable": "m.0kf01", "relation": "film.film.starring"}),
                ("get_neighbors", {"variable": "m.0kf01", "relation": "film.film.directed_by"}),
                ("intersection", {"variable1": "#0", "variable2": "#1"}),
            ],
            "intersection: two variables must have the same type",
        ),
        ([("count", {"variable": SILVER_HARBOR})], "'str' object has no attribute 'program'"),
        ([("get_attributes", {"variable": "m.0kf01"})], "'str' object has no attribute 'program'"),
        (
            [
                ("get_neighbors", {"variable": "m.0kf01", "relation": "film.film.starring"}),
                ("argmax", {"variable": "#0", "attribute": "film.film.runtime"}),
            ],
            "argmax: attribute must be an attribute of the variable",
        ),
        (
            [
                ("get_neighbors", {"variable": "m.0kf01", "relation": "film.film.starring"}),
                ("argmin", {"variable": "#0", "attribute": "film.film.starring"}),
            ],
            "argmin: attribute must be an attribute of the variable",
        ),
    ],
    ids=["relation", "entity-intersection", "types", "count", "attributes", "argmax", "argmin"],
)
def test_refused_actions_in_agentbench_words(calls, why):
    """api.py: lines 102-104 (a relation of the variable), 118-119 (same types), and an
    entity where a variable is needed fails on ``.type`` (line 118) or ``.program``
    (lines 145, 158: count, get_attributes, and argmax/argmin through it, lines 181-182);
    lines 184-185 and 199-200 (an attribute of the variable). Each counts in env/errors."""
    env = _env(max_turns=len(calls) + 1)
    s = env.start(0).session
    for name, arguments in calls:
        shown = _do(env, s, name, arguments)
    assert shown == f"Error processing tool call: {why}"
    step = env.interact(s, ChatMessage("assistant", "giving up"))
    assert step.status == Status.TASK_LIMIT_REACHED and step.metrics["env/errors"] == 1.0


def test_argmax_and_argmin_compare_numbers_and_dates():
    """logic_form_util.py lines 649-653 and 672-683: the top value of the variable's
    query (ORDER BY ... LIMIT 1), then every member that has it (ties kept)."""
    env = _env()
    s = env.start(0).session  # Silver Harbor: Mara Ellin 1980, Bram Tolle 1965, Otto Renn 1972
    _do(env, s, "get_neighbors", {"variable": "m.0kf01", "relation": "film.film.starring"})
    _do(env, s, "argmin", {"variable": "#0", "attribute": "people.person.date_of_birth"})
    _do(env, s, "argmax", {"variable": "#0", "attribute": "people.person.height_meters"})
    _do(env, s, "argmin", {"variable": "#0", "attribute": "people.person.height_meters"})
    # oldest Bram Tolle; 1.92 m against 1.68 (Mara Ellin) and 1.79
    assert [v.visible for v in s.variables[1:]] == [{"m.0kp16"}, {"m.0kp16"}, {"m.0kp11"}]
    assert s.variables[1].type == "film.actor"


def test_the_text_answer():
    """task.py lines 100-130: only a message without tool calls is read; its text before
    ``Observation:``, ``\\_`` read as ``_``, the first ``(?:Find|Final) Answer: #(\\d+)``
    (one space); reward 1 for an exact match, else 0, and the F1 as its score (lines
    116-121, 215-232); ``reward: f1`` rewards the F1; an undefined variable ends the
    episode AGENT_VALIDATION_FAILED (lines 124-126)."""
    env = _env()
    index = next(i for i in range(env.num_instances) if env.item(i).qid == "kg_builtin_06")
    s = env.start(index).session  # languages of Ambrin's country: gold {Valdorian, Trade Common}
    step = env.interact(s, ChatMessage("assistant", "Final Answer:#0 (no space)"))
    assert [m.content for m in step.messages] == [NO_CALL]
    languages = "location.country.official_language"
    _do(env, s, "get_neighbors", {"variable": "m.0kc01", "relation": languages})
    _do(env, s, "get_neighbors", {"variable": "m.0kc04", "relation": languages})
    said = _say(("get_relations", {"variable": "#0"}))
    said = ChatMessage("assistant", "Final Answer: #1", said.tool_calls)
    step = env.interact(s, said)  # a message with calls: its text is not read
    assert step.status == Status.RUNNING
    # #1 = Queloria's {Valdorian, Estic}: P = 1/2, R = 1/2, F1 = 1/2; not an exact match
    step = env.interact(
        s, ChatMessage("assistant", "Thought: so.\nFind Answer: #1 Final Answer: #0")
    )
    assert (step.status, step.finish) == (Status.COMPLETED, True)
    assert step.reward == 0.0 and step.metrics["env/success"] == 0.0
    assert step.metrics["env/f1"] == pytest.approx(0.5)
    f1_env = _env(reward="f1")
    s = f1_env.start(index).session
    _do(f1_env, s, "get_neighbors", {"variable": "m.0kc04", "relation": languages})
    step = f1_env.interact(s, ChatMessage("assistant", "Final Answer: #0"))
    assert (step.status, step.reward) == (Status.COMPLETED, pytest.approx(0.5))
    with pytest.raises(ValueError, match="reward must be"):
        _env(reward="partial")
    s = env.start(index).session
    step = env.interact(s, ChatMessage("assistant", "Thought.\nObservation: Final Answer: #0"))
    assert [m.content for m in step.messages] == [NO_CALL]  # only before "Observation:"
    step = env.interact(s, ChatMessage("assistant", "Final Answer: #0"))  # none made yet
    assert (step.status, step.reward, step.finish) == (Status.AGENT_VALIDATION_FAILED, 0.0, True)
    assert step.metrics["env/answered"] == 0.0


def test_calls_agentbench_does_not_know():
    """task.py lines 145 and 188-195 (JSON), 147-155 (a function the API lacks), 157-173
    (a missing argument, or a function of the API that is not a tool: ``union``);
    every call of a message runs (line 140); 15 rounds then TASK_LIMIT_REACHED (kg.yaml
    line 5, task.py lines 97 and 202-205)."""
    env = _env()
    s = env.start(0).session
    step = env.interact(s, ChatMessage("assistant", "The answer is Ilse Marrow."))
    assert (step.status, [m.content for m in step.messages]) == (Status.RUNNING, [NO_CALL])
    calls = [
        ToolCall("c0", "get_relations", "{oops"),
        ToolCall("c1", "lookup", json.dumps({"variable": "m.0kf01"})),
        ToolCall("c2", "get_neighbors", json.dumps({"variable": "m.0kf01"})),
        ToolCall("c3", "final_answer", json.dumps({"variable": "#0"})),
        ToolCall("c4", "union", json.dumps({"variable1": "#0", "variable2": "#0"})),
        ToolCall("c5", "get_relations", json.dumps({"variable": "m.0kf01"})),
    ]
    step = env.interact(s, ChatMessage("assistant", "", calls))
    assert [m.tool_call_id for m in step.messages] == [c.id for c in calls]
    shown = [m.content for m in step.messages]
    assert shown[0].startswith("Error processing tool call: Expecting property name")
    assert shown[1] == "Provide an invalid function name. Function lookup does not exist"
    assert shown[2] == (
        "Arguments do not match the function signature. "
        "Error processing arguments for get_neighbors"
    )
    assert shown[3] == "Provide an invalid function name. Function final_answer does not exist"
    assert shown[4] == shown[2].replace("get_neighbors", "union")
    assert shown[5].startswith("Observation: [film.film.country")
    for _ in range(12):
        step = env.interact(s, _say(("get_relations", {"variable": ""})))
        assert step.status == Status.RUNNING
    step = env.interact(s, _say(("get_relations", {"variable": "m.0kf01"})))  # the 15th
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.metrics["env/turns"] == 15.0
    assert step.metrics["env/bad_calls"] == 6.0 and step.metrics["env/errors"] == 12.0


def test_the_answer_tool_option():
    """Not AgentBench's (it has no answer tool): ``answer_tool`` offers ``final_answer``;
    a final answer ends the message, later calls do not run."""
    env = _env(answer_tool=True)
    assert env.start(0).messages[0].content.endswith("instead of writing 'Final Answer: #id'.\n")
    s = env.start(0).session
    step = env.interact(
        s,
        _say(
            ("get_neighbors", {"variable": SILVER_HARBOR, "relation": "film.film.directed_by"}),
            ("final_answer", {"variable": 0}),
            ("final_answer", {"variable": "#0"}),
            ("count", {"variable": "#0"}),
        ),
    )
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert [m.content for m in step.messages][1].startswith("Error processing tool call: ")
    assert len(step.messages) == 2 and step.metrics["env/variables"] == 1.0


def test_the_vocab_option_keeps_agentbench_ontology(tmp_path):
    """api.py lines 83 and 169: listed relations and attributes are those of
    ``ontology/vocab.json``; a relation it does not list cannot be followed."""
    vocab = tmp_path / "vocab.json"
    vocab.write_text(
        json.dumps({"relations": ["film.film.genre"], "attributes": [], "classes": []})
    )
    env = _env(vocab=str(vocab))
    s = env.start(0).session
    assert _do(env, s, "get_relations", {"variable": "m.0kf01"}) == (
        "Observation: [film.film.genre]"
    )
    shown = _do(env, s, "get_neighbors", {"variable": "m.0kf01", "relation": "film.film.starring"})
    assert shown.endswith("relation must be a relation of the variable")
    vocab.write_text("[]")
    with pytest.raises(ValueError, match=r"not a vocab\.json"):
        _env(vocab=str(vocab))
