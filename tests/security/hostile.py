"""What the red-team tests share: the os items a hostile agent plays, and how to play them.

`JUDGED` are check-judged items (bash and Python checks, and a check comparing the
answer with the example's output run by the judge); `solve` plays an episode through
the task's session API (`start`, `interact`) and returns its last step. `host_pids`
finds processes on the host by a tag in their command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.environments._protocol import Step
from agentrl.messages import ChatMessage, ToolCall

MARK = "agentrl-redteam"

JUDGED = [
    {  # 0: a bash check using the common tools
        "description": "Write the word yes into /root/ok.",
        "evaluation": {
            "check": [
                'grep -qx yes /root/ok && [ "$(find /root -name ok | head -n1)" = /root/ok ] '
                '&& [ "$(stat -c %s /root/ok)" -eq 4 ] && sh -c true && env true '
                "&& [ \"$(cat /root/ok | wc -l)\" -eq 1 ] && awk 'BEGIN{exit 0}'"
            ],
            "example": "echo yes > /root/ok",
        },
    },
    {  # 1: a Python check
        "description": "Make the file /root/ok hold the word yes.",
        "evaluation": {
            "check": [
                {
                    "language": "python",
                    "code": "import json, sys\n"
                    "sys.exit(0 if open('/root/ok').read() == 'yes\\n' else 1)",
                }
            ],
            "example": "echo yes > /root/ok",
        },
    },
    {  # 2: the judge runs the example; a Python script compares its output with the answer
        "description": "How many entries has /etc/skel? Answer with the number.",
        "evaluation": {
            "check": [
                None,
                {
                    "language": "python",
                    "code": "import sys\nsys.exit(sys.argv[1].strip() != sys.argv[2].strip())",
                },
            ],
            "example": "ls -A /etc/skel | wc -l",
        },
    },
]
"""Items no answer of a hostile agent solves: item 2's right answer is never "1337"."""
WRONG_ANSWER = "1337"


def data_file(tmp_path: Path) -> str:
    path = tmp_path / "judged.json"
    path.write_text(json.dumps(JUDGED))
    return str(path)


def say(name: str, **arguments: str) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c0", name, json.dumps(arguments))])


def play(env, index: int, scripts: list[str], ending: ChatMessage | None = None) -> Step:
    """One episode: each script as a ``bash_action``, then ``ending`` (default: finish,
    or the wrong answer on the item that wants one)."""
    session = env.start(index).session
    step = None
    for script in scripts:
        step = env.interact(session, say("bash_action", script=script))
        assert not step.finish, step
    if ending is None:
        wants = env.item(index).wants_answer
        ending = say("answer_action", answer=WRONG_ANSWER) if wants else say("finish_action")
    step = env.interact(session, ending)
    assert step.finish, step
    return step


def host_pids(needle: str) -> list[int]:
    """Host pids whose command line holds ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def bwrap_unusable() -> str:
    """Why the bwrap sandbox cannot run here ("" when it can)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if os.geteuid() != 0:
        return "the bwrap sandbox needs root on the host"
    probe = subprocess.run(
        ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"user namespaces do not work here: {probe.stderr.strip()[:200]}"
    return ""


needs_bwrap = pytest.mark.skipif(bool(bwrap_unusable()), reason=bwrap_unusable() or "-")
