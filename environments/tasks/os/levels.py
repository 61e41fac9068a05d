"""Generated levels of the ``os`` task: read one named file, or count something.

- Level 0: the question names one file (``What is the content of the file
  /srv/config/port.conf?``); it holds one line, a word or a number, beside one
  or two other files of the same kind in its folder. One ``cat``, then answer
  the content.
- Level 1: the question names a file and asks how many lines it has (1-30), or
  names a folder and asks how many files it holds (1-20, no subfolders); a
  sibling file or folder holds another count. One ``wc -l`` or ``ls | wc -l``,
  then answer the number.

Each is an ordinary `OSItem`: an ``init`` script creating the files, a
``match`` judge with the expected answer (stripped) and an ``example`` the
oracle runs, so the sandbox, the judge and the check agents treat it like any
data item. No answer is ``0``. The content key (for the split) is the question
and the expected answer only, not the other files, so a test question never
repeats a training question with other surroundings.
"""

from __future__ import annotations

import random
import shlex

from agentrl.environments.tasks.os.items import Match, OSItem, Script

__all__ = ["GENERATED_LEVELS", "LEVEL_TURNS", "make_level"]

GENERATED_LEVELS = (0, 1)
LEVEL_TURNS = {0: 4, 1: 4}
"""Turn limit of each generated level (the full level uses ``max_turns``)."""

_ROOTS = ("/root", "/srv", "/opt", "/var/lib", "/home/ana", "/home/kofi", "/usr/local/etc")
_FOLDERS = (
    "config", "notes", "data", "app", "backup", "logs", "reports", "cache", "jobs", "site",
    "build", "inbox",
)  # fmt: skip
_KEYS = (
    "colour", "city", "port", "version", "owner", "code", "mode", "name", "level", "limit",
    "region", "status", "host", "team", "size", "token",
)  # fmt: skip
_EXTENSIONS = ("", ".txt", ".conf", ".cfg", ".dat")
_WORDS = (
    "amber", "basalt", "cedar", "delta", "ember", "falcon", "garnet", "harbor", "indigo",
    "jasper", "kestrel", "lagoon", "maple", "nickel", "onyx", "pepper", "quartz", "raven",
    "saffron", "tundra", "umber", "velvet", "willow", "xenon", "yarrow", "zephyr", "paris",
    "lima", "oslo", "cairo", "quito", "delhi", "perth", "tokyo", "rome", "green", "violet",
    "active", "paused", "stable", "beta", "north", "south", "east", "west",
)  # fmt: skip
_LOG_WORDS = ("start", "stop", "ok", "retry", "error", "sync", "load", "save", "ping", "idle")


def _folder(rng: random.Random) -> str:
    return f"{rng.choice(_ROOTS)}/{rng.choice(_FOLDERS)}"


def _value(rng: random.Random) -> str:
    """A one-line word or a number from 1 to 9999 (never ``0``)."""
    return rng.choice(_WORDS) if rng.random() < 0.5 else str(rng.randint(1, 9999))


def _write(path: str, lines: list[str]) -> str:
    """A bash line writing ``lines`` (one per line) to ``path``."""
    return f"printf '%s\\n' {' '.join(map(shlex.quote, lines))} > {shlex.quote(path)}"


def _item(level: int, question: str, init: list[str], example: str, answer: str) -> OSItem:
    return OSItem(
        description=question,
        image=None,
        init=(Script("bash", "\n".join(init)),),
        start=None,
        match=Match(answer=answer, strip=True),
        check=(),
        example=Script("bash", example),
        labels=(f"level{level}",),
        level=level,
    )


def _level0(rng: random.Random) -> OSItem:
    folder = _folder(rng)
    ext = rng.choice(_EXTENSIONS)
    names = rng.sample(_KEYS, rng.randint(2, 3))
    values = [_value(rng) for _ in names]
    init = [f"mkdir -p {shlex.quote(folder)}"]
    init += [_write(f"{folder}/{n}{ext}", [v]) for n, v in zip(names, values, strict=True)]
    path = f"{folder}/{names[0]}{ext}"
    question = rng.choice(
        (
            f"What is the content of the file {path}? Answer with the content only.",
            f"The file {path} holds one value. What is it? Answer with the value only.",
        )
    )
    return _item(0, question, init, f"cat {shlex.quote(path)}", values[0])


def _lines(rng: random.Random, count: int) -> list[str]:
    return [f"{rng.choice(_LOG_WORDS)} {rng.randint(1, 999)}" for _ in range(count)]


def _count_lines(rng: random.Random) -> OSItem:
    folder = _folder(rng)
    target, other = (f"{folder}/{n}.log" for n in rng.sample(_KEYS, 2))
    count = rng.randint(1, 30)
    others = rng.choice([n for n in range(1, 31) if n != count])
    init = [
        f"mkdir -p {shlex.quote(folder)}",
        _write(target, _lines(rng, count)),
        _write(other, _lines(rng, others)),
    ]
    question = f"How many lines does the file {target} have? Answer with the number only."
    return _item(1, question, init, f"wc -l < {shlex.quote(target)}", str(count))


def _count_files(rng: random.Random) -> OSItem:
    root = rng.choice(_ROOTS)
    target, other = (f"{root}/{n}" for n in rng.sample(_FOLDERS, 2))
    count = rng.randint(1, 20)
    others = rng.choice([n for n in range(1, 21) if n != count])
    init = [f"mkdir -p {shlex.quote(target)} {shlex.quote(other)}"]
    for folder, n in ((target, count), (other, others)):
        ext = rng.choice(_EXTENSIONS)
        files = [f"{folder}/{w}{ext}" for w in rng.sample(_WORDS, n)]
        init.append("touch " + " ".join(map(shlex.quote, files)))
    question = f"How many files are in the folder {target}? Answer with the number only."
    example = f"find {shlex.quote(target)} -maxdepth 1 -type f | wc -l"
    return _item(1, question, init, example, str(count))


def make_level(level: int, rng: random.Random) -> tuple[OSItem, str]:
    """One instance of generated ``level`` drawn with ``rng``, and its content key."""
    if level == 0:
        item = _level0(rng)
    else:
        item = _count_lines(rng) if rng.random() < 0.5 else _count_files(rng)
    assert item.match is not None
    return item, repr((item.description, item.match.answer))
