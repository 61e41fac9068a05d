"""The os task against AgentBench's os_interaction task: prompt, tools, start, finish, init.

Expected values come from AgentBench (git dir /work/.mirror/THUDM+AgentBench/repo,
``src/server/tasks/os_interaction/task.py`` and ``configs/tasks/os.yaml``); the
prompt test reads them from there when the mirror is present.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from agentrl.actors._episode import sample_error_trajectory
from agentrl.actors._groups import is_untrained
from agentrl.environments import SampleError, make_task
from agentrl.environments._check import check
from agentrl.environments._protocol import SessionClosed, Status
from agentrl.environments.tasks.os.items import ItemError, content_key, load_items, scripts_root
from agentrl.environments.tasks.os.tools import QUESTION, SYSTEM_PROMPT, TOOLS
from agentrl.messages import ChatMessage, EpisodeRequest, ToolCall

MIRROR = Path("/work/.mirror/THUDM+AgentBench/repo")
SHARED_OS = Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "os_interaction"
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="os sessions here use the bwrap sandbox: needs bubblewrap and root",
)


def _agentbench(path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(MIRROR), "show", f"HEAD:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _say(name: str, arguments: dict) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c0", name, json.dumps(arguments))])


def _data(tmp_path: Path, *items: dict) -> str:
    path = tmp_path / "items.json"
    path.write_text(json.dumps(list(items)))
    return str(path)


@pytest.mark.skipif(not MIRROR.exists(), reason=f"no AgentBench mirror at {MIRROR}")
def test_prompt_and_tools_are_agentbench_s():
    """task.py lines 516-532 (system message, question), os.yaml lines 6-47 (tools)."""
    task = _agentbench("src/server/tasks/os_interaction/task.py")
    system = re.search(r'system_message = """(.*?)"""', task, re.DOTALL).group(1)
    assert system == SYSTEM_PROMPT
    question = re.search(r"content=f'(Now, I will start a new problem.*?)'\n", task).group(1)
    assert question.encode().decode("unicode_escape") == QUESTION
    yaml = _agentbench("configs/tasks/os.yaml")
    names = re.findall(r'name: "(\w+_action)"', yaml)
    assert [t["function"]["name"] for t in TOOLS] == names  # bash, finish, answer
    for tool in TOOLS:
        assert f'description: "{tool["function"]["description"]}"' in yaml
        for arg, spec in tool["function"]["parameters"]["properties"].items():
            assert f'{arg}:\n                type: "string"' in yaml
            assert f'description: "{spec["description"]}"' in yaml
    finish = next(t for t in TOOLS if t["function"]["name"] == "finish_action")
    assert finish["function"]["parameters"]["required"] == ["thought"]


@needs_bwrap
def test_the_question_opens_the_session(tmp_path):
    item = {"description": "What is 1?", "evaluation": {"match": "1"}}
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item))
    start = env.start(0)
    env.cancel(start.session)
    # task.py line 532: the description after AgentBench's opening words
    assert start.messages[1].content == (
        "Now, I will start a new problem in a new OS. My problem is:\n\nWhat is 1?"
    )


@needs_bwrap
@pytest.mark.parametrize("shell", ["terminal", "fresh"])
def test_the_start_script_runs_in_the_agent_s_shell(tmp_path, shell):
    """task.py line 496: ``start`` goes through ``container.execute``, the agent's shell.
    Through a terminal (AgentBench's), lines end ``\\r\\n`` and the output begins with the
    ``\\r`` that ends bracketed paste mode (``\\x1b[?2004l\\r``, its sequence cleaned)."""
    item = {
        "description": "where",
        "start": "mkdir -p /home/u && cd /home/u && var=3.14 && export E=x && f() { echo f$1; }",
        "evaluation": {"match": "x"},
    }
    env = make_task("os", split="all", sandbox="bwrap", shell=shell, data=_data(tmp_path, item))
    start = env.start(0)

    def shown(*lines: str) -> str:
        if shell == "fresh":
            return "The output of the OS:\n\n" + "".join(f"{line}\n" for line in lines)
        return "The output of the OS:\n\n\r" + "".join(f"{line}\r\n" for line in lines)

    step = env.interact(start.session, _say("bash_action", {"script": "pwd; echo $var $E; f 1"}))
    assert step.messages[0].content == shown("/home/u", "3.14 x", "f1")
    step = env.interact(start.session, _say("bash_action", {"script": "cd /tmp; v2=7"}))
    step = env.interact(start.session, _say("bash_action", {"script": "pwd; echo $var $v2"}))
    assert step.messages[0].content == shown("/tmp", "3.14 7")
    env.cancel(start.session)


@needs_bwrap
def test_the_terminal_is_one_login_shell_for_the_whole_session(tmp_path):
    """agentrl-worker's ``create_shell`` execs ``/bin/bash --login`` with a tty once per
    container and ``execute_shell`` types every command into it: a ``su - jack`` in
    ``start`` leaves jack's login shell answering, shell options carry over, ``ls`` writes
    columns; after the login shell's ``exit`` a command fails (the stream is closed) while
    an answer is still judged."""
    item = {
        "description": "who",
        "start": "useradd -m -s /bin/bash jack && cd /home/jack && su - jack",
        "evaluation": {"match": "jack"},
    }
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item))
    start = env.start(0)
    step = env.interact(start.session, _say("bash_action", {"script": "whoami; echo ~"}))
    assert step.messages[0].content == "The output of the OS:\n\n\rjack\r\n/home/jack\r\n"
    env.interact(start.session, _say("bash_action", {"script": "set -u; touch a b c"}))
    step = env.interact(start.session, _say("bash_action", {"script": "ls; echo $nothing"}))
    shown = step.messages[0].content
    assert "nothing: unbound variable" in shown and "\ra  b  c\r\n" in shown, shown
    env.interact(start.session, _say("bash_action", {"script": "exit"}))  # jack's: root's now
    step = env.interact(start.session, _say("bash_action", {"script": "exit"}))
    assert step.messages[0].content == "The output of the OS:\n\n\rlogout\r\n"
    assert not step.finish
    step = env.interact(start.session, _say("bash_action", {"script": "whoami"}))
    assert (step.status, step.reward, step.finish) == (Status.AGENT_INVALID_ACTION, 0.0, True)
    start = env.start(0)
    for script in ("exit", "exit"):
        env.interact(start.session, _say("bash_action", {"script": script}))
    step = env.interact(start.session, _say("answer_action", {"answer": "jack"}))
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)


@needs_bwrap
def test_finish_passes_its_thought_to_the_check(tmp_path):
    """task.py lines 351-353: finish's first argument is the answer; 719: ``str(answer)``."""
    item = {"description": "d", "evaluation": {"check": [{"code": 'echo "$1" > /tmp/got'}]}}
    said = {"description": "s", "evaluation": {"check": [{"code": '[ "$1" = "all done" ]'}]}}
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item, said))

    def ends(index: int, arguments: dict) -> float:
        return env.interact(env.start(index).session, _say("finish_action", arguments)).reward

    assert ends(1, {"thought": "all done"}) == 1.0
    assert ends(1, {"thought": "something else"}) == 0.0
    assert ends(1, {"reason": "all done"}) == 1.0  # the first argument, whatever its name
    assert ends(1, {}) == 0.0  # the answer is "None"
    start = env.start(0)
    step = env.interact(start.session, _say("finish_action", {"thought": 42}))
    assert step.reward == 1.0  # a check that exits 0 passes whatever it got


@needs_bwrap
def test_a_check_script_gets_the_stdout_of_those_before_it(tmp_path):
    """task.py lines 722-733: ``execute_independent`` returns (exit code, stdout, stderr)
    and ``params.append(stdout.decode())``: stderr is never passed on."""
    item = {
        "description": "say 7",
        "evaluation": {
            "check": [
                None,
                {"code": "echo noise >&2; [ \"$2\" = $'7\\nx\\n' ] && echo checked"},
                {"language": "python", "code": "import sys; sys.exit(sys.argv[3] != 'checked\\n')"},
            ],
            "example": "echo 7; echo warning >&2; echo x",
        },
    }
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item))
    step = env.interact(env.start(0).session, _say("answer_action", {"answer": "7"}))
    assert step.reward == 1.0


@needs_bwrap
def test_the_oracle_answers_an_item_whose_check_reads_the_answer(tmp_path):
    """AgentBench's format lets a check read the answer itself (``argv[1]``) with no
    null entry; the oracle answers those with what the example prints on stdout."""
    moved = {
        "description": "Move /root/a/f here (/tmp) and tell me where it was.",
        "create": {"init": "mkdir /root/a && echo x > /root/a/f"},
        "start": "cd /tmp",
        "evaluation": {
            "check": [
                {"language": "python", "code": "import sys\nassert sys.argv[1] == '/root/a/f'"},
                {"code": "[ -f /tmp/f ] && [ ! -e /root/a/f ]"},
            ],
            "example": "mv /root/a/f . && echo moved >&2 && echo /root/a/f",
        },
    }
    done = {"description": "Make /root/d.", "evaluation": {"check": ["[ -d /root/d ]"]}}
    done["evaluation"]["example"] = "mkdir /root/d"
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, moved, done))
    assert env.item(0).reads_answer and not env.item(0).wants_answer
    assert not env.item(1).reads_answer
    assert check("os", env, "oracle").successes == 2
    assert check("os", env, "random").successes == 0  # `ls`, then finish: "None", no /root/d


@needs_bwrap
def test_a_command_over_the_time_limit_ends_the_episode(tmp_path):
    """AgentBench's ``execute_shell(..., timeout=30)`` (agentrl-worker's docker.py) raises
    ``TimeoutError``; ``start_sample``'s bare ``except`` ends the sample, result False."""
    item = {"description": "d", "evaluation": {"match": "x"}}
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item), timeout=1)
    assert make_task("os", split="all", data=_data(tmp_path, item))._timeout == 30.0
    start = env.start(0)
    step = env.interact(start.session, _say("bash_action", {"script": "echo a; sleep 20"}))
    assert (step.status, step.reward, step.finish, step.messages) == (
        Status.TASK_LIMIT_REACHED, 0.0, True, []
    )  # fmt: skip
    assert step.metrics["env/timeouts"] == 1.0
    with pytest.raises(SessionClosed):
        env.interact(start.session, _say("answer_action", {"answer": "x"}))
    slow = {**item, "start": "sleep 20"}  # AgentBench: the start raises, status unknown
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, slow), timeout=1)
    with pytest.raises(ItemError, match="start ran over 1 s"):
        env.start(0)


@needs_bwrap
def test_a_failing_init_script_is_a_sample_error_and_leaves_nothing(tmp_path):
    """task.py lines 484-490: an init script that exits non-zero ends the sample, status unknown."""
    bad = {
        "description": "bad",
        "create": {"init": "echo oops; exit 3"},
        "evaluation": {"match": "x"},
    }
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, bad))
    before = set(Path(tempfile.gettempdir()).glob("agentrl-os-0-*"))
    with pytest.raises(ItemError, match=r"item 0: init script 0 failed \(exit 3\): oops") as info:
        env.start(0)
    assert isinstance(info.value, SampleError)
    assert set(Path(tempfile.gettempdir()).glob("agentrl-os-0-*")) == before
    report = check("os", env, "oracle")  # the check counts it as the task's error
    assert report.successes == 0


def test_a_sample_error_episode_is_task_error_and_not_trained():
    req = EpisodeRequest(
        episode_id="e", group_id="g", task="os", index=3, sample_idx=0, group_size=4,
        issued_version=0,
    )  # fmt: skip
    traj = sample_error_trajectory(req, -0.2)
    assert traj.status == "task_error" and traj.token_ids == [] and traj.num_turns == 0
    assert is_untrained(traj) and traj.metrics == {"sample_error": 1.0}


@needs_bwrap
def test_init_scripts_may_write_usr_under_bwrap(tmp_path):
    """Dev item 25's init writes /usr/stock.log, as AgentBench's containers let it."""
    item = {
        "description": "how many lines",
        "create": {"init": "printf 'a\\nb\\n' > /usr/stock.log"},
        "evaluation": {"match": "2"},
    }
    env = make_task("os", split="all", sandbox="bwrap", data=_data(tmp_path, item))
    start = env.start(0)
    step = env.interact(start.session, _say("bash_action", {"script": "wc -l < /usr/stock.log"}))
    assert step.messages[0].content == "The output of the OS:\n\n\r2\r\n"
    env.cancel(start.session)
    assert not Path("/usr/stock.log").exists()


def test_scripts_are_found_in_agentbench_s_layout(tmp_path):
    """os.yaml lines 70-90: ``data/<N>/*.json`` pairs with ``scripts/<N>/``."""
    item = {"description": "d", "evaluation": {"check": [{"file": "check/1.sh"}]}}
    for data, scripts in (("data/1/stock.json", "scripts/1"), ("data/dev.json", "scripts/dev")):
        path = tmp_path / data
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([item]))
        (tmp_path / scripts / "check").mkdir(parents=True)
        (tmp_path / scripts / "check" / "1.sh").write_text(f"echo {scripts}")
        assert scripts_root(path) == tmp_path / scripts
        assert load_items(path)[0].check[0].code == f"echo {scripts}"
    alone = tmp_path / "other" / "items.json"
    alone.parent.mkdir()
    assert scripts_root(alone) == alone.parent


def test_the_image_is_read_from_create_local(tmp_path):
    """task.py lines 245-248: ``create.local`` names the image (``default`` otherwise)."""
    item = {"description": "d", "create": {"local": "packages"}, "evaluation": {"match": "x"}}
    assert load_items(_data(tmp_path, item))[0].image == "packages"


def _layout(base: Path, folders: dict[str, list[dict]], scripts: dict[str, str]) -> None:
    """AgentBench's ``data/os_interaction``: ``data/<N>/*.json`` and ``scripts/<N>/``."""
    for name, items in folders.items():
        (base / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "data" / name).write_text(json.dumps(items))
    for name, code in scripts.items():
        (base / "scripts" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "scripts" / name).write_text(code)


def test_a_folder_or_a_glob_is_read_as_agentbench_s_config_reads_it(tmp_path):
    """os.yaml lines 63-90 (os-std: ``data/<N>/*.json`` with ``scripts/<N>/``, 1 to 7) and
    task.py lines 176-200 (a glob's .json and .jsonl files, every item one index)."""
    base = tmp_path / "os_interaction"
    item = {"description": "d", "evaluation": {"check": [{"file": "check/x.sh"}]}}
    _layout(
        base,
        {"10/b.json": [item], "2/a.json": [item, item], "dev.json": [item], "2/notes.txt": []},
        {"2/check/x.sh": "echo 2", "10/check/x.sh": "echo 10", "dev/check/x.sh": "echo dev"},
    )
    for spec in (base, base / "data", f"{base}/data/*/*.json"):
        items = load_items(spec)
        assert [i.check[0].code for i in items] == ["echo 2", "echo 2", "echo 10"]
        assert [i.source for i in items] == ["2/a.json#0", "2/a.json#1", "10/b.json#0"]
    assert [i.check[0].code for i in load_items(base / "data" / "dev.json")] == ["echo dev"]
    with pytest.raises(ItemError, match=r"no \.json or \.jsonl"):
        load_items(f"{base}/data/*/*.yaml")


@pytest.mark.skipif(not SHARED_OS.exists(), reason=f"no AgentBench sample at {SHARED_OS}")
def test_agentbench_s_sample_folder_loads_whole():
    """The published sample: ``data/dev.json`` (26 items) and its ``scripts/dev/``."""
    items = load_items(SHARED_OS)
    assert len(items) == 26 and items[25].source == "data/dev.json#25"
    assert load_items(SHARED_OS / "data") == items


def test_repeated_items_and_one_question_of_two_images_all_load_on_one_side(tmp_path):
    """task.py lines 190-200: AgentBench plays every item of a file, one index each, the
    same question in its ``default`` and ``packages`` images included (its ``data/3``)."""
    npm = {
        "description": "Is npm installed? yes or no",
        "evaluation": {"check": [None, {"language": "python", "code": "exit(0)"}]},
    }
    npm["evaluation"]["example"] = "command -v npm >/dev/null && echo yes || echo no"
    others = [{"description": f"q{i}", "evaluation": {"match": str(i)}} for i in range(12)]
    data = _data(tmp_path, npm, {**npm, "create": {"local": "packages"}}, *others, npm)
    envs = {s: make_task("os", split=s, data=data) for s in ("train", "test", "all")}
    assert envs["all"].num_instances == 15
    assert envs["train"].num_instances + envs["test"].num_instances == 15
    key = content_key(envs["all"].item(0))
    sides = [s for s in ("train", "test") for i in range(envs[s].num_instances)
             if content_key(envs[s].item(i)) == key]  # fmt: skip
    assert len(sides) == 3 and len(set(sides)) == 1
    images = [envs["all"].item(i).image for i in (0, 1, 14)]
    assert images == [None, "packages", None]
