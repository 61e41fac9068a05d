"""Items of the ``os`` task: AgentBench's os_interaction format, read and checked.

A data file is a JSON list of items (or one item, or JSONL). The ``data`` option names
a file, a folder or a glob of files, read as AgentBench's task config reads its data
(`data_files`), every item kept (duplicates too: AgentBench plays each). Scripts are
given as a bash string, ``{"code": ...}`` or ``{"file": ...}`` (a path under
the scripts folder of the item's file), with an optional ``"language"`` (``bash``,
default, or ``python``). Read once at load time; a missing file, an unknown language or
an item without a judge raises `ItemError` naming the item.
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass, replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import structlog

from agentrl.environments._protocol import SampleError
from agentrl.environments.tasks.toolkit.split import split_items

__all__ = [
    "FULL_LEVEL",
    "ItemError",
    "Match",
    "OSItem",
    "Script",
    "content_key",
    "data_files",
    "items_of_split",
    "load_items",
    "parse_item",
    "scripts_root",
]

log = structlog.get_logger(__name__)

FULL_LEVEL = 2
"""The level number of the data set's items (AgentBench's task); 0 and 1 are generated."""

LANGUAGES = {"bash": "bash", "sh": "bash", "python": "python", "python3": "python"}
_ARGUMENTS = {"python": re.compile(r"\bargv\b"), "bash": re.compile(r"\$(\{?1\b|[@*])")}
"""A script's reference to its arguments, by language (`OSItem.reads_answer`)."""


class ItemError(SampleError):
    """A data item that cannot be run: malformed, a script missing (at load time), or its
    init script fails or runs over its time limit (at ``start``: the episode ends
    ``task_error``)."""


@dataclass(frozen=True, slots=True)
class Script:
    """A script run inside the sandbox."""

    language: str
    """``bash`` or ``python``."""
    code: str

    def argv(self, *args: str) -> list[str]:
        """The command running this script with ``args`` (``$1``... / ``sys.argv[1:]``)."""
        if self.language == "python":
            return ["python3", "-c", self.code, *args]
        return ["bash", "-c", self.code, "--", *args]

    def judge_argv(self, *args: str) -> list[str]:
        """`argv` for a judge: the interpreter by absolute path; Python with its home
        fixed at ``/usr`` (a ``pyvenv.cfg`` the agent writes in ``/usr`` would move its
        standard library) and, as ``-I`` would (which also ignores ``PYTHONHOME``), no
        user site and no working directory on its path (Python 3.11+); the judge's
        environment holds no other ``PYTHON*`` variable."""
        if self.language == "python":
            python = ["PYTHONHOME=/usr", "PYTHONNOUSERSITE=1", "PYTHONSAFEPATH=1"]
            return ["/usr/bin/env", *python, "/usr/bin/python3", "-c", self.code, *args]
        return ["/usr/bin/bash", "-c", self.code, "--", *args]

    def as_bash(self) -> str:
        """The script as one bash command line (for a ``bash_action``)."""
        if self.language == "python":
            return "python3 - <<'AGENTRL_PY'\n" + self.code + "\nAGENTRL_PY"
        return self.code


@dataclass(frozen=True, slots=True)
class Match:
    """``evaluation.match``: the answer compared with a string or searched with a regex."""

    answer: str | None = None
    regex: str | None = None
    strip: bool = True


@dataclass(frozen=True, slots=True)
class OSItem:
    """One os_interaction item."""

    description: str
    image: str | None
    """``create.local`` (AgentBench's name; ``create.image`` too): the container image
    (mapped through the ``images`` option)."""
    init: tuple[Script, ...]
    """``create.init``: run one after another before the first message."""
    start: Script | None
    """Started in the background after ``init``; runs for the whole session."""
    match: Match | None
    check: tuple[Script | None, ...]
    """``evaluation.check``; None entries stand for the example script."""
    example: Script | None
    """``evaluation.example``: a reference solution."""
    labels: tuple[str, ...] = ()
    level: int = FULL_LEVEL
    """The graded level this item plays (`tasks.os.levels`; data-set items: the full one)."""
    source: str = ""
    """Where the item was read (``4/N37.json#0``: folder, file and position), for reports;
    not part of `content_key`."""

    @property
    def wants_answer(self) -> bool:
        """True when the judge compares an answer (match, or check running the example)."""
        return self.match is not None or any(s is None for s in self.check)

    @property
    def reads_answer(self) -> bool:
        """True when the judge may read the answer: `wants_answer`, or a check script that
        refers to its arguments (its first is the answer: Python ``argv``, bash ``$1``,
        ``${1}``, ``$@``, ``$*``). A mention inside a function of the script counts too,
        so this can be True of a check that never reads the answer."""
        return self.wants_answer or any(
            s is not None and _ARGUMENTS[s.language].search(s.code) for s in self.check
        )


def content_key(item: OSItem) -> str:
    """What makes an item itself, for the train/test split: its description and judge.

    Items with one key (AgentBench's files repeat some, or ask one question of two images)
    are kept together on one side of the split (`items_of_split`)."""
    return repr((item.description, item.match, item.check, item.init))


def items_of_split(items: list[OSItem], split: str, seed: int) -> list[OSItem]:
    """The items of ``split``; items with one `content_key` (a repeated item, one question
    of two images) share their side, so none is on both."""
    keys = [content_key(item) for item in items]
    distinct = list(dict.fromkeys(keys))
    side = set(split_items(distinct, distinct, split, seed))
    return [item for item, key in zip(items, keys, strict=True) if key in side]


def _script(raw: Any, where: str, root: Traversable) -> Script:
    if isinstance(raw, str):
        return Script("bash", raw)
    if not isinstance(raw, dict):
        raise ItemError(f"{where}: a script must be a string or an object, got {raw!r:.60}")
    language = LANGUAGES.get(str(raw.get("language", "bash")).lower())
    if language is None:
        raise ItemError(f"{where}: unsupported script language {raw.get('language')!r}")
    if "file" in raw:
        path = root.joinpath(str(raw["file"]))
        try:
            return Script(language, path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ItemError(f"{where}: cannot read script file {raw['file']!r}: {exc}") from exc
    if "code" in raw:
        return Script(language, str(raw["code"]))
    raise ItemError(f"{where}: a script object needs 'file' or 'code'")


def _scripts(raw: Any, where: str, root: Traversable) -> tuple[Script, ...]:
    entries = raw if isinstance(raw, list) else [raw]
    return tuple(_script(s, f"{where}[{i}]", root) for i, s in enumerate(entries) if s is not None)


def parse_item(raw: Any, where: str, root: Traversable) -> OSItem:
    """One os_interaction JSON object -> `OSItem`; scripts are read from under ``root``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("description"), str):
        raise ItemError(f"{where}: an item is an object with a string 'description'")
    create = raw.get("create") or {}
    if not isinstance(create, dict):
        # AgentBench only looks keys up in it, so a list means: no image, no init.
        log.warning("os item: 'create' is not an object, ignored", item=where)
        create = {}
    evaluation = raw.get("evaluation")
    if not isinstance(evaluation, dict):
        raise ItemError(f"{where}: no 'evaluation' object")
    match = None
    check: tuple[Script | None, ...] = ()
    if "match" in evaluation:
        match = _match(evaluation["match"], f"{where}: evaluation.match")
    elif "check" in evaluation:
        entries = evaluation["check"]
        entries = entries if isinstance(entries, list) else [entries]
        check = tuple(
            None if s is None else _script(s, f"{where}: evaluation.check[{i}]", root)
            for i, s in enumerate(entries)
        )
        if not check:
            raise ItemError(f"{where}: evaluation.check is empty")
    else:
        raise ItemError(f"{where}: evaluation needs 'match' or 'check'")
    example = None
    if evaluation.get("example") is not None:
        example = _script(evaluation["example"], f"{where}: evaluation.example", root)
    if any(s is None for s in check) and example is None:
        raise ItemError(f"{where}: evaluation.check has a null entry but there is no example")
    start = raw.get("start")
    image = create.get("local", create.get("image"))  # AgentBench names it ``local``
    return OSItem(
        description=raw["description"],
        image=str(image) if image else None,
        init=_scripts(create["init"], f"{where}: create.init", root) if "init" in create else (),
        start=_script(start, f"{where}: start", root) if start is not None else None,
        match=match,
        check=check,
        example=example,
        labels=tuple(str(label) for label in raw.get("labels") or ()),
    )


def _match(raw: Any, where: str) -> Match:
    if isinstance(raw, str):
        return Match(answer=raw, strip=True)
    if isinstance(raw, dict) and isinstance(raw.get("answer", raw.get("regex")), str):
        answer, regex = raw.get("answer"), raw.get("regex")
        return Match(
            answer=str(answer) if answer is not None else None,
            regex=None if answer is not None or regex is None else str(regex),
            strip=bool(raw.get("strip", True)),
        )
    raise ItemError(f"{where}: a string or an object with 'answer' or 'regex'")


def builtin_root() -> Traversable:
    return resources.files("agentrl.environments.tasks.os").joinpath("data")


def load_items(path: str | Path | None = None, scripts: str | Path | None = None) -> list[OSItem]:
    """Items of the data files ``path`` names (`data_files`; the built-in set when None).

    ``scripts`` is the folder ``{"file": ...}`` paths are relative to; by default
    `scripts_root` of each data file.
    """
    if path is None:
        root: Traversable = builtin_root()
        text = root.joinpath("items.json").read_text(encoding="utf-8")
        return _file_items(text, "built-in os set", "items.json", root)
    items: list[OSItem] = []
    for file in data_files(path):
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ItemError(f"{file}: cannot read: {exc}") from exc
        root = Path(scripts) if scripts is not None else scripts_root(file)
        items += _file_items(text, str(file), f"{file.parent.name}/{file.name}", root)
    if not items:
        raise ItemError(f"{path}: no items")
    return items


def _file_items(text: str, where: str, short: str, root: Traversable) -> list[OSItem]:
    raws = _records(text, where)
    items = [parse_item(raw, f"{where} item {i}", root) for i, raw in enumerate(raws)]
    return [replace(item, source=f"{short}#{i}") for i, item in enumerate(items)]


DATA_SUFFIXES = (".json", ".jsonl")
"""The data files AgentBench reads (``task.py``: a glob's other matches are skipped)."""


def data_files(spec: str | Path) -> list[Path]:
    """The data files ``spec`` names, as AgentBench's ``configs/tasks/os.yaml`` reads them.

    - a glob (``data/os_interaction/data/*/*.json``): its ``.json`` and ``.jsonl`` matches;
    - a folder holding folders of data files (AgentBench's ``data/os_interaction/data``):
      the files of those folders, ``<N>/*.json`` as its ``os-std`` config lists them
      (``1/`` to ``7/``: 144 items; ``dev.json`` and ``6-backup.json`` beside them are
      not read); AgentBench's ``os_interaction`` folder itself reads its ``data``;
    - a folder of data files: those files;
    - anything else: that file.

    Folders and files come in natural order (``2/`` before ``10/``). Raises `ItemError`
    when a glob or a folder holds no data file.
    """
    text = str(spec)
    if glob.has_magic(text):
        files = [Path(f) for f in sorted(glob.glob(text), key=_natural) if _is_data(Path(f))]
    elif Path(text).is_dir():
        folder = Path(text)
        if (folder / "data").is_dir() and (folder / "scripts").is_dir():
            folder = folder / "data"  # AgentBench's data/os_interaction
        groups = [d for d in sorted(folder.iterdir(), key=_natural) if d.is_dir()]
        files = [f for d in groups for f in _data_in(d)] or _data_in(folder)
    else:
        return [Path(text)]
    if not files:
        raise ItemError(f"{text}: no .json or .jsonl data file there")
    return files


def _data_in(folder: Path) -> list[Path]:
    return [f for f in sorted(folder.iterdir(), key=_natural) if _is_data(f)]


def _is_data(path: Path) -> bool:
    return path.is_file() and path.name.endswith(DATA_SUFFIXES)


def _natural(path: str | Path) -> list:
    """A sort key reading digit runs as numbers (``2`` before ``10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def scripts_root(path: Path) -> Path:
    """The folder a data file's scripts are under, in AgentBench's layout when it is there.

    ``<base>/data/<N>/<file>.json`` -> ``<base>/scripts/<N>/`` (AgentBench's
    ``configs/tasks/os.yaml`` pairs ``data/os_interaction/data/<N>/*.json`` with
    ``scripts/<N>/``); ``<base>/data/<name>.json`` -> ``<base>/scripts/<name>/``
    (``dev.json``: ``scripts/dev/``), the first that exists; else the data file's
    own folder.
    """
    path = path.resolve()
    for data_dir, name in ((path.parent.parent, path.parent.name), (path.parent, path.stem)):
        if (data_dir.parent / "scripts" / name).is_dir():
            return data_dir.parent / "scripts" / name
    return path.parent


def _records(text: str, where: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return [value]
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ItemError(f"{where}:{number}: not JSON ({exc.msg})") from exc
    return records
