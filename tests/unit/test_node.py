"""NodeSupervisor with small child programs: restart with back-off, finish, drain, state file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from agentrl.ops.run.node import NodeSupervisor, role_argv
from tests.processes import alive

PY = sys.executable


def _node(tmp_path, roles, **kw):
    return NodeSupervisor(
        roles,
        node="n1",
        state_file=tmp_path / "nodes" / "n1.json",
        backoff_initial=0.1,
        backoff_max=0.4,
        **kw,
    )


def _state(tmp_path):
    return json.loads((tmp_path / "nodes" / "n1.json").read_text())


def test_a_crashing_role_is_restarted_with_back_off_until_it_succeeds(tmp_path):
    counter = tmp_path / "runs"
    # fails on its first three runs, then exits 0
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) "
        "if p.exists() else 0; p.write_text('x' * (n + 1)); sys.exit(0 if n >= 3 else 3)"
    )
    node = _node(tmp_path, {"flaky": [PY, "-c", script, str(counter)]})
    start = time.monotonic()
    assert node.run(install_signals=False) == 0
    elapsed = time.monotonic() - start
    assert counter.read_text() == "xxxx"
    assert elapsed >= 0.1 + 0.2 + 0.4  # back-off 0.1, 0.2, 0.4 (capped) between the four runs
    role = _state(tmp_path)["roles"]["flaky"]
    assert role["restarts"] == 3 and role["exit_codes"] == [3, 3, 3, 0]


def test_a_killed_role_is_restarted_and_others_keep_running(tmp_path):
    node = _node(
        tmp_path,
        {
            "victim": [PY, "-c", "import time; time.sleep(60)"],
            "bystander": [PY, "-c", "import time; time.sleep(60)"],
        },
        stop_timeout=10,
    )
    thread = threading.Thread(target=lambda: setattr(node, "code", node.run(install_signals=False)))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while None in node.pids().values() and time.monotonic() < deadline:
            time.sleep(0.05)
        first, bystander = node.pids()["victim"], node.pids()["bystander"]
        os.kill(first, signal.SIGKILL)
        while node.pids()["victim"] in (None, first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.pids()["victim"] not in (None, first)
        assert node.pids()["bystander"] == bystander
        state = _state(tmp_path)["roles"]
        assert state["victim"]["restarts"] == 1 and state["victim"]["exit_codes"] == [-9]
    finally:
        node.stop()
        thread.join(30)
    assert node.code == 0  # the sleepers ended by the drain's SIGTERM: a clean stop


def test_sigterm_drains_every_role_and_clean_exits_count_as_success(tmp_path):
    drains = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        "    pathlib.Path(sys.argv[1]).write_text('drained')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "time.sleep(60)\n"
    )
    a, b = tmp_path / "a", tmp_path / "b"
    node = _node(tmp_path, {"a": [PY, "-c", drains, str(a)], "b": [PY, "-c", drains, str(b)]})
    threading.Timer(1.0, node.stop).start()
    assert node.run(install_signals=False) == 0
    assert a.read_text() == b.read_text() == "drained"
    state = _state(tmp_path)
    assert state["stopping"] and not any(r["alive"] for r in state["roles"].values())


def test_a_role_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    node = _node(tmp_path, {"stubborn": [PY, "-c", stubborn]}, stop_timeout=0.5)
    threading.Timer(1.0, node.stop).start()
    start = time.monotonic()
    assert node.run(install_signals=False) == 1
    assert time.monotonic() - start < 10
    assert _state(tmp_path)["roles"]["stubborn"]["exit_codes"] == [-9]


def test_role_argv_reruns_this_command_for_one_role_in_process():
    argv = [
        "start",
        "--config",
        "c.yaml",
        "--roles",
        "sampler,rollout",
        "--node=x",
        "--max-steps",
        "3",
        "--resume",
    ]
    out = role_argv(argv, "rollout", "b", 1)
    assert out[:3] == [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
    assert out[3:] == [
        "start", "--config", "c.yaml", "--max-steps", "3",
        "--roles", "rollout", "--node", "b", "--torch-threads", "1", "--in-process", "--resume",
    ]  # fmt: skip


def test_a_clean_exit_means_the_run_ended_so_the_node_drains_the_rest(tmp_path):
    node = _node(
        tmp_path,
        {
            "done": [PY, "-c", "import time; time.sleep(0.5)"],
            "busy": [PY, "-c", "import time; time.sleep(60)"],
        },
        stop_timeout=10,
    )
    start = time.monotonic()
    assert node.run(install_signals=False) == 0
    assert time.monotonic() - start < 10
    roles = _state(tmp_path)["roles"]
    assert roles["done"]["exit_codes"] == [0]
    assert roles["busy"]["exit_codes"] == [-signal.SIGTERM] and roles["busy"]["restarts"] == 0


def test_a_role_that_fails_during_the_drain_fails_the_node(tmp_path):
    ready = tmp_path / "bad-ready"  # "done" ends (and the node drains) once "bad" handles SIGTERM
    node = _node(
        tmp_path,
        {
            "done": [
                PY,
                "-c",
                f"import pathlib, time\nwhile not pathlib.Path({str(ready)!r}).exists(): "
                "time.sleep(0.05)",
            ],
            "bad": [
                PY,
                "-c",
                "import pathlib, signal, sys, time; "
                "signal.signal(signal.SIGTERM, lambda *_: sys.exit(5)); "
                f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)",
            ],
        },
        stop_timeout=10,
    )
    assert node.run(install_signals=False) == 1
    assert _state(tmp_path)["roles"]["bad"]["exit_codes"] == [5]


def test_a_role_that_exits_fatally_is_not_restarted_and_the_node_exits_2(tmp_path):
    node = _node(
        tmp_path,
        {
            "refused": [PY, "-c", "import sys; sys.exit(2)"],  # e.g. the broker refused login
            "busy": [PY, "-c", "import time; time.sleep(60)"],
        },
        stop_timeout=10,
    )
    start = time.monotonic()
    assert node.run(install_signals=False) == 2
    assert time.monotonic() - start < 10
    roles = _state(tmp_path)["roles"]
    assert roles["refused"]["exit_codes"] == [2] and roles["refused"]["restarts"] == 0
    assert roles["busy"]["exit_codes"] == [-signal.SIGTERM]
    assert node.fatal == "refused"


def test_roles_die_with_their_node_even_when_it_is_killed(tmp_path):
    """SIGKILL of the node supervisor: each role gets SIGTERM (a drain) and exits."""
    role = (
        "import pathlib, signal, sys, time; from agentrl.ops.run.node import die_with_node; "
        "out = pathlib.Path(sys.argv[1]); "
        "signal.signal(signal.SIGTERM, lambda *_: (out.write_text('drained'), sys.exit(0))); "
        "die_with_node(); out.write_text('armed'); time.sleep(120)"
    )
    marks = [tmp_path / "r1", tmp_path / "r2"]
    roles = {f"r{i}": [PY, "-c", role, str(m)] for i, m in enumerate(marks, 1)}
    node_script = (
        "import json, pathlib, sys; from agentrl.ops.run.node import NodeSupervisor; "
        f"sys.exit(NodeSupervisor(json.loads(sys.argv[1]), node='n1', "
        f"state_file=pathlib.Path({str(tmp_path / 'n1.json')!r})).run())"
    )
    node = subprocess.Popen([PY, "-c", node_script, json.dumps(roles)])
    try:
        deadline = time.monotonic() + 60
        while not all(m.exists() and m.read_text() == "armed" for m in marks):
            assert time.monotonic() < deadline, "the roles did not start"
            time.sleep(0.1)
        pids = [r["pid"] for r in json.loads((tmp_path / "n1.json").read_text())["roles"].values()]
        node.kill()
        node.wait()
        deadline = time.monotonic() + 10
        while not all(m.read_text() == "drained" for m in marks):
            assert time.monotonic() < deadline, [m.read_text() for m in marks]
            time.sleep(0.1)
        for pid in pids:  # and they are gone (reaped by init)
            while time.monotonic() < deadline and alive(pid):
                time.sleep(0.1)
            assert not alive(pid)
    finally:
        node.kill()
        node.wait()


def test_a_pinned_role_runs_on_its_cores_also_after_a_restart(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "mask"
    script = (  # records its CPU mask; fails on its first run, so it is restarted once
        "import os, pathlib, sys; p = pathlib.Path(sys.argv[1]); "
        "runs = p.read_text().splitlines() if p.exists() else []; "
        "runs.append(str(sorted(os.sched_getaffinity(0)))); p.write_text('\\n'.join(runs)); "
        "sys.exit(0 if len(runs) > 1 else 3)"
    )
    node = _node(tmp_path, {"pinned": [PY, "-c", script, str(out)]}, affinity={"pinned": cores[:1]})
    assert node.run(install_signals=False) == 0
    assert out.read_text().splitlines() == [str(cores[:1])] * 2


def test_cpu_affinity_names_roles_and_this_machines_cores():
    import pytest

    from agentrl.ops import ConfigError, parse_config

    assert parse_config({"run": "r", "cpu_affinity": {"learner": [0]}}).cpu_affinity == {
        "learner": [0]
    }
    with pytest.raises(ConfigError) as bad:
        parse_config({"run": "r", "cpu_affinity": {"trainer": [0], "sampler": [4096]}})
    assert "cpu_affinity.trainer: not a role" in str(bad.value)
    assert "cpu_affinity.sampler: [4096] must be a non-empty list" in str(bad.value)


def test_the_first_ctrl_c_is_said_once_for_the_node_and_the_second_aborts_every_role(tmp_path):
    """Issue 50: a second Ctrl-C did not abort a multi-process run (the node waited out its
    drain), and the first printed one acknowledgement per role. Roles here drain as a run's
    roles do (`Interrupts`) and then hang, as a learner stuck in its update does."""
    stuck = (
        "import os, threading, time; from agentrl.ops.run.interrupt import Interrupts; "
        "done = threading.Event(); Interrupts(done, 'the update').install(); "
        "print('ready', flush=True); done.wait(); time.sleep(600)"
    )
    roles = {name: [PY, "-c", stuck] for name in ("learner", "rollout", "sampler")}
    node_script = (
        "import json, pathlib, sys; from agentrl.ops.run.node import NodeSupervisor; "
        f"sys.exit(NodeSupervisor(json.loads(sys.argv[1]), node='n1', "
        f"state_file=pathlib.Path({str(tmp_path / 'nodes' / 'n1.json')!r})).run())"
    )
    node = subprocess.Popen(
        [PY, "-c", node_script, json.dumps(roles)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = 0
        while ready < len(roles):  # every role has its handler installed
            line = node.stdout.readline()
            assert line, "the node ended before its roles were ready"
            ready += line.count("ready")  # three writers: lines may interleave
        node.send_signal(signal.SIGINT)
        first = node.stderr.readline()  # said at once; then the node drains its roles
        time.sleep(0.5)  # (were the second to come first, each role still gets two SIGTERMs)
        assert node.poll() is None  # the first Ctrl-C waits for the stuck roles
        start = time.monotonic()
        node.send_signal(signal.SIGINT)
        _, rest = node.communicate(timeout=30)
        err = first + rest
        assert time.monotonic() - start < 15
    finally:
        node.kill()
        node.wait()
    assert node.returncode == 130, err
    said = [line for line in err.splitlines() if line.startswith("agentrl-supervisor:")]
    assert len(said) == 2, err  # one line per Ctrl-C, for the whole node
    assert said[0].startswith("agentrl-supervisor: SIGINT: stopping") and "again" in said[0]
    assert said[1].startswith("agentrl-supervisor: SIGINT again: aborting every role")
    codes = {r: v["exit_codes"][-1] for r, v in _state(tmp_path)["roles"].items()}
    assert codes == dict.fromkeys(roles, 130)  # each aborted itself (`Interrupts`)


def test_a_fatal_exit_while_the_node_drains_still_makes_the_node_exit_2(tmp_path):
    """Issue 50: the learner stopped a run for good (a full disk, exit 2) and broadcast the
    shutdown; the other roles exited 0 first, the node took the run as ended, and its exit
    was 1. A fatal role exit is fatal whenever it comes."""
    node = _node(
        tmp_path,
        {
            "rollout": [PY, "-c", "import sys; sys.exit(0)"],  # heard the shutdown first
            "learner": [  # drains on SIGTERM: writes nothing more, then exits 2
                PY,
                "-c",
                "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: None); "
                "time.sleep(1.0); sys.exit(2)",
            ],
        },
        stop_timeout=30,
    )
    assert node.run(install_signals=False) == 2
    assert node.fatal == "learner"


def test_each_restart_is_said_once_on_the_console(tmp_path, capfd):
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) "
        "if p.exists() else 0; p.write_text('x' * (n + 1)); sys.exit(0 if n >= 2 else 3)"
    )
    node = _node(tmp_path, {"flaky": [PY, "-c", script, str(tmp_path / "runs")]})
    assert node.run(install_signals=False) == 0
    said = [x for x in capfd.readouterr().err.splitlines() if x.startswith("agentrl-supervisor:")]
    assert said == [
        "agentrl-supervisor: flaky stopped (exit code 3); restarting it in 0.1 s "
        "(restart 1; its log: logs/n1/)",
        "agentrl-supervisor: flaky stopped (exit code 3); restarting it in 0.2 s "
        "(restart 2; its log: logs/n1/)",
    ]


def test_one_role_of_a_node_prints_the_progress_line(tmp_path, monkeypatch):
    from agentrl.ops.run.interrupt import CONSOLE_ROLE_ENV
    from agentrl.ops.run.supervisor import Supervisor

    show = "import os, sys; open(sys.argv[1], 'w').write(os.environ['AGENTRL_CONSOLE_ROLE'])"
    roles = {r: [PY, "-c", show, str(tmp_path / r)] for r in ("sampler", "learner", "rollout")}
    node = _node(tmp_path, roles)
    assert node.console_role == "learner"
    assert node.run(install_signals=False) == 0
    assert {(tmp_path / r).read_text() for r in roles} == {"learner"}  # every role is told
    assert _node(tmp_path, {"rollout": ["true"], "controller": ["true"]}).console_role == (
        "controller"
    )
    assert _node(tmp_path, {"sampler": ["true"], "rollout": ["true"]}).console_role == "sampler"

    class Role:  # what prints_progress reads of a Supervisor
        prints_progress = Supervisor.prints_progress

        def __init__(self, roles):
            self.roles = roles

    monkeypatch.delenv(CONSOLE_ROLE_ENV, raising=False)
    assert Role(("rollout",)).prints_progress  # a process of its own: always
    monkeypatch.setenv(CONSOLE_ROLE_ENV, "learner")
    assert Role(("learner",)).prints_progress and not Role(("rollout",)).prints_progress
