"""The kg task (AgentBench KnowledgeGraph on rdflib or a SPARQL endpoint) and its checks."""

from __future__ import annotations

import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import agent_message, check
from agentrl.environments._protocol import InfraError, SessionClosed, Status
from agentrl.environments.tasks.kg.backend import RDFBackend, SPARQLBackend, load_graph
from agentrl.environments.tasks.kg.items import PARAMS, ItemError, load_items, parse_action
from agentrl.environments.tasks.kg.task import CHECK_AGENTS, KGTask, f1_score
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops.cli import agentrl_env as cli_env

AGENTBENCH_KG = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "knowledgegraph" / "dev.json"
)
BUILTIN = Path(__file__).resolve().parents[2] / "environments/tasks/kg/data/kg_builtin.json"
BUILTIN_TTL = BUILTIN.with_suffix(".ttl")


def _say(*calls: tuple[str, dict]) -> ChatMessage:
    return ChatMessage(
        "assistant",
        "",
        [ToolCall(f"c{i}", name, json.dumps(a)) for i, (name, a) in enumerate(calls)],
    )


def _do(env: KGTask, session, name: str, **args) -> str:
    step = env.interact(session, _say((name, args)))
    assert step.status == Status.RUNNING, step
    return step.messages[0].content


def _index(env: KGTask, qid: str) -> int:
    return next(i for i in range(env.num_instances) if env.item(i).qid == qid)


# --- the built-in set, the scripted agents, the CLI -----------------------------------


def test_built_in_set_oracle_succeeds_everywhere_and_random_almost_nowhere():
    env = make_task("kg", split="all")
    assert env.num_instances == 14
    assert check("kg", env, "oracle").success_rate == 1.0
    # random: one or two random hops from a random entity; it can hit a one-hop question
    # by luck (item 0: 1 of 4 relations, half the time one hop), so the bound is near 0.
    rates = [check("kg", env, "random", seed=seed).success_rate for seed in range(3)]
    assert max(rates) <= 1 / 14, rates


def test_built_in_questions_cover_every_tool():
    used = {a.name for item in load_items() for a in item.actions}
    assert used == set(PARAMS)
    tools = {
        t["function"]["name"]: t["function"]["parameters"]
        for t in make_task("kg", split="all").tools
    }
    assert list(tools) == list(PARAMS)
    assert tools["get_neighbors"]["required"] == ["variable", "relation"]
    with_answer = make_task("kg", split="all", answer_tool=True).tools
    assert [t["function"]["name"] for t in with_answer] == [*PARAMS, "final_answer"]
    assert with_answer[-1]["function"]["parameters"]["required"] == ["variable"]


def test_cli_check(capsys):
    assert (
        cli_env.main(["check", "--task", "kg", "--agent", "oracle", "--option", "split=all"]) == 0
    )
    assert "task kg, agent oracle: 14/14 succeeded (1.000)" in capsys.readouterr().out


def test_the_oracle_reports_a_wrong_gold_answer(tmp_path):
    items = json.loads(BUILTIN.read_text())
    items[0]["answer"] = [{"answer_argument": "m.0kp02", "entity_name": "Tomas Veyl"}]
    data = tmp_path / "wrong.json"
    data.write_text(json.dumps(items))
    report = check("kg", make_task("kg", data=str(data), split="all"), "oracle")
    assert report.successes == 13 and len(report.failures) == 1
    assert report.failures[0].startswith("instance 0 kg_builtin_00 'who directed silver harbor?'")
    assert "completed, reward 0" in report.failures[0]


@pytest.mark.skipif(not AGENTBENCH_KG.exists(), reason=f"no AgentBench sample at {AGENTBENCH_KG}")
def test_the_agentbench_sample_loads_and_every_gold_action_parses():
    items = load_items(AGENTBENCH_KG)  # raises ItemError naming the item otherwise
    assert len(items) == 20
    assert all(item.answers and item.actions for item in items)
    raw = json.loads(AGENTBENCH_KG.read_text())
    for item, entry in zip(items, raw, strict=True):
        assert [str(a) for a in item.actions] == [
            str(parse_action(text)) for text in entry["actions"]
        ]
    first = items[0]  # get_neighbors x3 then intersection(#1,#2): answers #3
    assert first.answers == {"m.05ch8k4"}
    assert str(first.actions[-1]) == "intersection(#1, #2)"
    # its questions need Freebase (test_kg_freebase.py): an endpoint, never asked here
    nowhere = "http://127.0.0.1:9/sparql"
    env = make_task("kg", data=str(AGENTBENCH_KG), endpoint=nowhere, split="all")
    calls = list(CHECK_AGENTS["oracle"](env, 0, None))
    # an entity by its name, as the question lists it (AgentBench maps a name to its id)
    quote = "Did you see that thing? That\u2019s Sidat-Singh! The Syracuse Walking Dream!"
    assert raw[0]["entities"][quote] == "m.09rl290" and raw[0]["actions"][0] == (
        "get_relations(m.09rl290)"
    )
    assert json.loads(calls[0].arguments) == {"variable": quote}
    assert json.loads(calls[3].arguments) == {
        "variable": "#0",
        "relation": "basketball.basketball_player.position_s",
    }
    assert calls[-1] == "Final Answer: #3"
    question = env.start(0).messages[-1].content
    assert question == f"{raw[0]['question']}\nEntities: [{', '.join(raw[0]['entities'])}]"


# --- endings (the AgentBench episode itself: test_kg_agentbench.py) ---------------------


def test_f1_score():
    gold = frozenset({"a", "b"})
    assert f1_score(frozenset({"a", "b"}), gold) == 1.0
    assert f1_score(frozenset({"a"}), gold) == pytest.approx(2 / 3)  # P 1, R 1/2
    assert f1_score(frozenset({"a", "c", "d"}), gold) == pytest.approx(0.4)  # P 1/3, R 1/2
    assert f1_score(frozenset(), gold) == 0.0 and f1_score(frozenset({"c"}), gold) == 0.0


def test_turn_limit_and_cancel():
    env = make_task("kg", max_turns=2, split="all")
    s = env.start(0).session
    _do(env, s, "get_relations", variable="m.0kf01")
    step = env.interact(s, _say(("get_relations", {"variable": "m.0kf01"})))
    assert (step.status, step.finish, step.reward) == (Status.TASK_LIMIT_REACHED, True, 0.0)
    assert step.messages[0].content.startswith("Observation: [film.film.country")
    other = env.start(0).session
    env.cancel(other)
    env.cancel(other)  # idempotent
    with pytest.raises(SessionClosed):
        env.interact(other, _say(("get_relations", {"variable": "m.0kf01"})))


def test_sessions_run_from_several_threads():
    env = make_task("kg", split="all")
    results: dict[int, float] = {}

    def play(index: int) -> None:
        s = env.start(index).session
        for call in CHECK_AGENTS["oracle"](env, index, None):
            step = env.interact(s, agent_message(call))
        results[index] = step.reward

    threads = [threading.Thread(target=play, args=(i,)) for i in range(env.num_instances)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: 1.0 for i in range(env.num_instances)}


# --- data errors and the grammar --------------------------------------------------------


def test_the_action_grammar():
    assert parse_action("get_neighbors(m.0x, film.film.genre)").args == ("m.0x", "film.film.genre")
    assert parse_action("get_relations(Smith, John)").args == ("Smith, John",)
    assert parse_action(" count( #2 ) ").args == ("#2",)
    for bad in ("get_neighbors(m.0x)", "union(#0,#1)", "count #2", "get_relations()"):
        with pytest.raises(ValueError):
            parse_action(bad)


def test_bad_data_is_reported_with_the_item(tmp_path):
    items = json.loads(BUILTIN.read_text())
    cases = [
        ({**items[2], "actions": ["get_neighbors(m.0kp03)"]}, r"\[0\] \(kg_builtin_02\): bad gold"),
        ({**items[2], "actions": ["count(#0)"]}, r"count\(#0\) uses #0 before it is made"),
        ({**items[2], "answer": []}, r"\[0\] \(kg_builtin_02\): not a kg item"),
        ({"question": "q", "answer": [{"entity_name": "x"}]}, r"\[0\]: not a kg item"),
    ]
    bad = tmp_path / "bad.json"
    for item, pattern in cases:
        bad.write_text(json.dumps([item]))
        with pytest.raises(ItemError, match=pattern):
            load_items(bad)
    bad.write_text("{")
    with pytest.raises(ItemError, match=r"bad\.json: not JSON"):
        load_items(bad)
    with pytest.raises(ValueError, match="graph or endpoint"):
        KGTask(graph="g.ttl", endpoint="http://localhost:1/sparql")


# --- SPARQL over HTTP, against the built-in graph served in-process --------------------
# Two real SPARQL engines behind the SPARQL 1.1 protocol (POST, form-encoded ``query``,
# JSON results): rdflib's, and Oxigraph's (pyoxigraph, a standalone store in Rust).


def _rdflib_engine():
    graph = load_graph()
    return lambda query: graph.query(query).serialize(format="json")


def _oxigraph_engine():
    import pyoxigraph as ox  # a dev extra: CI installs it, so these never skip

    store = ox.Store()
    store.load(BUILTIN_TTL.read_bytes(), format=ox.RdfFormat.TURTLE)
    return lambda query: store.query(query).serialize(format=ox.QueryResultsFormat.JSON)


@pytest.fixture(scope="module", params=["rdflib", "oxigraph"])
def endpoint(request):
    run = {"rdflib": _rdflib_engine, "oxigraph": _oxigraph_engine}[request.param]()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            query = urllib.parse.parse_qs(body)["query"][0]
            try:
                payload = run(query)
            except Exception as exc:  # a bad query is the client's error: answer 400
                self.send_error(400, str(exc)[:200])
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/sparql-results+json")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/sparql"
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_oxigraph_store_holds_the_whole_built_in_graph():
    import pyoxigraph as ox  # a dev extra: CI installs it, so these never skip

    store = ox.Store()
    store.load(BUILTIN_TTL.read_bytes(), format=ox.RdfFormat.TURTLE)
    assert len(store) == len(load_graph()) > 400  # every triple, none dropped


def test_the_oracle_succeeds_through_a_sparql_endpoint(endpoint):
    env = make_task("kg", endpoint=endpoint)
    assert isinstance(env.backend, SPARQLBackend)
    assert check("kg", env, "oracle").success_rate == 1.0


def test_cli_check_against_an_endpoint(endpoint, capsys):
    # how the AgentBench sample runs, given a Freebase endpoint: --data dev.json --option ...
    argv = ["check", "--task", "kg", "--option", f"endpoint={endpoint}", "--agent", "random"]
    argv += ["--option", "split=all"]
    assert cli_env.main(argv) == 0
    assert "task kg, agent random: 0/14 succeeded" in capsys.readouterr().out


def test_sparql_and_rdflib_backends_agree(endpoint):
    local, remote = RDFBackend(load_graph()), SPARQLBackend(endpoint, chunk=2)
    films = {"m.0kf01", "m.0kf03", "m.0kf06"}  # three films: two VALUES chunks
    for backend in (local, remote):
        assert "film.film.starring" in backend.relations(films)
    assert local.relations(films) == remote.relations(films)
    assert local.neighbors(films, "film.film.starring") == remote.neighbors(
        films, "film.film.starring"
    )
    assert (
        local.attributes(films)
        == remote.attributes(films)
        == {
            "film.film.estimated_budget",
            "film.film.initial_release_date",
            "film.film.runtime",
        }
    )
    for attribute in ("film.film.runtime", "film.film.initial_release_date"):
        assert local.attribute_values(films, attribute) == remote.attribute_values(films, attribute)
    assert local.names(films) == remote.names(films)
    assert local.names({"m.0kf01"}) == {"m.0kf01": "Silver Harbor"}
    assert remote.relation_type("film.film.genre") == "film.film_genre"
    assert remote.relation_type("no.such.relation") is None
    assert remote.neighbors({"m.0kf01"}, "bad relation>") == set()  # never sent


def test_an_unreachable_endpoint_is_an_infra_error():
    env = make_task("kg", endpoint="http://127.0.0.1:9/sparql", timeout=2.0)
    s = env.start(0).session
    with pytest.raises(InfraError, match="SPARQL endpoint"):
        env.interact(s, _say(("get_relations", {"variable": "m.0kf01"})))


# --- the whole loop ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_kg_task_through_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://smoke-kg-{uuid.uuid4().hex[:6]}", "smoke-kg", steps=1)
    raw["tasks"] = {"kg": {"options": {"max_turns": 2}}}
    raw["rollout"]["max_tokens"] = 2048  # AgentBench's prompt, tools and one-shot: ~1700
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics["env/kg/episodes"] == 4 and "env/kg/reward" in metrics
