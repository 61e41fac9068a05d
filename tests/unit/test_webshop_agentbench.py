"""Parity of the webshop task with what AgentBench shows an agent, and WebShop's pages.

Each expected text below is transcribed from the published code, cited by file and line:
AgentBench (THUDM/AgentBench at 578c5e9) ``src/server/tasks/webshop/task.py`` and
``configs/tasks/webshop.yaml``; WebShop (princeton-nlp/WebShop at 64fa2a5)
``web_agent_site/envs/web_agent_text_env.py`` and ``web_agent_site/templates/``.
"""

from __future__ import annotations

import ast
import json
import random

import pytest

from agentrl.environments import make_task
from agentrl.environments._protocol import Status
from agentrl.environments.tasks.webshop.http import parse_page
from agentrl.environments.tasks.webshop.task import CHECK_AGENTS
from agentrl.messages import ChatMessage, ToolCall

# AgentBench src/server/tasks/webshop/task.py:17-30, `prompt_with_max_turn`.
AGENTBENCH_PROMPT = """
You are web shopping.
I will give you instructions about what to do.
You have to follow the instructions.
Every round I will give you an observation and a list of available actions,
you have to respond with calling a tool provided based on the state and instruction.
You can use search tool if search is available.
You can click one of the buttons in clickables.
If the action is not valid, perform nothing.
Keywords in search are up to you, but the value in click must be a value in the list of available actions.
Remember that your keywords in search should be carefully designed.
Your should first think about what to do, then call a tool correspondingly.
You should always use a tool, even if you have questions to confirm. You can use whatever tool is available and do not need permission from the user.
"""  # noqa: E501

# AgentBench configs/tasks/webshop.yaml:6-31, `tools`, as YAML loads it.
AGENTBENCH_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_action",
            "description": "Use search functionality with specified keywords.",
            "parameters": {
                "type": "object",
                "properties": {
                    "keywords": {
                        "type": "string",
                        "description": "The keywords to use in the search function.",
                    }
                },
                "required": ["keywords"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "click_action",
            "description": "Click a button or link with a specified value.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {
                        "type": "string",
                        "description": "The value to click from the list of available actions.",
                    }
                },
                "required": ["value"],
                "additionalProperties": False,
            },
        },
    },
]

SMALL = {"products_per_type": 25, "goals_per_type": 5}


@pytest.fixture(scope="module")
def env():
    return make_task("webshop", split="all", **SMALL)


def _call(name: str, **arguments) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("call-7", name, json.dumps(arguments))])


def test_the_system_prompt_and_the_tools_are_agentbench_s(env):
    start = env.start(0)
    assert start.messages[0] == ChatMessage("system", AGENTBENCH_PROMPT)  # task.py:57-60
    assert env.tools == AGENTBENCH_TOOLS


def test_the_first_message_is_agentbench_s_initial_observation(env):
    """task.py:68-72: f'The initial observation:\\n{observation}\\n\\nAvailable Actions:\\n
    {available_actions}'. The observation is WebShop's search page in text mode
    (search_page.html: "WebShop", "Instruction: <br>{{instruction_text}}", the "Search"
    button; joined by ' [SEP] ', web_agent_text_env.py:216); the available actions are
    get_available_actions()'s dict (lines 127-148): a search bar and the Search button."""
    for index in (0, 7):
        instruction = env.goal(index).instruction
        start = env.start(index)
        assert start.messages[1] == ChatMessage(
            "user",
            "The initial observation:\n"
            f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search\n\n"
            "Available Actions:\n{'has_search_bar': True, 'clickables': ['search']}",
        )


def test_a_played_action_is_answered_with_agentbench_s_tool_message(env):
    """task.py:79-84: a tool message with the call's id, f'Action: {action}\\n\\n
    Observation:\\n{observation}\\n\\nAvailable Actions:\\n{available_actions}', the action
    written search[<first argument>] (line 106); WebShop's results page (results_page.html:
    instruction, Back to Search, "Page 1 (Total results: N)", Next >, then id, title and
    price per product) and its clickables: buttons lower-cased, then product links
    lower-cased (web_agent_text_env.py:138-140)."""
    goal = env.goal(0)
    start = env.start(0)
    step = env.interact(start.session, _call("search_action", keywords="Navy Sneakers"))
    (reply,) = step.messages
    assert (reply.role, reply.tool_call_id) == ("tool", "call-7")
    hits = env.search("Navy Sneakers")[:10]
    products = " [SEP] ".join(
        f"{a} [SEP] {env.product(a).title} [SEP] {env.product(a).price_tag}" for a in hits
    )
    clickables = ["back to search", "next >", *(a.lower() for a in hits)]
    total = len(env.search("Navy Sneakers"))
    assert reply.content == (
        "Action: search[Navy Sneakers]\n\nObservation:\n"
        f"Instruction: [SEP] {goal.instruction} [SEP] Back to Search [SEP] "
        f"Page 1 (Total results: {total}) [SEP] Next > [SEP] {products}\n\n"
        f"Available Actions:\n{{'has_search_bar': False, 'clickables': {clickables!r}}}"
    )


def test_an_invalid_click_leaves_the_page_as_it_is(env):
    """WebShop's step (web_agent_text_env.py:86-125): a click whose lower-cased value is not
    a clickable of the page does nothing (status reward 0, not done, lines 111-112) and the
    observation is the page again; AgentBench sends it in the same tool message (task.py:
    79-84), the action as the model wrote it (line 108). The episode goes on."""
    start = env.start(0)
    step = env.interact(start.session, _call("search_action", keywords="sneakers"))
    (shown,) = step.messages
    page_and_actions = shown.content.split("\n\nObservation:\n", 1)[1]
    title = env.product(env.search("sneakers")[0]).title  # shown, but not a clickable
    for value in ("Add to Cart", "search", "", title):
        step = env.interact(start.session, _call("click_action", value=value))
        assert (step.status, step.reward, step.finish) == (Status.RUNNING, 0.0, False)
        (reply,) = step.messages
        assert reply.role == "tool"
        assert reply.content == f"Action: click[{value}]\n\nObservation:\n{page_and_actions}"
    assert "Invalid action" not in reply.content
    step = env.interact(start.session, _call("click_action", value="back to search"))
    assert "[SEP] Search\n\nAvailable Actions:\n" in step.messages[0].content
    assert start.session.invalid == 4


def test_the_oracle_clicks_values_from_the_available_actions_with_agentbench_s_schema(env):
    """The SFT warm start and the demos are the oracle's calls: each names only the schema's
    own argument (`keywords` or `value`, both required, nothing else: webshop.yaml:17-31)
    and each click value is one the previous message listed, as the prompt asks."""
    for index in range(0, env.num_instances, 7):
        start = env.start(index)
        shown = start.messages[-1].content
        for call in CHECK_AGENTS["oracle"](env, index, random.Random(0)):
            arguments = json.loads(call.arguments)
            if call.name == "click_action":
                assert list(arguments) == ["value"]
                available = ast.literal_eval(shown.rsplit("Available Actions:\n", 1)[1])
                clickables = available["clickables"]
                assert arguments["value"] in clickables, (index, arguments, clickables)
            else:
                assert (call.name, list(arguments)) == ("search_action", ["keywords"])
            step = env.interact(start.session, ChatMessage("assistant", "", [call]))
            shown = step.messages[-1].content
        assert (step.status, step.reward) == (Status.COMPLETED, 1.0)


# WebShop's item_page.html rendered for one product (its tags, classes and texts; the
# styling and script dropped): what a WebShop server sends for an item page.
ITEM_PAGE = """<!DOCTYPE html><html><head><title>WebShop</title>
<script src="jquery.min.js"></script></head><body>
<div id="instruction-text" class="text-center"><h4>Instruction:<br>i want red socks</h4></div>
<form method="post" action="/s1"><button type="submit" class="btn btn-success">Back to Search\
</button></form>
<form method="post" action="/search_results/s1/red/1"><button type="submit"
 class="btn btn-primary">&lt; Prev</button></form>
<img id="product-image" src="x.jpg" class="item-page-img">
<h4>color</h4><div class="radio-toolbar">
<input type="radio" id="radio_color0" name="color" value="red" data-url="/item_page/s1/B1/red/1/x">
<label for="radio_color0">red</label>
<input type="radio" id="radio_color1" name="color" value="dark blue" data-url="/item_page/s1/B1/y">
<label for="radio_color1">dark blue</label></div>
<h2>Warm Socks</h2><h4>Price: $9.99</h4><h4>Rating: N.A.</h4>
<form method="post" action="/item_sub_page/s1/B1/red/1/Description/{}">
<button class="btn btn-primary" type="submit">Description</button></form>
<form method="post" action="/item_sub_page/s1/B1/red/1/Features/{}">
<button class="btn btn-primary" type="submit">Features</button></form>
<form method="post" action="/item_sub_page/s1/B1/red/1/Reviews/{}">
<button class="btn btn-primary" type="submit">Reviews</button></form>
<form method="post" action="/done/s1/B1/{}">
<button type="submit" class="btn btn-lg purchase">Buy Now</button></form>
</body></html>"""


def test_a_server_page_reads_as_webshop_s_text_environment():
    """A server's item page becomes what WebShop's text environment makes of it: the visible
    texts joined by ' [SEP] ' (convert_html_to_text, web_agent_text_env.py:212-216; head and
    script hidden, tag_visible lines 268-272) and get_available_actions' clickables: the
    `.btn` buttons lower-cased, then the radio inputs' values (lines 134-145)."""
    page, targets, search = parse_page(ITEM_PAGE, "http://shop/item_page/s1/B1/red/1/{}")
    assert page.kind == "item" and search is None
    assert page.text == (
        "Instruction: [SEP] i want red socks [SEP] Back to Search [SEP] < Prev [SEP] color "
        "[SEP] red [SEP] dark blue [SEP] Warm Socks [SEP] Price: $9.99 [SEP] Rating: N.A. "
        "[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert page.available_actions() == {
        "has_search_bar": False,
        "clickables": [
            "back to search",
            "< prev",
            "description",
            "features",
            "reviews",
            "buy now",
            "red",
            "dark blue",
        ],
    }
    assert targets["dark blue"] == ("GET", "http://shop/item_page/s1/B1/y")
