"""The os task (AgentBench os_interaction format) on the bwrap sandbox, and its check agents.

Sessions need bubblewrap and root (skipped without them, with the reason); the
data-format tests run anywhere. The container backend and the AgentBench sample
played end to end are in tests/integration/test_os_containers.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments._protocol import SessionClosed, Status
from agentrl.environments.tasks.os.items import ItemError, load_items
from agentrl.environments.tasks.os.sandbox import docker_available
from agentrl.environments.tasks.os.tools import TRUNCATED, observation
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops.cli import agentrl_env as cli_env

AGENTBENCH_OS = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "os_interaction" / "data"
) / "dev.json"
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="os sessions here use the bwrap sandbox: needs bubblewrap (apt-get install "
    "bubblewrap) and root",
)


def _say(*calls: tuple[str, dict | str]) -> ChatMessage:
    return ChatMessage(
        "assistant",
        "",
        [
            ToolCall(f"c{i}", name, a if isinstance(a, str) else json.dumps(a))
            for i, (name, a) in enumerate(calls)
        ],
    )


def _data(tmp_path: Path, *items: dict) -> str:
    path = tmp_path / "items.json"
    path.write_text(json.dumps(list(items)))
    return str(path)


@needs_bwrap
def test_built_in_set_oracle_succeeds_everywhere_and_random_nowhere():
    env = make_task("os", split="all", sandbox="bwrap")
    assert env.num_instances >= 12
    report = check("os", env, "oracle")
    assert report.success_rate == 1.0, report.format()
    report = check("os", env, "random")  # `ls`, then answers "0" or finishes
    assert report.successes == 0, report.format()


@pytest.mark.skipif(not AGENTBENCH_OS.exists(), reason=f"no AgentBench sample at {AGENTBENCH_OS}")
def test_the_agentbench_sample_loads():
    items = load_items(AGENTBENCH_OS)
    assert len(items) == 26
    assert sum(i.match is not None for i in items) == 5  # the others are judged by check
    assert sum(i.start is not None for i in items) == 4
    calc = items[3]  # check/0.sh from scripts/dev, the example a {"file"} too
    assert calc.check[0] is not None and "calc" in calc.check[0].code
    assert calc.example is not None and not calc.wants_answer
    hidden = items[6]  # check: [null, integer-match.py]: the example's output is expected
    assert hidden.check[0] is None and hidden.check[1].language == "python" and hidden.wants_answer
    assert items[10].init == ()  # its "create" is a list: AgentBench reads nothing from it
    assert items[24].example is None  # its example sits outside "evaluation": ignored
    assert items[21].init[0].code.startswith("echo 123")  # "init" as a bare string


@needs_bwrap
def test_a_session_step_by_step():
    env = make_task(
        "os", split="all", sandbox="bwrap", shell="fresh", timeout=1.0, timeout_ends=False
    )
    index = next(i for i in range(env.num_instances) if "/root/data.bin" in env.item(i).description)
    start = env.start(index)
    assert "data.bin" in start.messages[-1].content and start.messages[0].role == "system"
    step = env.interact(start.session, _say(("bash_action", {"script": "cd /var/tmp; ls /root"})))
    assert step.status == Status.RUNNING
    assert step.messages[0].content == "The output of the OS:\n\ndata.bin\nother.bin\n"
    step = env.interact(start.session, _say(("bash_action", {"script": "pwd"})))
    assert step.messages[0].content.endswith("/var/tmp\n")  # the directory carried over
    step = env.interact(start.session, _say(("bash_action", {"script": "seq 1 1000"})))
    numbers = "".join(f"{n}\n" for n in range(1, 1001))
    assert step.messages[0].content == "The output of the OS:\n\n" + numbers[:780] + TRUNCATED
    step = env.interact(start.session, _say(("bash_action", {"script": "true"})))
    assert step.messages[0].content == "The output of the OS is empty."
    step = env.interact(start.session, _say(("bash_action", {"script": "echo a; sleep 30"})))
    assert "killed" in step.messages[0].content and "1 s time limit" in step.messages[0].content
    step = env.interact(start.session, _say(("answer_action", {"answer": " 12345\n"})))
    assert (step.status, step.reward, step.finish) == (Status.COMPLETED, 1.0, True)
    assert step.metrics["env/commands"] == 5.0 and step.metrics["env/timeouts"] == 1.0
    with pytest.raises(SessionClosed):
        env.interact(start.session, _say(("answer_action", {"answer": "12345"})))


def test_observation_truncates_like_agentbench():
    assert observation("x" * 800, 800) == "The output of the OS:\n\n" + "x" * 800
    assert observation("x" * 801, 800) == "The output of the OS:\n\n" + "x" * 780 + TRUNCATED
    assert observation("", 800, killed_after=10.0).startswith("The output of the OS is empty.\n")


@needs_bwrap
def test_bad_calls_get_agentbench_replies_and_the_episode_goes_on():
    """Replies and limits as AgentBench's OS task (THUDM/AgentBench,
    src/server/tasks/os_interaction/task.py): no tool call -> user message "No executable
    tool calls found. Please call a tool instead" (lines 558-566); only the first call of a
    message runs (line 569); unparsable arguments -> tool message ``str(e)`` of the JSON
    error (lines 575-592); the first argument is read whatever its name (line 580 and
    ``_extract_function``, lines 346-358); an unknown function -> tool message "Invalid
    function call. Please call a tool instead" (lines 601-622); 8 rounds then
    TASK_LIMIT_REACHED with reward 0 (configs/tasks/os.yaml line 5 ``round_limit: 8``;
    task.py lines 419 and 441-452)."""
    env = make_task("os", split="all", sandbox="bwrap")
    session = env.start(0).session
    step = env.interact(session, ChatMessage("assistant", "I think it is 3."))
    assert (step.status, step.finish) == (Status.RUNNING, False)
    assert [(m.role, m.content) for m in step.messages] == [
        ("user", "No executable tool calls found. Please call a tool instead")
    ]
    step = env.interact(session, _say(("bash_action", "{oops")))
    assert step.messages[0].role == "tool"
    assert step.messages[0].content.startswith("Expecting property name enclosed in double")
    step = env.interact(session, _say(("rm_everything", {}), ("bash_action", {"script": "ls"})))
    assert [(m.role, m.content) for m in step.messages] == [
        ("tool", "Invalid function call. Please call a tool instead")
    ]
    step = env.interact(session, _say(("bash_action", {"command": "echo hi"})))
    assert step.messages[0].content == "The output of the OS:\n\n\rhi\r\n"  # a terminal's
    for bad in ("echo a\x00b", "echo \ud800", "#" * 200_000):  # not passable as an argument
        step = env.interact(session, _say(("bash_action", {"script": bad})))
        assert step.messages[0].content == "bash_action needs its script as one text argument"
    step = env.interact(session, _say(("answer_action", {"answer": ["3"]})))  # the 8th
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.metrics["env/bad_calls"] == 7.0 and step.metrics["env/turns"] == 8.0


@needs_bwrap
def test_turn_limit_reuse_and_cancel():
    env = make_task("os", split="all", sandbox="bwrap", max_turns=2)
    start = env.start(0)
    env.interact(start.session, _say(("bash_action", {"script": "ls"})))
    step = env.interact(start.session, _say(("bash_action", {"script": "ls"})))
    assert (step.status, step.finish, step.reward) == (Status.TASK_LIMIT_REACHED, True, 0.0)
    with pytest.raises(SessionClosed):
        env.interact(start.session, _say(("finish_action", {})))
    other = env.start(0)
    env.cancel(other.session)
    env.cancel(other.session)  # idempotent
    with pytest.raises(SessionClosed):
        env.interact(other.session, _say(("bash_action", {"script": "ls"})))


@needs_bwrap
def test_judging_follows_agentbench(tmp_path):
    chain = {  # each check script gets the answer, then the outputs before it
        "description": "chain",
        "evaluation": {
            "check": [
                {"code": 'echo "got:$1"'},
                {
                    "language": "python",
                    "code": "import sys; sys.exit(sys.argv[2] != 'got:' + sys.argv[1] + '\\n')",
                },
            ]
        },
    }
    regex = {"description": "regex", "evaluation": {"match": {"regex": "^v[0-9]+$"}}}
    exact = {"description": "exact", "evaluation": {"match": {"answer": " x ", "strip": False}}}
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, chain, regex, exact))

    def ends(index: int, call: tuple[str, dict]) -> float:
        return env.interact(env.start(index).session, _say(call)).reward

    assert ends(0, ("answer_action", {"answer": "42"})) == 1.0
    assert ends(0, ("finish_action", {})) == 1.0  # the answer is then "None", as in AgentBench
    assert ends(1, ("answer_action", {"answer": "v12"})) == 1.0
    assert ends(1, ("answer_action", {"answer": "v1.2"})) == 0.0
    assert ends(1, ("finish_action", {})) == 0.0  # no answer matches nothing
    assert ends(2, ("answer_action", {"answer": " x "})) == 1.0
    assert ends(2, ("answer_action", {"answer": "x"})) == 0.0  # strip: false


@needs_bwrap
def test_an_init_over_its_time_limit_is_an_item_error_and_leaves_nothing(tmp_path):
    slow = {"description": "slow", "create": {"init": "sleep 30"}, "evaluation": {"match": "x"}}
    env = make_task(
        "os", split="all", sandbox="bwrap", data=_data(tmp_path, slow), init_timeout=0.5
    )
    before = set(Path(tempfile.gettempdir()).glob("agentrl-os-0-*"))
    with pytest.raises(ItemError, match=r"item 0: init script 0 ran over 0\.5 s"):
        env.start(0)
    assert set(Path(tempfile.gettempdir()).glob("agentrl-os-0-*")) == before


def test_bad_data_is_reported_with_the_item(tmp_path):
    cases = [
        ({"description": "x"}, "item 0: no 'evaluation'"),
        ({"description": "x", "evaluation": {}}, "needs 'match' or 'check'"),
        ({"description": "x", "evaluation": {"check": [None]}}, "null entry but there is no"),
        ({"description": "x", "evaluation": {"check": {"file": "nope.sh"}}}, "cannot read"),
        ({"description": "x", "evaluation": {"check": {"language": "c", "code": ""}}}, "'c'"),
        ({"evaluation": {"match": "1"}}, "string 'description'"),
    ]
    for raw, message in cases:
        with pytest.raises(ItemError, match=message):
            load_items(_data(tmp_path, raw))
    with pytest.raises(ItemError, match="cannot read"):
        load_items(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="sandbox must be one of"):
        make_task("os", sandbox="vm")


@needs_bwrap
def test_cli_check_uses_bwrap_when_no_engine_answers(capsys, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix:///nonexistent/{uuid.uuid4().hex}.sock")
    docker_available.cache_clear()
    try:
        argv = ["check", "--task", "os", "--agent", "oracle", "--option", "split=all"]
        assert cli_env.main(argv) == 0
    finally:
        docker_available.cache_clear()
    assert "task os, agent oracle: 13/13 succeeded (1.000)" in capsys.readouterr().out


@needs_bwrap
def test_the_os_task_through_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://smoke-os-{uuid.uuid4().hex[:6]}", "smoke-os", steps=1)
    raw["tasks"] = {"os": {"options": {"max_turns": 2, "sandbox": "bwrap"}}}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    (metrics,) = [
        json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["env/os/episodes"] == 4 and "env/os/reward" in metrics


def test_a_container_that_fails_to_start_is_removed(monkeypatch):
    """A fake engine whose containers are created but fail to start (docker-py's run is
    create, then start): the created container is removed before SandboxError."""
    import docker.errors

    from agentrl.environments.tasks.os import docker_sandbox as _docker_sandbox
    from agentrl.environments.tasks.os.sandbox import Limits, SandboxError

    made = []

    class Container:
        id = "c0"
        removed = False

        def start(self):
            raise docker.errors.APIError("OCI runtime create failed")

        def remove(self, **kwargs):
            self.removed = True

    class Containers:
        def get(self, container_id):
            return made[-1]

    class Api:  # the low-level API DockerSandbox creates containers with
        base_url = "fake://engine"

        def create_host_config(self, **kwargs):
            return dict(kwargs)

        def create_container(self, image, **kwargs):
            made.append(Container())
            return {"Id": made[-1].id}

    class Client:
        containers = Containers()
        api = Api()

        def version(self):
            return {"Components": [{"Name": "Podman Engine"}]}

        def info(self):
            return {"Driver": "overlay", "DriverStatus": [["Backing Filesystem", "xfs"]]}

        def close(self):
            pass

    monkeypatch.setattr(_docker_sandbox.docker, "from_env", lambda **kwargs: Client())
    with pytest.raises(SandboxError, match="cannot start"):
        _docker_sandbox.DockerSandbox(limits=Limits(), label="fails")
    assert [c.removed for c in made] == [True]


@needs_bwrap
def test_a_check_output_that_cannot_be_an_argument_fails_the_judging(tmp_path):
    # the example's output (made from the model's file) holds a NUL: the next script
    # cannot get it as an argument, so the answer is judged wrong instead of raising
    item = {
        "description": "nul",
        "evaluation": {"check": [None, {"code": "exit 0"}], "example": {"code": "cat /root/f"}},
    }
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item))
    start = env.start(0)
    env.interact(start.session, _say(("bash_action", {"script": "printf 'a\\0b' > /root/f"})))
    step = env.interact(start.session, _say(("answer_action", {"answer": "a"})))
    assert (step.status, step.reward) == (Status.COMPLETED, 0.0)


def test_train_and_test_split_the_built_in_set_by_content():
    from agentrl.environments.tasks.os.items import content_key
    from agentrl.environments.tasks.toolkit.split import check_disjoint

    envs = {s: make_task("os", split=s, sandbox="bwrap") for s in ("train", "test", "all")}
    keys = {s: [content_key(e.item(i)) for i in range(e.num_instances)] for s, e in envs.items()}
    assert len(keys["train"]) + len(keys["test"]) == len(keys["all"]) == 13
    assert keys["train"] and keys["test"]
    check_disjoint(keys["train"], keys["test"], "os")
    with pytest.raises(ValueError, match="split"):
        make_task("os", split="dev")
