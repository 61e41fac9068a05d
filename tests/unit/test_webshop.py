"""The webshop task: the in-process shop, WebShop's reward, the HTTP adapter, the whole loop."""

from __future__ import annotations

import ast
import json
import random
import socket
import threading
import uuid

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments._protocol import InfraError, SessionClosed, Status
from agentrl.environments.tasks.webshop.catalogue import (
    BUILTIN_SIZE,
    CatalogueError,
    Goal,
    Product,
    load_catalogue,
    load_goals,
)
from agentrl.environments.tasks.webshop.generate import generate_shop
from agentrl.environments.tasks.webshop.reward import (
    normalize_color,
    purchase_reward,
    token_set_ratio,
    type_reward,
)
from agentrl.environments.tasks.webshop.task import (
    CHECK_AGENTS,
    LIMIT_REACHED,
    NO_TOOL_CALL,
    NO_VALID_CALL,
)
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops.cli import agentrl_env as cli_env
from tests.unit.webshop_server import FakeWebShop


def _say(*calls: tuple[str, dict]) -> ChatMessage:
    return ChatMessage(
        "assistant",
        "",
        [ToolCall(f"c{i}", name, json.dumps(a)) for i, (name, a) in enumerate(calls)],
    )


def _search(keywords: str) -> ChatMessage:
    return _say(("search_action", {"keywords": keywords}))


def _click(value: str) -> ChatMessage:
    return _say(("click_action", {"value": value}))


def _play(env, index: int, agent: str, seed: int = 0):
    """The finishing step of one episode played by a check agent."""
    start = env.start(index)
    for call in CHECK_AGENTS[agent](env, index, random.Random(seed)):
        step = env.interact(start.session, ChatMessage("assistant", "", [call]))
        if step.finish:
            return step
    raise AssertionError(f"{agent} did not finish instance {index}")


SMALL = {"products_per_type": 25, "goals_per_type": 5}
"""A small built-in shop (12 types: 300 products, 60 goals) for the tests that play all of it."""


@pytest.fixture(scope="module")
def env():
    return make_task("webshop", split="all", **SMALL)


@pytest.fixture
def server():
    fake = FakeWebShop().start()
    yield fake
    fake.stop()


# --- the check agents ----------------------------------------------------------------


def test_oracle_buys_the_right_thing_everywhere_and_random_never(env):
    assert env.num_instances == 60
    report = check("webshop", env, "oracle")
    assert report.success_rate == 1.0, report.format()
    assert check("webshop", env, "random").successes == 0
    steps = [_play(env, i, "random", seed=i) for i in range(env.num_instances)]
    assert all(s.status == Status.COMPLETED for s in steps)
    rewards = [s.reward for s in steps]
    # a random first-page product with no options chosen: partial credit at most
    assert max(rewards) < 1.0 and sum(rewards) / len(rewards) < 0.6
    assert min(rewards) == 0.0  # some results are of another type (r_type 0)


def test_cli_check_prints_the_oracle_rate(capsys):
    argv = ["check", "--task", "webshop", "--option", "split=all", "--agent", "oracle"]
    argv += ["--option", "products_per_type=25", "--option", "goals_per_type=5"]
    assert cli_env.main(argv) == 0
    assert "task webshop, agent oracle: 60/60 succeeded (1.000)" in capsys.readouterr().out


def test_the_built_in_shop_has_thousands_of_products_and_goals():
    """The default shop: 12 types x 500 products, 12 x 250 goals, titles distinct, the same
    on every build, and a larger shop holds the smaller one's products."""
    products, instructions = generate_shop(*BUILTIN_SIZE)
    assert BUILTIN_SIZE == (500, 250) and (len(products), len(instructions)) == (6000, 3000)
    assert len({p["name"] for p in products}) == 6000
    assert len({p["asin"] for p in products}) == 6000
    generate_shop.cache_clear()
    again, again_instructions = generate_shop(*BUILTIN_SIZE)
    assert again == products and again_instructions == instructions
    small, _ = generate_shop(25, 5)
    by_asin = {p["asin"]: p for p in products}
    assert all(by_asin[p["asin"]] == p for p in small)
    env = make_task("webshop", split="all")
    assert env.num_instances == 3000 and len(env.goal(0).instruction) > 40
    with pytest.raises(ValueError, match="goals_per_type"):
        make_task("webshop", products_per_type=5, goals_per_type=6)
    with pytest.raises(ValueError, match="instructions=PATH"):
        make_task("webshop", catalogue="items.json")


def test_the_oracle_finds_goals_beyond_the_first_hits_in_the_big_shop():
    """With 500 products a type, an instruction's target can miss the top 50 hits: the
    oracle then searches its title; every 50th goal of the default shop, all bought."""
    env = make_task("webshop", split="all")
    misses = 0
    for index in range(0, env.num_instances, 50):
        goal = env.goal(index)
        misses += goal.asin not in env.search(goal.instruction)
        step = _play(env, index, "oracle")
        assert (step.status, step.reward) == (Status.COMPLETED, 1.0), index
    assert misses >= 1  # the refined search is exercised


# --- a session step by step ----------------------------------------------------------


def _reply(step) -> tuple[str, str, dict]:
    """A played action's tool message -> (action, page, available actions)."""
    (message,) = step.messages
    action, rest = message.content.removeprefix("Action: ").split("\n\nObservation:\n", 1)
    page, available = rest.split("\n\nAvailable Actions:\n")
    return action, page, ast.literal_eval(available)


def test_a_session_step_by_step(env):
    goal = env.goal(0)
    start = env.start(0)
    assert [m.role for m in start.messages] == ["system", "user"]
    assert goal.instruction in start.messages[1].content
    assert goal.instruction.endswith("and price lower than 50.00 dollars")
    search_page = start.session.observation

    # nothing to click on the search page: the page stays as it is
    action, page, available = _reply(env.interact(start.session, _click("Buy Now")))
    assert (action, page) == ("click[Buy Now]", search_page)
    assert available == {"has_search_bar": True, "clickables": ["search"]}

    action, page1, available = _reply(env.interact(start.session, _search("sneakers shoes")))
    assert action == "search[sneakers shoes]" and available["has_search_bar"] is False
    assert "[SEP] Back to Search [SEP] Page 1 (Total results: 25) [SEP] Next > [SEP]" in page1
    assert "< Prev" not in page1 and "[Next >]" not in page1  # no brackets: WebShop's text
    assert available["clickables"][:2] == ["back to search", "next >"]
    results = env.search("sneakers shoes")
    assert available["clickables"][2:] == [a.lower() for a in results[:10]]
    # page through to the target, then back and forth
    page_of_target = results.index(goal.asin) // 10
    assert page_of_target == 1  # "sneakers shoes" lists the target 16th: on page 2
    step = env.interact(start.session, _click(goal.asin))  # not on this page
    assert _reply(step)[1] == page1
    _, page2, available = _reply(env.interact(start.session, _click("next >")))
    assert f"[SEP] {goal.asin} [SEP]" in page2 and "Next > [SEP]" in page2
    assert available["clickables"][:3] == ["back to search", "< prev", "next >"]
    assert _reply(env.interact(start.session, _click("< Prev")))[1] == page1
    env.interact(start.session, _click("Next >"))
    title = env.product(goal.asin).title
    assert _reply(env.interact(start.session, _click(title)))[1] == page2  # ids only
    _, item, available = _reply(env.interact(start.session, _click(goal.asin)))
    assert item.endswith("[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert available["clickables"][:6] == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
    ]
    assert goal.options[0] in available["clickables"][6:]
    for value in goal.options:
        _, chosen, _ = _reply(env.interact(start.session, _click(value.upper())))  # any case
    assert chosen == item  # WebShop's text shows no choice
    _, features, available = _reply(env.interact(start.session, _click("Features")))
    assert "Buy Now" not in features
    assert available["clickables"] == ["back to search", "< prev"]
    assert _reply(env.interact(start.session, _click("< Prev")))[1] == item  # options kept
    step = env.interact(start.session, _click("Buy Now"))
    assert (step.status, step.reward, step.finish) == (Status.COMPLETED, 1.0, True)
    assert _reply(step)[1].endswith("[SEP] 1.0")
    m = step.metrics
    assert (m["env/invalid_actions"], m["env/searches"], m["env/success"]) == (3.0, 1.0, 1.0)
    assert (m["env/r_type"], m["env/r_attr"], m["env/r_option"], m["env/r_price"]) == (1, 1, 1, 1)
    with pytest.raises(SessionClosed):
        env.interact(start.session, _click("Buy Now"))


def test_a_search_works_from_any_page_and_next_goes_past_the_last_hit(env):
    """WebShop's step searches whatever the page (web_agent_text_env.py:102-106) and its
    results template always shows ``Next >`` (results_page.html): past the last hit the
    page lists nothing. No keywords (``search[]`` does not parse, engine.py:117-128): the
    page stays."""
    start = env.start(0)
    env.interact(start.session, _search("sneakers shoes"))
    env.interact(start.session, _click(env.search("sneakers shoes")[0]))
    _, page, available = _reply(env.interact(start.session, _search("coffee")))
    hits = env.search("coffee")
    assert f"Page 1 (Total results: {len(hits)})" in page
    assert available["clickables"][2:] == [a.lower() for a in hits[:10]]
    for _ in range(len(hits) // 10 + 1):
        _, page, available = _reply(env.interact(start.session, _click("next >")))
    assert page.endswith(f"(Total results: {len(hits)}) [SEP] < Prev [SEP] Next >")
    assert available["clickables"] == ["back to search", "< prev", "next >"]
    assert _reply(env.interact(start.session, _search("")))[1] == page
    assert start.session.invalid == 1


def test_a_partial_purchase_is_a_completed_episode_with_its_reward(env):
    goal = env.goal(0)  # rubber sole, lightweight; olive, 9; under $50 (fashion sneakers)
    start = env.start(0)
    env.interact(start.session, _search(goal.instruction))
    env.interact(start.session, _click(goal.asin))
    env.interact(start.session, _click(goal.options[0]))  # the colour only
    step = env.interact(start.session, _click("Buy Now"))
    # (2 attributes + 1 of 2 options + price) / (2 + 2 + 1) = 4/5
    assert (step.status, step.reward) == (Status.COMPLETED, pytest.approx(0.8))
    assert step.metrics["env/success"] == 0.0 and step.metrics["env/r_option"] == 0.5


def _available(page: str) -> str:
    return f"Available Actions:\n{{'has_search_bar': {page == 'search'}, 'clickables': "


@pytest.mark.parametrize(
    ("message", "replies"),
    [
        (
            ChatMessage("assistant", "I would buy the red one."),
            [("user", f"Observation:\n{NO_TOOL_CALL}\n\n" + _available("search"))],
        ),
        (
            ChatMessage("assistant", "", [ToolCall("c0", "click_action", "[1, 2]")]),
            [("user", NO_VALID_CALL), ("user", "Observation:\nWebShop [SEP] Instruction:")],
        ),
        (
            ChatMessage("assistant", "", [ToolCall("c0", "search_action", "{}")]),
            [("user", NO_VALID_CALL), ("user", "Observation:\nWebShop [SEP] Instruction:")],
        ),
        (
            _say(("add_to_cart", {"item": "x"})),
            [("user", "Observation:\nWebShop [SEP] Instruction:")],
        ),
        (
            _say(("add_to_cart", {})),
            [("user", "Observation:\nWebShop [SEP] Instruction:")],
        ),
        (
            ChatMessage("assistant", "", [ToolCall("c0", "add_to_cart", "[1]")]),
            [("user", NO_VALID_CALL), ("user", "Observation:\nWebShop [SEP] Instruction:")],
        ),
    ],
)
def test_bad_calls_are_answered_as_agentbench_does_and_the_episode_goes_on(env, message, replies):
    """Parity with AgentBench src/server/tasks/webshop/task.py: no tool call -> the observation
    becomes line 95's text, shown next round as the user message of lines 75-78
    ("Observation:\n...\n\nAvailable Actions:\n..."); arguments json.loads cannot give a
    object (line 102-103) or, for a known function, a first value (line 106/108) -> the
    user message of line 113, `continue`, then the unchanged observation as that user
    message (action is None, lines 97 and 74-78); an unknown function name with object
    arguments sets no action (lines 105-108), so only that user message follows. The
    episode goes on in every case (`continue`, or `if not action` at line 125)."""
    assert NO_TOOL_CALL == "No executable tool calls found! You should call a tool instead."
    assert NO_VALID_CALL == "No valid tool call found from agent."
    start = env.start(0)
    step = env.interact(start.session, message)
    assert (step.status, step.reward, step.finish) == (Status.RUNNING, 0.0, False)
    assert [m.role for m in step.messages] == [role for role, _ in replies]
    for got, (_, text) in zip(step.messages, replies, strict=True):
        assert got.content.startswith(text), got.content
    assert step.messages[-1].content.endswith("'clickables': ['search']}")
    for call in CHECK_AGENTS["oracle"](env, 0, random.Random(0)):  # still solvable
        step = env.interact(start.session, ChatMessage("assistant", "", [call]))
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert step.metrics["env/bad_calls"] == 1.0


def test_agentbench_plays_the_first_call_with_its_first_argument(env):
    """Parity with AgentBench webshop/task.py:99-108: tool_calls[0] only; the action is
    search[<first argument value>] or click[<first argument value>] whatever the key."""
    start = env.start(0)
    calls = [
        ToolCall("c0", "search_action", json.dumps({"query": "sneakers"})),
        ToolCall("c1", "click_action", json.dumps({"value": "Back to Search"})),
    ]
    step = env.interact(start.session, ChatMessage("assistant", "", calls))
    assert len(step.messages) == 1 and step.messages[0].role == "tool"
    action, page, _ = _reply(step)
    assert action == "search[sneakers]" and "Page 1 (Total results: 13)" in page
    step = env.interact(start.session, _say(("click_action", {"button": 3})))
    assert _reply(step)[:2] == ("click[3]", page)  # not a clickable: the page stays


def test_the_turn_limit_is_20_rounds_and_ends_with_agentbench_s_tool_message(env):
    """Parity with AgentBench webshop/task.py: `for j in range(self.max_rounds)` (line 66),
    max_rounds from `round`, 20 in configs/tasks/webshop.yaml line 5 (task.py:41 default 20);
    every response uses a round, bad ones too; running out -> TASK_LIMIT_REACHED (line 139),
    reward 0 (line 140; `reward` is only set by env.step) and the tool message
    "Task limit reached." with the last call id (lines 142-146)."""
    assert LIMIT_REACHED == "Task limit reached."
    assert env.turn_limit(2) == 20
    start = env.start(0)
    assert env.interact(start.session, _search("sneakers")).status == Status.RUNNING
    for _ in range(18):
        assert env.interact(start.session, ChatMessage("assistant", "hmm")).status == (
            Status.RUNNING
        )
    step = env.interact(start.session, ChatMessage("assistant", "", [ToolCall("c9", "x", "[]")]))
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert [(m.role, m.content) for m in step.messages] == [
        ("user", NO_VALID_CALL),
        ("tool", LIMIT_REACHED),
    ]
    assert step.messages[-1].tool_call_id == "c0" and step.metrics["env/bad_calls"] == 19.0


def test_turn_limit_and_cancel():
    env = make_task("webshop", max_turns=2, split="all")
    start = env.start(1)
    assert env.interact(start.session, _search("coffee")).status == Status.RUNNING
    step = env.interact(start.session, _click("Back to Search"))
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    other = env.start(1)
    env.cancel(other.session)
    env.cancel(other.session)  # idempotent
    with pytest.raises(SessionClosed):
        env.interact(other.session, _search("coffee"))
    with pytest.raises(IndexError):
        env.start(env.num_instances)


def test_sessions_in_threads_do_not_share_state(env):
    rewards: dict[int, float] = {}

    def run(index: int) -> None:
        rewards[index] = _play(env, index, "oracle").reward

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rewards == {i: 1.0 for i in range(8)}


# --- WebShop's reward ----------------------------------------------------------------


def test_token_set_ratio_and_colours():
    assert token_set_ratio("Machine Washable", "machine-washable") == 100  # same tokens
    assert token_set_ratio("9.5", "9") == 100  # {9, 5} vs {9}: one set inside the other
    # {footrest} common; "footrest with" vs "footrest without": LCS 13, 200*13/(13+16) = 89.7
    assert token_set_ratio("with footrest", "without footrest") == 90
    # nothing common: sorted "free gluten" vs "acid low", LCS " l" = 2: 200*2/(11+8) = 21.1
    assert token_set_ratio("gluten free", "low acid") == 21
    assert normalize_color("navy blue") == "blue" and normalize_color("rose gold") == "gold"
    assert normalize_color("8.5") == "8.5"


def test_type_reward_follows_webshop_rules():
    same = dict(
        query="q", goal_query="q", product_category="A \u203a B", goal_product_category="A \u203a B"
    )
    assert type_reward(name="Trail Shoes", goal_name="Running Shoes", **same) == 1.0
    other = dict(
        query="q", goal_query="z", product_category="A \u203a B", goal_product_category="C"
    )
    # goal nouns {running, shoes}; shared {shoes}: 1/2 > 0.2 -> the title alone matches
    assert type_reward(name="Walking Shoes", goal_name="Running Shoes", **other) == 1.0
    # goal nouns {aldane, cotton, graphic, tee, shirt, print, top, blouse, tunic, casual}
    # shared {tee}: 1/10 = 0.1, not > 0.2 and nothing else matches -> 0.5
    long_name = "Aldane Cotton Graphic Tee Shirt Print Top Blouse Tunic Casual"
    assert type_reward(name="Basic Tee", goal_name=long_name, **other) == 0.5
    # shared nothing -> 0.0 even though query and category match
    assert type_reward(name="Office Chair", goal_name="Ground Coffee", **same) == 0.0


def _product(**changes) -> Product:
    fields = dict(
        asin="P1",
        title="Kestrel Breathable Running Sneakers",
        description="Light and comfortable.",
        bullet_points=("RUBBER SOLE: grips well",),
        pricing=(60.0,),
        options={"color": ("red", "navy blue"), "size": ("9", "9.5")},
        attributes=("lace-up", "memory foam"),
        category="fashion",
        query="men's sneakers",
        product_category="Shoes \u203a Men \u203a Sneakers",
    )
    fields.update(changes)
    return Product(**fields)


GOAL = Goal(
    asin="P1",
    instruction="running sneakers, lace up, rubber sole, arch support, in blue, size 9.5",
    attributes=("lace up", "rubber sole", "arch support"),
    options=("blue", "9.5"),
    price_upper=50.0,
    query="men's sneakers",
    category="fashion",
    product_category="Shoes \u203a Men \u203a Sneakers",
    name="Kestrel Breathable Running Sneakers",
)


def test_purchase_reward_by_hand():
    product = _product()
    # attrs: "lace up" ~ "lace-up" (ratio 100), "rubber sole" in the bullet points,
    # "arch support" nowhere -> 2; options: navy blue -> "blue" matches, size "9" is not
    # exactly "9.5" -> 1; price 60 > 50 -> 0.  r_type 1 (same query).
    # total = 1 * (2 + 1 + 0) / (3 + 2 + 1) = 0.5
    parts = purchase_reward(product, GOAL, 60.0, {"color": "navy blue", "size": "9"})
    assert (parts.attr_matches, parts.option_matches, parts.price_ok) == (2, 1, False)
    assert parts.total == pytest.approx(0.5)
    # both options and the price right, "arch support" still missing -> (2 + 2 + 1) / 6
    parts = purchase_reward(product, GOAL, 45.0, {"color": "navy blue", "size": "9.5"})
    assert parts.total == pytest.approx(5 / 6)
    # no options chosen, other product type: title nouns {kestrel, breathable, running,
    # sneakers} vs {ground, coffee} share nothing -> r_type 0 -> 0
    coffee = _product(title="Ground Coffee", query="ground coffee", product_category="Food")
    assert purchase_reward(coffee, GOAL, 10.0, {}).total == 0.0
    # an option that only appears in the title still counts (WebShop counts chosen options):
    # "breathable" is in the title -> options 2 of 2 without any size, total stays <= 1
    parts = purchase_reward(product, GOAL, 45.0, {"color": "navy blue", "fit": "breathable"})
    assert parts.option_matches == 2 and parts.total == pytest.approx(5 / 6)


# --- data files ----------------------------------------------------------------------


def test_webshop_format_files_load(tmp_path):
    """items_shuffle / items_ins_v2 / items_human_ins shaped files, as WebShop ships them."""
    items = [
        {
            "asin": "B000000001",
            "name": "Acme Organic Ground Coffee",
            "full_description": "Rich and smooth.",
            "small_description": "Organic beans",
            "pricing": "$12.00 - $16.00",
            "customization_options": {"Flavor Name": [{"value": "Vanilla/Bean", "image": None}]},
            "category": "grocery",
            "query": "Ground Coffee ",
            "product_category": "Grocery \u203a Coffee",
            "images": ["x.jpg"],
        },
        {"asin": "nan", "name": "skipped", "customization_options": None},
        {
            "asin": "B000000002",
            "name": "Acme Tea",
            "full_description": "",
            "small_description": ["Green tea"],
            "pricing": "",
            "customization_options": None,
            "category": "grocery",
            "query": "tea",
            "product_category": "Grocery \u203a Tea",
            "images": ["y.jpg"],
        },
    ]
    human = {
        "B000000001": [
            {
                "asin": "B000000001",
                "instruction": "i want organic ground coffee in vanilla bean flavor.",
                "instruction_attributes": ["organic"],
                "instruction_options": ["vanilla | bean"],
            },
            {"instruction": "skipped: no attributes", "instruction_attributes": []},
        ]
    }
    attrs = {"B000000001": {"attributes": ["organic", "ground coffee"]}}
    paths = {}
    for name, data in (("items.json", items), ("human.json", human), ("attrs.json", attrs)):
        paths[name] = tmp_path / name
        paths[name].write_text(json.dumps(data))
    products = load_catalogue(paths["items.json"], paths["attrs.json"])
    assert sorted(products) == ["B000000001", "B000000002"]
    coffee, tea = products["B000000001"], products["B000000002"]
    assert coffee.options == {"flavor name": ("vanilla | bean",)}
    assert coffee.pricing == (12.0, 16.0) and 12.0 <= coffee.price <= 16.0
    assert coffee.query == "ground coffee" and coffee.bullet_points == ("Organic beans",)
    assert tea.pricing == (100.0,) and tea.attributes == ("DUMMY_ATTR",)
    (goal,) = load_goals(paths["human.json"], products)
    # price_upper: the larger of two of the next four tens above the price (20..50)
    assert goal.price_upper in (30.0, 40.0, 50.0)
    assert goal.instruction == (
        "i want organic ground coffee in vanilla bean flavor"
        f", and price lower than {goal.price_upper:.2f} dollars"
    )
    env = make_task(
        "webshop",
        catalogue=str(paths["items.json"]),
        instructions=str(paths["human.json"]),
        attributes=str(paths["attrs.json"]),
    )
    assert check("webshop", env, "oracle").success_rate == 1.0


def test_bad_data_names_the_item(tmp_path):
    bad = tmp_path / "items.json"
    bad.write_text(json.dumps([{"asin": "B1", "name": "ok"}, {"asin": "B2"}]))
    with pytest.raises(CatalogueError, match=r"items.json item 1 \(asin B2\): bad product"):
        load_catalogue(bad)
    bad.write_text("[{")
    with pytest.raises(CatalogueError, match=r"items.json: not JSON"):
        load_catalogue(bad)
    products = load_catalogue()
    ins = tmp_path / "ins.json"
    ins.write_text(json.dumps({"NOPE": [{"instruction": "x", "instruction_attributes": ["a"]}]}))
    with pytest.raises(CatalogueError, match="asin NOPE, not in the catalogue"):
        load_goals(ins, products)
    asin = next(iter(products))
    ins.write_text(json.dumps({asin: [{"instruction_attributes": ["a"]}]}))
    with pytest.raises(CatalogueError, match=f"asin {asin} instruction 0: bad entry"):
        load_goals(ins, products)
    with pytest.raises(ValueError, match="num_instances is for server"):
        make_task("webshop", num_instances=3)


# --- a WebShop server over HTTP ------------------------------------------------------


def test_the_http_adapter_plays_a_webshop_server(server):
    env = make_task("webshop", server=server.url, split="all", **SMALL)
    assert check("webshop", env, "oracle").success_rate == 1.0
    assert server.requests > 60 * 4  # every page came over HTTP
    goal = env.goal(2)
    start = env.start(2)
    assert "[SEP] Search" in start.messages[1].content
    assert goal.instruction in start.messages[1].content
    search_page = start.messages[1].content.split("\n")[1]
    assert search_page.startswith("Instruction: ") and search_page.endswith("[SEP] Search")
    step = env.interact(start.session, _click("Next >"))  # not on the search page
    assert _reply(step)[1] == search_page and start.session.invalid == 1
    env.interact(start.session, _search(goal.instruction))
    _, item, available = _reply(env.interact(start.session, _click(goal.asin.lower())))
    assert item.endswith("[SEP] Buy Now") and "buy now" in available["clickables"]
    _, page, available = _reply(env.interact(start.session, _click("Description")))
    assert available["clickables"] == ["back to search", "< back to item page"]
    env.interact(start.session, _click("< Prev"))  # the app's "< Back to Item Page"
    _, page, _ = _reply(env.interact(start.session, _search("coffee")))  # from any page
    assert "Total results" in page
    assert goal.asin not in env.search("coffee")[:10]
    assert _reply(env.interact(start.session, _click(goal.asin)))[1] == page  # page stays
    env.interact(start.session, _search(goal.instruction))
    env.interact(start.session, _click(goal.asin))
    env.interact(start.session, _click(goal.options[0]))
    step = env.interact(start.session, _click("buy now"))
    # server-computed: the first option only -> (2 + 1 + 1) / (2 + n_options + 1)
    expected = 4 / (3 + len(goal.options)) if len(goal.options) > 1 else 1.0
    assert (step.status, step.reward) == (Status.COMPLETED, pytest.approx(expected))
    assert step.metrics["env/purchased"] == 1.0 and "env/r_type" not in step.metrics


def test_an_unreachable_server_is_an_infra_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens
    env = make_task("webshop", server=f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(InfraError, match="webshop server"):
        env.start(0)


# --- the whole loop ------------------------------------------------------------------


@pytest.mark.slow
def test_the_webshop_task_through_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    broker = f"memory://smoke-webshop-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp_path, broker, "smoke-webshop", steps=1)
    raw["tasks"] = {"webshop": {"options": {"max_turns": 2}}}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics["env/webshop/episodes"] == 4 and "env/webshop/reward" in metrics


def test_http_search_keywords_with_a_lone_surrogate_are_sent_replaced(server):
    env = make_task("webshop", server=server.url)
    step = env.interact(env.start(0).session, _search("coffee \ud800"))
    assert step.status == Status.RUNNING and "Back to Search" in step.messages[0].content


# --- levels and the split ------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 1, 2])
def test_every_level_is_solved_by_the_oracle_and_rarely_by_random(level):
    env = make_task("webshop", levels=[level], split="test", **SMALL)
    assert check("webshop", env, "oracle").success_rate == 1.0
    # a random first-page product: level 0 observed 1/34 (test) and 6/116 (train); bound 15%
    assert check("webshop", env, "random").success_rate <= (0.15 if level == 0 else 0.0)
    demo = make_task("webshop", levels=[level], split="test", demo=True, **SMALL)
    assert check("webshop", demo, "oracle").success_rate == 1.0


def test_level_goals_turn_limits_and_the_exact_judge():
    env = make_task("webshop", levels=[0, 1])
    assert [env.level(i) for i in range(4)] == [0, 1, 0, 1]
    assert (env.turn_limit(0), env.turn_limit(1), env.max_turns) == (5, 6, 6)
    take, choose = env.goal(0), env.goal(1)
    assert take.instruction == f'search for "{take.name}" and buy it' and not take.options
    (value,) = choose.options
    assert choose.instruction == f'search for "{choose.name}", choose "{value}" and buy it'
    assert choose.instruction in env.start(1).messages[1].content
    start = env.start(1)  # the right product without the option: 0
    env.interact(start.session, _search(choose.name))
    env.interact(start.session, _click(choose.asin))
    step = env.interact(start.session, _click("Buy Now"))
    assert (step.status, step.reward, step.metrics["env/level"]) == (Status.COMPLETED, 0.0, 1.0)
    start = env.start(0)  # another product of the same type: 0 (WebShop's reward would pay)
    env.interact(start.session, _search(take.name))
    other = next(a for a in env.search(take.name) if a != take.asin)
    env.interact(start.session, _click(other))
    assert env.interact(start.session, _click("Buy Now")).reward == 0.0
    start = env.start(0)  # level 0 ends at its own limit of 5
    for _ in range(4):
        assert env.interact(start.session, _click("Next >")).status == Status.RUNNING
    assert env.interact(start.session, _click("Next >")).status == Status.TASK_LIMIT_REACHED
    with pytest.raises(ValueError, match="levels"):
        make_task("webshop", levels=[5])
    with pytest.raises(ValueError, match="split"):
        make_task("webshop", split="validation")


@pytest.mark.parametrize("level", [0, 1, 2])
def test_train_and_test_never_share_a_product(level):
    train = make_task("webshop", levels=[level], split="train")
    test = make_task("webshop", levels=[level], split="test")
    train_goals = [train.goal(i) for i in range(train.num_instances)]
    test_goals = [test.goal(i) for i in range(test.num_instances)]
    assert not {g.asin for g in train_goals} & {g.asin for g in test_goals}
    assert not {g.instruction for g in train_goals} & {g.instruction for g in test_goals}
    everything = make_task("webshop", levels=[level], split="all").num_instances
    assert train.num_instances + test.num_instances == everything
    if level == 1:  # hundreds of distinct instances per split
        assert len({g.instruction for g in test_goals}) >= 200
    again = make_task("webshop", levels=[level], split="test")
    assert [again.goal(i) for i in range(test.num_instances)] == test_goals
    reseeded = make_task("webshop", levels=[level], split="test", seed=1)
    assert {reseeded.goal(i).asin for i in range(reseeded.num_instances)} != {
        g.asin for g in test_goals
    }


def test_a_server_plays_the_full_level_split_by_goal_number(server):
    with pytest.raises(ValueError, match="level 2 only"):
        make_task("webshop", server=server.url, levels=[0])
    train = make_task("webshop", server=server.url, **SMALL)
    test = make_task("webshop", server=server.url, split="test", **SMALL)
    assert train.num_instances + test.num_instances == 60 and test.num_instances >= 1
    train_goals = {train.goal(i).instruction for i in range(train.num_instances)}
    assert not train_goals & {test.goal(i).instruction for i in range(test.num_instances)}
