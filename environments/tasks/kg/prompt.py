"""The ``kg`` task's interface to the model: system prompt, tools, one-shot example, replies.

Every text here is AgentBench's (``src/server/tasks/knowledgegraph/const.py`` and
``task.py``), word for word, slips included (the one-shot intersects ``#0`` and
``#2`` and names a type ``pspaceflight...``): a model trained here should meet
at test time the prompt it trained on. `tasks.kg.task` describes the episode around them.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.environments._toolcalls import function_tool
from agentrl.messages import ChatMessage, ToolCall

__all__ = [
    "ANSWER_TOOL",
    "API_NAMES",
    "INSTRUCTIONS",
    "NO_TOOL_CALL",
    "ONE_SHOT",
    "TOOLS",
    "bad_arguments",
    "invalid_function",
    "question_text",
    "system_prompt",
    "tool_error",
]

INSTRUCTIONS = (
    " \n"
    "You are an intelligent agent tasked with answering questions based on the knowledge "
    "stored in a \n"
    "knowledge base (KB). You can utilize several tools to probe the KB and retrieve relevant \n"
    "information to answer the questions posed to you.\n"
    "Use the tools provided effectively to navigate through the KB, find relationships, \n"
    "attributes, and intersections where applicable, and determine the most pertinent \n"
    "information to answer the questions.\n"
    "Remember:\n"
    "- A variable can be an entity or a set of entities as results from previous queries.\n"
    "- You should always ensure the tool used is appropriate for the question's demands and \n"
    "follow the logical order where necessary (e.g., fetch relations before finding "
    "neighbors).\n"
    "- After a variable is produced along the process, you need to judge whether a variable "
    "is \n"
    "the final answer to the question. Each variable is represented as an id starting from 0. \n"
    "For example, #0 is the first variable, #1 is the second variable, and so on.\n"
    "- Once you identify the final answer to the question, respond with 'Final Answer: #id' \n"
    "where id is the identifier of the variable you determine to be the final answer. For \n"
    "example, if you think #3 is the final answer, you MUST respond with 'Final Answer: #3'. "
    "Do\n"
    "not call tools regarding the commission of final answer!!!\n"
    "- You need to execute one action at a time and can perform a maximum of {max_round} "
    "actions to find\n"
    "the answer.\n"
    "- You should use the supplied tools unless the final answer is identifies.\n"
    "Your thoughtful application of these tools and careful consideration of the interactions \n"
    "will guide you to the correct answers.\n"
    "Note that you must finish the task in {max_round} rounds! Arrange your attempts according "
    "to it!\n"
)
"""AgentBench's system message (``const.py`` ``INSTRUCTIONS``), formatted with the turn limit."""

_ANSWER_TOOL_NOTE = (
    "When a variable is the final answer, you may also call final_answer with it instead "
    "of writing 'Final Answer: #id'.\n"
)

NO_TOOL_CALL = "No valid function calls found! Need to recheck the function calls."
"""User message answering a message with no call and no final answer (``task.py``)."""


def system_prompt(max_round: int, *, answer_tool: bool = False) -> str:
    """The system message of an episode of ``max_round`` turns."""
    text = INSTRUCTIONS.format(max_round=max_round)
    return text + _ANSWER_TOOL_NOTE if answer_tool else text


def question_text(question: str, names: Sequence[str]) -> str:
    """The first user message: the question, then the names of its entities (``task.py``)."""
    return f"{question}\nEntities: [{', '.join(names)}]"


def tool_error(why: object) -> str:
    """Tool message for a call whose arguments or action failed (``task.py``'s catch-all)."""
    return f"Error processing tool call: {why}"


def invalid_function(name: str) -> str:
    """Tool message for a function the API does not have."""
    return f"Provide an invalid function name. Function {name} does not exist"


def bad_arguments(name: str) -> str:
    """Tool message for a missing argument, or a function of the API that is not a tool."""
    return f"Arguments do not match the function signature. Error processing arguments for {name}"


class _Plain:
    pass


API_NAMES = frozenset(dir(_Plain())) | {"union", "final_execute", "sparql_executor", "task_id"}
"""Names AgentBench's ``api.API`` object has besides its tools (``getattr`` finds them, then
the tool table does not): a call to one gets `bad_arguments`, not `invalid_function`."""


def _tool(name: str, description: str, **params: str) -> dict:
    """A tool whose parameters are all required strings, described by ``params``."""
    properties = {p: {"type": "string", "description": d} for p, d in params.items()}
    return function_tool(name, description, properties, list(params))


TOOLS: list[dict] = [
    _tool(
        "get_relations",
        "Fetches all relations associated with a given entity or variable, which helps in "
        "navigating the Knowledge Base (KB) to find useful connections.",
        variable="The entity or variable whose relations are to be fetched. Should be an "
        "existing entity or a result of a previous query.",
    ),
    _tool(
        "get_neighbors",
        "Returns all entities connected to a given variable through a specified relation, can "
        "only be used after identifying valid relations with get_relations().",
        variable="The subject entity or variable to find neighbors for.",
        relation="The relationship through which neighbors are connected to the subject.",
    ),
    _tool(
        "intersection",
        "Computes the intersection of two sets of entities or variables of the same type.",
        variable1="The first set of entities or a variable.",
        variable2="The second set of entities or a variable.",
    ),
    _tool(
        "get_attributes",
        "Retrieves all numerical attributes of a given variable, especially valuable when "
        "seeking for entities with extreme attributes (max or min).",
        variable="The variable whose numerical attributes are to be fetched.",
    ),
    _tool(
        "argmax",
        "Finds the entity with the maximum value of the specified attribute, can be used after "
        "identifying valid attributes with get_attributes().",
        variable="The variable or set of entities among which to find the maximum.",
        attribute="The attribute to maximize over the entities.",
    ),
    _tool(
        "argmin",
        "Finds the entity with the minimum value of the specified attribute, can be used after "
        "identifying valid attributes with get_attributes().",
        variable="The variable or set of entities among which to find the minimum.",
        attribute="The attribute to minimize over the entities.",
    ),
    _tool(
        "count",
        "Counts the number of entities within a given variable.",
        variable="The variable or set of entities to count.",
    ),
]
"""AgentBench's tools (``const.py`` ``TOOLS``), in its order."""

ANSWER_TOOL = _tool(
    "final_answer",
    "Gives the variable that is the final answer to the question. This ends the task.",
    variable="The variable that answers the question, e.g. #3.",
)
"""Not AgentBench's: offered with the ``answer_tool`` option, for models that only call tools."""

_CALL_ID = "call_bl80SGcnZhRLsKtoFIUNR80D"


def _step(thought: str, name: str, arguments: str, observation: str) -> list[ChatMessage]:
    call = ToolCall(id=_CALL_ID, name=name, arguments=arguments)
    return [
        ChatMessage(role="assistant", content=thought, tool_calls=[call]),
        ChatMessage(role="tool", content=observation, tool_call_id=_CALL_ID),
    ]


_ENGINES = "spaceflight.rocket_engine_cycle.rocket_engines"
ONE_SHOT: tuple[ChatMessage, ...] = (
    ChatMessage(
        role="user",
        content="Question: the bipropellant rocket engine with kerosene and gas-generator cycle "
        "is designed by who? \nEntities: [Gas-generator cycle, Kerosene]",
    ),
    *_step(
        "Thought: I need to first find engines with gas-generator cycle. To achieve this, I "
        "will query the KB to find relations connected to the entity 'Gas-generator cycle' and "
        "see if any of them can help me find the answer.",
        "get_relations",
        '{"variable":"Gas-generator cycle"}',
        f"Observation: [{_ENGINES}, spaceflight.satellite.orbiting, spaceflight.rocket_stage.fuel, "
        "spaceflight.satellite_manufacturer.spacecraft_manufactured, automotive.fuel.engines]",
    ),
    *_step(
        "Thought: From the above relations, I might use "
        f"{_ENGINES} to find the engines of Gas-generator cycle.",
        "get_neighbors",
        f'{{"variable":"Gas-generator cycle", "relation": "{_ENGINES}}}"}}',
        "Observation: variable #0, which are instances of spaceflight.bipropellant_rocket_engine",
    ),
    *_step(
        "Thought: I also need to find engines with kerosene. To achieve this, I will query the "
        "KB to find relations connected to the entity 'Kerosene",
        "get_relations",
        '{"variable":"Kerosene"}',
        "Observation: [spaceflight.satellite_manufacturer.spacecraft_manufactured, "
        f"automotive.fuel.engines, {_ENGINES}]",
    ),
    *_step(
        f"Thought: From the above relations, I might use {_ENGINES} to find engines with "
        "kerosene cycle.",
        "get_neighbors",
        f'{{"variable":"Kerosene", "relation": "{_ENGINES}}}"}}',
        "Observation: variable #1, which are instances of spaceflight.bipropellant_rocket_engine",
    ),
    *_step(
        f"Thought: From the above relations, I might use {_ENGINES} to find engines with "
        "kerosene cycle.",
        "intersection",
        '{"variable1":"#0", "variable2": "#2"}',
        "Observation: variable #2, which are instances of spaceflight.bipropellant_rocket_engine",
    ),
    *_step(
        "Thought: From the above relations, I might use spaceflight.rocket_engine.designed_by "
        "to find the designer of the engines.",
        "get_neighbors",
        '{"variable":"#2", "relation": "spaceflight.rocket_engine.designed_by"}',
        "Observation: variable #3, which are instances of pspaceflight.rocket_engine_designer",
    ),
    ChatMessage(
        role="assistant",
        content="Thought: #3 is the final answer to the question, which represents the target "
        "rocket engine designer. Final Answer: #3",
    ),
)
"""AgentBench's one-shot example (``const.py`` ``ONE_SHOT``), between the system message and
the question when ``one_shot`` is on (``task.py``; ``configs/tasks/kg.yaml`` ``kg-std``)."""
