"""Red team, os task in containers (podman or Docker through the SDK): what holds there.

The same attack classes as test_os_sandbox.py and test_os_judge.py, where the container
backend stops them: the host's kernel (read-only ``/proc/sys``, root not root outside
on podman), the host's passwords, the CPU and process limits, children escaping the time
limit, and every judge attack of test_os_judge.py (the programs a container's agent
rewrites are found by comparing the container with its image).

Needs a container engine at $DOCKER_HOST with the agentrl/os-sandbox image; skipped
without, unless AGENTRL_REQUIRE_CONTAINERS=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments.tasks.os.docker_sandbox import _is_podman
from agentrl.environments.tasks.os.sandbox import DEFAULT_IMAGE, Limits, docker_available
from tests.security.hostile import JUDGED, data_file, play, say
from tests.security.test_os_judge import ATTACKS
from tests.security.test_os_sandbox import _ESCAPES, _WRITABLE, BUSY

pytestmark = pytest.mark.integration

LIMITS = Limits(memory_mb=128, pids=64, cpus=0.25)


@pytest.fixture(scope="module", autouse=True)
def engine():
    docker_available.cache_clear()
    if not docker_available(DEFAULT_IMAGE):
        reason = f"no container engine at DOCKER_HOST with the image {DEFAULT_IMAGE}"
        if os.environ.get("AGENTRL_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"{reason} and AGENTRL_REQUIRE_CONTAINERS=1")
        pytest.skip(f"{reason} (ops/containers/setup-podman.sh, build-images.sh)")


@pytest.fixture
def box():
    from agentrl.environments.tasks.os.sandbox import open_sandbox

    sandbox = open_sandbox("docker", limits=LIMITS, label="redteam")
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return make_task(
        "os",
        data=data_file(tmp_path_factory.mktemp("os")),
        split="all",
        sandbox="docker",
        timeout=2,
        shell="fresh",
        timeout_ends=False,  # the command is killed and the episode goes on
        pids=64,
        memory_mb=128,
    )


def test_nothing_of_the_hosts_kernel_opens_for_writing(box):
    found = box.exec(["python3", "-c", _WRITABLE, "/proc", "/sys"], 60)
    assert found.exit_code == 0, found
    # /proc/pressure/*: a write registers a pressure trigger for the writer, no setting of
    # the host's; the engines leave it writable (podman's API takes no ReadonlyPaths)
    found = [p for p in found.output.split() if not p.startswith("/proc/pressure/")]
    assert found == [], found


def test_root_inside_is_not_root_outside_on_podman(box):
    import docker

    client = docker.from_env()
    try:
        if not _is_podman(client):
            pytest.skip(
                "Docker maps a container's root to the host's (userns-remap is daemon-wide)"
            )
    finally:
        client.close()
    mapping = box.run("cat /proc/self/uid_map", 5).output.split()
    assert mapping[0] == "0" and mapping[1] != "0", mapping


def test_the_hosts_passwords_stay_outside(box):
    shadow = box.run("cat /etc/shadow", 5).output
    host = Path("/etc/shadow").read_text() if Path("/etc/shadow").exists() else ""
    assert shadow and shadow != host


def test_the_cpu_quota_holds(box):
    used = float(box.exec(["python3", "-c", BUSY], 10).output.split()[-1])
    assert 0 < used <= LIMITS.cpus * 3 * 1.5 + 0.3, used


@pytest.mark.parametrize("index", range(len(JUDGED)))
def test_the_honest_solution_is_rewarded(env, index):
    from tests.security.test_os_judge import _honest_ending

    step = play(env, index, [env.item(index).example.as_bash()], _honest_ending(env, index))
    assert step.reward == 1.0, step


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("index", range(len(JUDGED)))
def test_an_agent_that_rewrites_the_judge_gets_nothing(env, attack, index):
    step = play(env, index, ATTACKS[attack])
    assert step.reward == 0.0, (attack, step)


def test_children_die_at_the_commands_time_limit(env):
    tag = f"agentrl-escape-{uuid.uuid4().hex[:8]}"
    session = env.start(0).session
    try:
        step = env.interact(
            session, say("bash_action", script=_ESCAPES.format(tag=tag) + "sleep 30")
        )
        assert "killed" in step.messages[-1].content, step
        time.sleep(0.5)  # ps itself must not be one of the escapees it looks for
        left = session.sandbox.run(f"ps -eo args | grep -c '^{tag}' || true", 10)
        assert left.output.strip() == "0", left
    finally:
        env.cancel(session)
