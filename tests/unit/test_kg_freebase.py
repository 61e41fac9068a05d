"""kg refuses questions its local graph does not hold (AgentBench's Freebase questions
without an endpoint): one line and exit 2 from `agentrl-env check`, `agentrl eval` and
`agentrl-supervisor start`, instead of playing them to 0 with every episode unanswerable.

The data is written in AgentBench's published KnowledgeGraph format (the fields of
``data/knowledgegraph/dev.json``: question, qid, source, entities {name: Freebase id},
s_expression, actions, answer); its questions are made up here.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.environments import make_task, task_problems
from agentrl.environments.tasks.kg.items import ItemError
from agentrl.environments.tasks.kg.task import KGTask
from agentrl.ops import ConfigError, parse_config
from agentrl.ops.cli import agentrl as cli_agentrl
from agentrl.ops.cli import agentrl_env as cli_env
from agentrl.ops.cli.agentrl_supervisor import main as supervisor_main

AGENTBENCH_KG = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "knowledgegraph" / "dev.json"
)
BUILTIN = Path(__file__).resolve().parents[2] / "environments/tasks/kg/data/kg_builtin.json"

FREEBASE_ITEMS = [
    {
        "question": "which basketball team did the player of the 2004 draft join?",
        "qid": "made_up_grailqa_1",
        "source": "grailqa",
        "entities": {"2004 NBA draft": "m.02ryf4"},
        "s_expression": "(JOIN sports.sports_team.draft_picks m.02ryf4)",
        "actions": [
            "get_relations(m.02ryf4)",
            "get_neighbors(m.02ryf4,sports.sports_league_draft.picks)",
        ],
        "answer": [{"answer_type": "Entity", "answer_argument": "m.0jm7n", "entity_name": "Team"}],
    },
    {
        "question": "how many films did the director of that movie make?",
        "qid": "made_up_cwq_2",
        "source": "cwq",
        "entities": {"That Movie": "m.0bd1d4", "Its Director": "m.06x5s"},
        "s_expression": "(COUNT (JOIN film.director.film m.06x5s))",
        "actions": ["get_neighbors(m.06x5s,film.director.film)", "count(#0)"],
        "answer": [{"answer_type": "Value", "answer_argument": "7", "entity_name": "7"}],
    },
]
REFUSAL = (
    "2 of 2 items name entities that the built-in graph does not hold "
    "(first m.02ryf4, item made_up_grailqa_1): Freebase questions such as AgentBench's "
    "need endpoint=URL (a Freebase SPARQL endpoint)"
)


@pytest.fixture
def freebase(tmp_path) -> Path:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(FREEBASE_ITEMS, indent=4))
    return path


def test_freebase_data_without_an_endpoint_is_refused(freebase):
    with pytest.raises(ItemError) as refused:
        make_task("kg", data=str(freebase))
    assert str(refused.value) == f"kg: {freebase}: {REFUSAL}"
    # the same data given its endpoint builds (nothing is asked of the endpoint yet)
    env = make_task("kg", data=str(freebase), endpoint="http://127.0.0.1:9/sparql", split="all")
    assert env.num_instances == 2
    # levels without the data set do not read it
    assert make_task("kg", data=str(freebase), levels=[0]).num_instances == 1000


def test_one_item_the_graph_lacks_refuses_the_file(tmp_path):
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([*json.loads(BUILTIN.read_text()), FREEBASE_ITEMS[1]]))
    with pytest.raises(ItemError, match=r"1 of 15 items .* \(first m\.06x5s, item made_up_cwq_2\)"):
        make_task("kg", data=str(mixed))


def test_a_graph_that_holds_the_entities_plays_them(freebase, tmp_path):
    """The refusal is about the graph, not the format: a graph=PATH holding the questions'
    entities (as subject or object) plays them."""
    graph = tmp_path / "small.ttl"
    graph.write_text(
        "@prefix ns: <http://rdf.freebase.com/ns/> .\n"
        "ns:m.02ryf4 ns:sports.sports_league_draft.picks ns:m.0jm7n .\n"
        "ns:m.06x5s ns:film.director.film ns:m.0bd1d4 .\n"
    )
    env = make_task("kg", data=str(freebase), graph=str(graph), split="all")
    assert env.num_instances == 2
    graph.write_text(graph.read_text().replace("ns:m.02ryf4", "ns:m.0other"))
    with pytest.raises(ItemError) as refused:
        make_task("kg", data=str(freebase), graph=str(graph))
    assert f"1 of 2 items name entities that graph {graph} does not hold (first m.02ryf4," in (
        str(refused.value)
    )


@pytest.mark.skipif(not AGENTBENCH_KG.exists(), reason=f"no AgentBench sample at {AGENTBENCH_KG}")
def test_agentbench_dev_sample_is_refused_without_an_endpoint():
    with pytest.raises(ItemError, match=r"20 of 20 items .* \(first m\.09rl290, item 43005630"):
        make_task("kg", data=str(AGENTBENCH_KG))


def test_the_run_configs_check_at_start_refuses_it(freebase):
    assert KGTask.option_problems(data=str(freebase)) == [f"kg: {freebase}: {REFUSAL}"]
    assert task_problems("kg", {"data": str(freebase)}) == [f"kg: {freebase}: {REFUSAL}"]
    assert task_problems("kg", {"data": str(freebase), "endpoint": "http://h:1/sparql"}) == []
    assert task_problems("kg", {}) == []
    with pytest.raises(ConfigError) as refused:
        parse_config(
            {"model": "tiny", "run": "r", "tasks": {"kg": {"options": {"data": str(freebase)}}}}
        )
    assert refused.value.problems == [f"tasks.kg: kg: {freebase}: {REFUSAL}"]


# --- the three entry points: one line, exit 2 --------------------------------------------


def test_env_check_says_it_in_one_line_and_exits_2(freebase, capsys):
    assert cli_env.main(["check", "--task", "kg", "--data", str(freebase)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"agentrl-env: kg: {freebase}: {REFUSAL}\n"
    assert captured.out == ""


def test_eval_refuses_it_with_exit_2(freebase, capsys):
    argv = ["eval", "--checkpoint", "tiny", "--tasks", "kg", "--task-option", f"kg.data={freebase}"]
    assert cli_agentrl.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"agentrl eval: bad arguments:\n  - task kg: kg: {freebase}: {REFUSAL}\n"


def test_a_training_start_refuses_it_before_writing_anything(freebase, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": "tiny",
                "run": "kg-freebase",
                "broker": f"memory://kg-freebase-{uuid.uuid4().hex[:6]}",
                "output_dir": str(tmp_path / "runs"),
                "tasks": {"kg": {"options": {"data": str(freebase)}}},
            }
        )
    )
    assert supervisor_main(["start", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == f"  - tasks.kg: kg: {freebase}: {REFUSAL}"
    assert not (tmp_path / "runs").exists()
