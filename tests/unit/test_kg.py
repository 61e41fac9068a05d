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
from agentrl.environments._check import check
from agentrl.environments._kg import CHECK_AGENTS, KGTask, f1_score
from agentrl.environments._kg_backend import RDFBackend, SPARQLBackend, load_graph
from agentrl.environments._kg_data import PARAMS, ItemError, load_items, parse_action
from agentrl.environments._protocol import InfraError, SessionClosed, Status
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops import cli_env

AGENTBENCH_KG = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "knowledgegraph" / "dev.json"
)
BUILTIN = Path(__file__).resolve().parents[2] / "environments" / "data" / "kg_builtin.json"


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
    env = make_task("kg")
    assert env.num_instances == 14
    assert check("kg", env, "oracle").success_rate == 1.0
    # random: one or two random hops from a random entity; it can hit a one-hop question
    # by luck (item 0: 1 of 4 relations, half the time one hop), so the bound is near 0.
    rates = [check("kg", env, "random", seed=seed).success_rate for seed in range(3)]
    assert max(rates) <= 1 / 14, rates


def test_built_in_questions_cover_every_tool():
    used = {a.name for item in load_items() for a in item.actions}
    assert used == set(PARAMS)
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in make_task("kg").tools}
    assert list(tools) == [*PARAMS, "final_answer"]
    assert tools["get_neighbors"]["required"] == ["variable", "relation"]
    assert tools["final_answer"]["required"] == ["variable"]


def test_cli_check(capsys):
    assert cli_env.main(["check", "--task", "kg", "--agent", "oracle"]) == 0
    assert "task kg, agent oracle: 14/14 succeeded (1.000)" in capsys.readouterr().out


def test_the_oracle_reports_a_wrong_gold_answer(tmp_path):
    items = json.loads(BUILTIN.read_text())
    items[0]["answer"] = [{"answer_argument": "m.0kp02", "entity_name": "Tomas Veyl"}]
    data = tmp_path / "wrong.json"
    data.write_text(json.dumps(items))
    report = check("kg", make_task("kg", data=str(data)), "oracle")
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
    env = make_task("kg", data=str(AGENTBENCH_KG))  # no Freebase here: only the script
    calls = list(CHECK_AGENTS["oracle"](env, 0, None))
    assert json.loads(calls[3].arguments) == {
        "variable": "#0",
        "relation": "basketball.basketball_player.position_s",
    }
    assert (calls[-1].name, json.loads(calls[-1].arguments)) == ("final_answer", {"variable": "#3"})


# --- #N semantics -----------------------------------------------------------------------


def test_variables_are_numbered_per_session_and_only_by_calls_that_make_one():
    env = make_task("kg")
    index = _index(env, "kg_builtin_01")  # films by Tomas Veyl starring Jon Halvard
    start, other = env.start(index), env.start(index)
    s = start.session
    assert "Tomas Veyl (m.0kp02)" in start.messages[-1].content
    relations = _do(env, s, "get_relations", variable="m.0kp02")
    assert "film.director.film" in relations and "type.object.type" not in relations
    shown = _do(env, s, "get_neighbors", variable="m.0kp02", relation="film.director.film")
    assert shown.startswith("Variable #0, which are instances of film.film: 3 entities:")
    assert "Northern Static (m.0kf03)" in shown
    assert _do(env, s, "get_attributes", variable="#0").startswith("[film.film.estimated_budget")
    # the name of an entity of the question works as well as its id
    shown = _do(env, s, "get_neighbors", variable="jon halvard", relation="film.actor.film")
    assert shown.startswith("Variable #1, ")  # the two listing calls made none
    shown = _do(env, s, "get_neighbors", variable="#5", relation="film.film.genre")
    assert shown.startswith("Error:") and "#5 is not defined (defined: #0 to #1)" in shown
    shown = _do(env, s, "intersection", variable1="#0", variable2="#1")
    assert shown.startswith("Variable #2, which are instances of film.film: 2 entities")
    assert _do(env, s, "count", variable="#2") == "Variable #3, which is a number: 2"
    # the other session of the same item has its own numbering
    shown = _do(env, other.session, "get_neighbors", variable="m.0kp12", relation="film.actor.film")
    assert shown.startswith("Variable #0, ")
    assert _do(env, other.session, "count", variable="#1").startswith("Error:")  # only #0 there
    step = env.interact(s, _say(("final_answer", {"variable": "#2"})))
    assert (step.status, step.reward, step.finish) == (Status.COMPLETED, 1.0, True)
    assert step.metrics["env/errors"] == 1.0 and step.metrics["env/variables"] == 4.0
    assert step.metrics["env/actions"] == 7.0 and step.metrics["env/success"] == 1.0
    with pytest.raises(SessionClosed):
        env.interact(s, _say(("final_answer", {"variable": "#2"})))


@pytest.mark.parametrize(
    ("calls", "error"),
    [
        (
            [("get_neighbors", {"variable": "m.0kf01", "relation": "film.actor.film"})],
            "is not a relation of m.0kf01",
        ),
        (
            [("count", {"variable": "m.0kf01"}), ("get_relations", {"variable": "#0"})],
            "is a number",
        ),
        ([("count", {"variable": "m.0kf01"}), ("count", {"variable": "#0"})], "is a number"),
        ([("argmax", {"variable": "m.0kf01", "attribute": "film.film.genre"})], "not an attribute"),
        ([("get_relations", {"variable": "Nobody Known"})], "unknown entity 'Nobody Known'"),
        ([("intersection", {"variable1": "m.0kf01", "variable2": "m.0kf02"})], "is not a variable"),
        (
            [
                ("get_neighbors", {"variable": "m.0kf01", "relation": "film.film.starring"}),
                ("get_neighbors", {"variable": "m.0kf01", "relation": "film.film.directed_by"}),
                ("intersection", {"variable1": "#0", "variable2": "#1"}),
            ],
            "same type (film.actor vs film.director)",
        ),
    ],
)
def test_failed_actions_are_observations_that_count_as_errors(calls, error):
    env = make_task("kg")
    s = env.start(0).session
    for name, args in calls:
        shown = _do(env, s, name, **args)
    assert shown.startswith("Error:") and error in shown, shown
    step = env.interact(s, _say(("give_up", {})))  # an unknown tool ends it, with metrics
    assert step.status == Status.AGENT_INVALID_ACTION and step.metrics["env/errors"] == 1.0


def test_argmax_and_argmin_compare_numbers_and_dates():
    env = make_task("kg")
    s = env.start(0).session  # Silver Harbor: Mara Ellin 1980, Bram Tolle 1965, Otto Renn 1972
    _do(env, s, "get_neighbors", variable="m.0kf01", relation="film.film.starring")
    oldest = _do(env, s, "argmin", variable="#0", attribute="people.person.date_of_birth")
    assert (
        oldest == "Variable #1, which are instances of film.actor: 1 entity: Bram Tolle (m.0kp16)"
    )
    tallest = _do(env, s, "argmax", variable="#0", attribute="people.person.height_meters")
    assert tallest.endswith("Bram Tolle (m.0kp16)")  # 1.92 m against 1.68 and 1.79
    shortest = _do(env, s, "argmin", variable="#0", attribute="people.person.height_meters")
    assert shortest.endswith("Mara Ellin (m.0kp11)")


# --- endings ----------------------------------------------------------------------------


def test_final_answer_in_text_partial_f1_and_an_undefined_answer():
    env = make_task("kg")
    index = _index(env, "kg_builtin_06")  # languages of Ambrin's country: 2 answers
    s = env.start(index).session
    step = env.interact(s, ChatMessage("assistant", "Thought: done.\nFinal Answer: #0"))
    assert step.status == Status.RUNNING and step.messages[0].role == "user"
    assert "invalid final answer '#0'" in step.messages[0].content
    _do(env, s, "get_neighbors", variable="m.0kt02", relation="location.location.containedby")
    _do(env, s, "get_relations", variable="#0")
    _do(env, s, "get_neighbors", variable="#0", relation="location.country.official_language")
    # answering the country instead of its languages: F1 0
    step = env.interact(s, ChatMessage("assistant", "Final Answer: #0"))
    assert (step.status, step.reward, step.metrics["env/f1"]) == (Status.COMPLETED, 0.0, 0.0)
    s = env.start(index).session
    _do(env, s, "get_neighbors", variable="m.0kc01", relation="location.country.official_language")
    _do(env, s, "get_neighbors", variable="m.0kc04", relation="location.country.official_language")
    # #1 = Queloria's {Valdorian, Estic} against gold {Valdorian, Trade Common}:
    # P = 1/2, R = 1/2, F1 = 1/2; not an exact match, so no success
    step = env.interact(s, ChatMessage("assistant", "Final Answer: #1"))
    assert step.status == Status.COMPLETED and step.reward == pytest.approx(0.5)
    assert step.metrics["env/success"] == 0.0 and step.metrics["env/answered"] == 1.0


def test_f1_score():
    gold = frozenset({"a", "b"})
    assert f1_score(frozenset({"a", "b"}), gold) == 1.0
    assert f1_score(frozenset({"a"}), gold) == pytest.approx(2 / 3)  # P 1, R 1/2
    assert f1_score(frozenset({"a", "c", "d"}), gold) == pytest.approx(0.4)  # P 1/3, R 1/2
    assert f1_score(frozenset(), gold) == 0.0 and f1_score(frozenset({"c"}), gold) == 0.0


@pytest.mark.parametrize(
    "message",
    [
        ChatMessage("assistant", "The answer is Ilse Marrow."),
        _say(("lookup", {"variable": "m.0kf01"})),
        _say(("get_neighbors", {"variable": "m.0kf01"})),
        _say(("get_relations", {"variable": ""})),
        _say(("final_answer", {"variable": ["#0"]})),
        _say(("final_answer", {})),
    ],
)
def test_model_failures_end_with_agent_invalid_action(message):
    env = make_task("kg")
    step = env.interact(env.start(0).session, message)
    assert (step.status, step.reward, step.finish) == (Status.AGENT_INVALID_ACTION, 0.0, True)
    assert step.metrics["env/f1"] == 0.0


def test_turn_limit_and_cancel():
    env = make_task("kg", max_turns=2)
    s = env.start(0).session
    _do(env, s, "get_relations", variable="m.0kf01")
    step = env.interact(s, _say(("get_relations", {"variable": "m.0kf01"})))
    assert (step.status, step.finish, step.reward) == (Status.TASK_LIMIT_REACHED, True, 0.0)
    assert step.messages[0].content.startswith("[film.film.country")
    other = env.start(0).session
    env.cancel(other)
    env.cancel(other)  # idempotent
    with pytest.raises(SessionClosed):
        env.interact(other, _say(("get_relations", {"variable": "m.0kf01"})))


def test_sessions_run_from_several_threads():
    env = make_task("kg")
    results: dict[int, float] = {}

    def play(index: int) -> None:
        s = env.start(index).session
        for call in CHECK_AGENTS["oracle"](env, index, None):
            step = env.interact(s, ChatMessage("assistant", "", [call]))
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


@pytest.fixture(scope="module")
def endpoint():
    graph = load_graph()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            query = urllib.parse.parse_qs(body)["query"][0]
            try:
                payload = graph.query(query).serialize(format="json")
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


def test_the_oracle_succeeds_through_a_sparql_endpoint(endpoint):
    env = make_task("kg", endpoint=endpoint)
    assert isinstance(env.backend, SPARQLBackend)
    assert check("kg", env, "oracle").success_rate == 1.0


def test_cli_check_against_an_endpoint(endpoint, capsys):
    # how the AgentBench sample runs, given a Freebase endpoint: --data dev.json --option ...
    argv = ["check", "--task", "kg", "--option", f"endpoint={endpoint}", "--agent", "random"]
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
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics["env/kg/episodes"] == 4 and "env/kg/reward" in metrics


@pytest.mark.parametrize(
    "message",
    [
        ChatMessage("assistant", "Final Answer: #" + "9" * 5000),
        _say(("final_answer", {"variable": "²"})),  # str.isdigit, but not for int()
        _say(("final_answer", {"variable": "#" + "9" * 5000})),
        _say(("count", {"variable": "#" + "9" * 5000})),
    ],
    ids=["text-5000-digits", "superscript-two", "tool-5000-digits", "count-5000-digits"],
)
def test_unreadable_variable_numbers_are_error_observations(message):
    env = make_task("kg")
    step = env.interact(env.start(0).session, message)
    assert step.status == Status.RUNNING
    assert step.messages[-1].content.startswith("Error:")
