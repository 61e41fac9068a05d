"""BFCL's entries, possible answers and tool schemas, loaded through bfcl-eval's own code.

- Entries: ``bfcl_eval.utils.load_dataset_entry(category)`` (multi-turn entries get their
  function docs from the involved classes' doc files, ``miss_func`` entries lose their
  held-out functions until their turn, every description gets BFCL's language hint).
- The AST checker gets the entries without the hints, as BFCL's evaluator does.
- Possible answers: ``load_ground_truth_entry(category)``; the relevance categories have
  none (their check is "a call or not").
- Tools: ``convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)``,
  what BFCL hands an OpenAI-compatible function-calling model.
- Backends: the classes a multi-turn entry's calls run on (``involved_classes``, found
  through ``CLASS_FILE_PATH_MAPPING``), their public methods and a method's parameters.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import threading
from dataclasses import dataclass
from typing import Any

from agentrl.environments.tasks.bfcl._bfcl import load

__all__ = [
    "AST_CATEGORIES",
    "CATEGORIES",
    "MULTI_TURN_CATEGORIES",
    "RELEVANCE_CATEGORIES",
    "Entry",
    "backend_class",
    "backend_methods",
    "entries",
    "expand",
    "language",
    "method_parameters",
    "to_tools",
]

AST_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
"""Single-turn categories scored by BFCL's AST checker against possible answers."""

RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
"""Single-turn categories scored by whether the answer holds a function call."""

MULTI_TURN_CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
"""Multi-turn categories, played on BFCL's executable backends and scored by its
state and response checks."""

CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES + MULTI_TURN_CATEGORIES
"""Every BFCL v4 category the bfcl tasks play. Left out: the agentic ones (web search needs
the internet and SerpAPI; memory needs sentence-transformers and faiss) and
format_sensitivity (prompting mode only)."""

ALIASES = {"simple": ("simple_python", "simple_java", "simple_javascript")}
"""Names BFCL's leaderboard groups by, beside BFCL's own collection names."""


def expand(name: str) -> tuple[str, ...]:
    """A category, an alias (``simple``) or one of BFCL's collections (``non_live``,
    ``live``, ``multi_turn``, ``python``, ``single_turn``, ``all``) as categories played
    here, in BFCL's order. ValueError names the valid ones."""
    if name in CATEGORIES:
        return (name,)
    if name in ALIASES:
        return ALIASES[name]
    collections = load().category_mapping.TEST_COLLECTION_MAPPING
    if name in collections:
        found = tuple(c for c in collections[name] if c in CATEGORIES)
        if found:
            return found
    known = sorted({*CATEGORIES, *ALIASES, *collections})
    raise ValueError(f"bfcl: unknown category {name!r}; known: {', '.join(known)}")


def language(category: str) -> Any:
    """BFCL's ``Language`` of a category's possible answers (Java, JavaScript or Python)."""
    enums = load().enums
    if category == "simple_java":
        return enums.Language.JAVA
    if category == "simple_javascript":
        return enums.Language.JAVASCRIPT
    return enums.Language.PYTHON


@dataclass(frozen=True)
class Entry:
    """One BFCL entry as the tasks use it."""

    id: str
    """BFCL's id, e.g. ``multi_turn_base_12``."""
    category: str
    prompt: dict[str, Any]
    """The entry as the model is given it (questions, hinted function docs, config)."""
    checked: dict[str, Any]
    """The entry as BFCL's checker is given it (function docs without the hints)."""
    answer: Any
    """The possible answer's ``ground_truth`` (None for the relevance categories)."""

    @property
    def multi_turn(self) -> bool:
        return self.category in MULTI_TURN_CATEGORIES


_cache_lock = threading.Lock()


@functools.cache
def _entries(category: str) -> tuple[Entry, ...]:
    utils = load().utils
    prompts = utils.load_dataset_entry(category, include_prereq=False)
    plain = {
        e["id"]: e
        for e in utils.load_dataset_entry(
            category, include_prereq=False, include_language_specific_hint=False
        )
    }
    answers: dict[str, Any] = {}
    if category not in RELEVANCE_CATEGORIES:
        answers = {a["id"]: a["ground_truth"] for a in utils.load_ground_truth_entry(category)}
    return tuple(Entry(e["id"], category, e, plain[e["id"]], answers.get(e["id"])) for e in prompts)


def entries(category: str) -> tuple[Entry, ...]:
    """Every entry of ``category`` in BFCL's order (loaded once per process)."""
    if category not in CATEGORIES:
        raise ValueError(f"bfcl: unknown category {category!r}; known: {', '.join(CATEGORIES)}")
    with _cache_lock:
        return _entries(category)


def to_tools(functions: list[dict]) -> list[dict]:
    """BFCL function docs as OpenAI function tools, by BFCL's ``convert_to_tool``."""
    bfcl = load()
    return bfcl.handler_utils.convert_to_tool(
        copy.deepcopy(functions),
        bfcl.type_mappings.GORILLA_TO_OPENAPI,
        bfcl.enums.ModelStyle.OPENAI_COMPLETIONS,
    )


def backend_class(class_name: str) -> type:
    """One of BFCL's backend classes (``GorillaFileSystem``) by name."""
    path = load().backend_config.CLASS_FILE_PATH_MAPPING[class_name]
    return getattr(importlib.import_module(path), class_name)


@functools.cache
def backend_methods(class_names: tuple[str, ...]) -> frozenset[str]:
    """The public methods of these backend classes: what BFCL's
    ``execute_multi_turn_func_call`` can run, offered in the prompt or not."""
    return frozenset(
        name
        for class_name in class_names
        for name, _ in inspect.getmembers(backend_class(class_name), inspect.isfunction)
        if not name.startswith("_")
    )


def method_parameters(entry: Entry, method: str) -> list[str]:
    """The parameter names of ``method`` of one of the entry's backend classes, in order."""
    for class_name in entry.prompt["involved_classes"]:
        cls = backend_class(class_name)
        if hasattr(cls, method):
            return [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
    raise ValueError(f"bfcl: {entry.id}: no backend has a method {method!r}")
