"""Red team, os task on bwrap: an agent that rewrites what the judge runs gets no reward.

Attack class: the judge's programs. Check scripts run after the agent's last action, on
its machine; every way the agent could put its own code (or its own output) in their
place is played through the session API, followed by ``finish_action`` (or a wrong
answer): programs shadowed through ``PATH``, system programs and libraries replaced,
the loader's preload list, shell start-up files and exported functions, Python's site
hooks and modules in the working directory, the judge's own view attacked directly, a
racer rewriting outputs while the judge runs. Each must end with reward 0, while the
honest solution of the same items is rewarded (so the items can be passed at all).
"""

from __future__ import annotations

import pytest

from agentrl.environments import make_task
from tests.security.hostile import JUDGED, data_file, needs_bwrap, play

pytestmark = needs_bwrap

_PASS = "#!/bin/sh\necho 1337\nexit 0\n"
"""A stand-in program: succeeds, and prints what a hijacked example would answer."""
_INTERPRETERS = (
    "bash sh dash python3 python3.11 python env grep find stat wc cat head awk mawk test [ "
    "timeout ls sed sort tr id true false"
)

ATTACKS = {
    "path_shadowing": [
        f"for d in /usr/local/bin /usr/local/sbin /root/bin; do mkdir -p $d; "
        f'for p in {_INTERPRETERS}; do printf \'{_PASS}\' > "$d/$p"; chmod +x "$d/$p"; done; '
        "done; export PATH=/root/bin:$PATH",
    ],
    "system_programs_replaced": [
        # the agent's /usr is its own overlay: it can rewrite every program there (dash,
        # which the stand-ins run on, excepted)
        f"cd /usr/bin && for p in {_INTERPRETERS.replace(' sh dash', '')}; do "
        '[ -e "$p" ] || continue; rm -f "$p"; '
        f'printf \'{_PASS.replace("/bin/sh", "/bin/dash")}\' > "$p"; chmod +x "$p"; done; '
        "ln -sf /usr/bin/bash /usr/bin/sh",
    ],
    "libraries_and_loader_replaced": [
        "for f in /usr/lib/x86_64-linux-gnu/libc.so.6 /usr/lib64/ld-linux-x86-64.so.2 "
        "/usr/lib/aarch64-linux-gnu/libc.so.6; do [ -e $f ] && : > $f; done; true",
    ],
    "preload_and_loader_cache": [
        "printf '#include <unistd.h>\\n__attribute__((constructor)) void h(void)"
        '{ write(1, "1337\\\\n", 5); _exit(0); }\\n\' > /root/h.c; '
        "gcc -shared -fPIC -o /root/h.so /root/h.c 2>/dev/null || : > /root/h.so; "
        "echo /root/h.so > /etc/ld.so.preload; : > /etc/ld.so.cache; "
        "mkdir -p /usr/local/lib && cp /root/h.so /usr/local/lib/libc.so.6; true",
    ],
    "shell_start_up_and_functions": [
        "printf 'exit 0\\n' | tee /root/.bashrc /root/.profile /root/.bash_profile "
        "/etc/bash.bashrc /etc/profile /root/evil.sh >/dev/null; "
        "export BASH_ENV=/root/evil.sh ENV=/root/evil.sh; "
        "grep() { return 0; }; test() { return 0; }; export -f grep test; "
        "alias grep=true; echo 'BASH_ENV=/root/evil.sh' >> /etc/environment",
    ],
    "python_site_hooks": [
        "hook='import os; os._exit(0)'; "
        "for d in /usr/local/lib/python3*/dist-packages /usr/local/lib/python3.11/dist-packages "
        "/root/.local/lib/python3.11/site-packages /usr/lib/python3/dist-packages "
        '/etc/python3.11 /etc/python3; do mkdir -p $d; echo "$hook" > $d/sitecustomize.py; '
        'echo "$hook" > $d/usercustomize.py; echo "$hook" > $d/zzz.pth; done; '
        'for m in json sys_ re os; do echo "$hook" > /root/$m.py; done; '
        "export PYTHONPATH=/root PYTHONSTARTUP=/root/json.py PYTHONHOME=/root; true",
    ],
    "python_home_moved": [
        # a pyvenv.cfg beside /usr/bin names another home: its standard library (a copy
        # whose encodings package exits 0 as Python starts) would be the judge's
        "v=$(ls -d /usr/lib/python3.[0-9]* | head -n1); n=${v##*/}; "
        "mkdir -p /tmp/evil/bin /tmp/evil/lib && cp -a $v /tmp/evil/lib/ && "
        "f=/tmp/evil/lib/$n/encodings/__init__.py && rm -f $f && cp $v/encodings/__init__.py $f "
        "&& echo 'import posix; posix._exit(0)' >> $f "
        "&& rm -rf /tmp/evil/lib/$n/encodings/__pycache__; "
        "printf 'home = /tmp/evil/bin\\n' | tee /usr/pyvenv.cfg /usr/bin/pyvenv.cfg; true",
    ],
    "judge_view_attacked": [
        # whatever the agent finds of the judge's view (covered at /.judge, reached through
        # the first process's descriptor): remount, unmount, replace
        "for v in /.judge /proc/[0-9]*/fd/9; do mount -o remount,rw $v; "
        "umount -l $v/usr/bin; umount $v/etc/ld.so.preload; umount /.judge; "
        "rm -rf $v/lib64 $v/bin; ln -s /root $v/bin; "
        f"printf '{_PASS}' > $v/usr/bin/bash; printf '{_PASS}' > $v/usr/bin/python3; "
        "echo /root/h.so > $v/etc/ld.so.preload; done 2>/dev/null; true",
    ],
    "top_level_folders_replaced": [
        # a loader that makes every program succeed, put where the judge's /lib64 would be
        # if the agent could replace the top-level folders (they are mount points)
        "printf 'int main(void){return 0;}' > /root/l.c && gcc -static -o /root/ld /root/l.c; "
        "for d in bin sbin lib lib64; do mv /$d /root/old-$d || rm -f /$d; ln -sfn /root /$d; "
        "done; cp /root/ld /lib64/ld-linux-x86-64.so.2; cp /root/ld /root/ld-linux-x86-64.so.2; "
        f"printf '{_PASS}' > /bin/python3; true",
    ],
    "entry_programs_replaced": [
        # what every command is entered through (setpriv, chroot, env), in every PATH folder
        "for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin; do "
        "for p in setpriv chroot env nsenter timeout; do printf '#!/bin/sh\\nexit 0\\n' > $d/$p; "
        "chmod +x $d/$p; done; done",
    ],
    "racer_rewrites_outputs": [
        # a background loop rewrites every output file and the answer while the judge runs
        "nohup setsid bash -c 'while :; do for f in /run/agentrl/out.* /tmp/tmp.*; do "
        "[ -f $f ] && echo 1337 > $f; done; echo yes > /root/ok.tmp; done' >/dev/null 2>&1 &",
    ],
}


@pytest.fixture(scope="module", params=["terminal", "fresh"])
def env(request, tmp_path_factory):
    """The task, with each of the agent's shells (the judge is the same for both)."""
    data = data_file(tmp_path_factory.mktemp("os"))
    return make_task("os", data=data, split="all", sandbox="bwrap", shell=request.param)


@pytest.mark.parametrize("index", range(len(JUDGED)))
def test_the_honest_solution_is_rewarded(env, index):
    item = env.item(index)
    step = play(env, index, [item.example.as_bash()], ending=_honest_ending(env, index))
    assert step.reward == 1.0, step


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("index", range(len(JUDGED)))
def test_an_agent_that_rewrites_the_judge_gets_nothing(env, attack, index):
    step = play(env, index, ATTACKS[attack])
    assert step.reward == 0.0, (attack, step)


def test_the_entry_programs_cannot_hand_out_capabilities(env):
    """Programs the agent puts where a command is entered from (setpriv, chroot, env...)
    never run with more than the session's capabilities: the full set would let them
    unmount the judge's view."""
    session = env.start(0).session
    try:
        sandbox = session.sandbox
        record = "#!/bin/sh\\ngrep CapEff /proc/self/status > /root/caps-$$\\nexit 0\\n"
        planted = sandbox.run(
            "for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin; do "
            "for p in setpriv chroot env nsenter timeout; do "
            f"printf '{record}' > $d/$p; chmod +x $d/$p; done; done",
            10,
        )
        assert planted.exit_code == 0, planted
        sandbox.run("true", 10)  # its own env now runs in its place
        seen = sandbox.judge(["/usr/bin/bash", "-c", "cat /root/caps-*"], 10).output.split()
        assert seen and seen[::2] == ["CapEff:"] * (len(seen) // 2), seen
        for mask in seen[1::2]:
            assert int(mask, 16) & (1 << 21) == 0, seen  # never CAP_SYS_ADMIN
        mount = sandbox.judge(["/usr/bin/mount", "-o", "remount,rw", "/"], 10)
        assert mount.exit_code != 0, mount
    finally:
        env.cancel(session)


def test_the_check_scripts_are_nowhere_on_the_agents_machine(env):
    session = env.start(2).session
    try:
        found = session.sandbox.run(
            "grep -rlsF 'sys.argv[1].strip() != sys.argv[2].strip()' "
            "/root /home /tmp /var /run /opt /srv /mnt /usr/local /etc /dev /.judge/etc",
            60,
        )
        assert found.output == "", found
    finally:
        env.cancel(session)


def _honest_ending(env, index):
    from tests.security.hostile import say

    if not env.item(index).wants_answer:
        return say("finish_action")
    session = env.start(index).session
    try:  # the right answer, as the agent would find it
        answer = session.sandbox.run(env.item(index).example.as_bash(), 10).output.strip()
    finally:
        env.cancel(session)
    return say("answer_action", answer=answer)
