"""The ``bfcl-eval`` package, imported with only what its data, checkers and multi-turn
backends need.

``pip install bfcl-eval`` wants ~90 packages (every provider SDK, faiss,
sentence-transformers) and pins numpy 1.26. agentrl installs it with ``--no-deps`` beside
the ``bfcl`` extra, which lists what the parts used here import: ``filelock`` (its data
loader), ``mpmath`` (the MathAPI backend), ``tenacity`` and ``tree-sitter`` with its Java
and JavaScript grammars (``bfcl_eval.model_handler.utils``, home of ``convert_to_tool``).

One module stays out of reach: ``bfcl_eval.constants.model_config``, which the AST checker
imports for a single flag (``underscore_to_dot``) and which imports every provider's
handler. When it cannot be imported, `load` puts a stand-in in ``sys.modules`` that
answers that flag for agentrl's model name; when it can, agentrl's entry is added to
BFCL's own table. The flag is True: agentrl's tools are OpenAI function schemas, whose
names cannot hold ``.``, so BFCL's ``convert_to_tool`` writes ``math.factorial`` as
``math_factorial`` and the checker compares names that way (as for BFCL's OpenAI-style
function-calling models).

BFCL writes result, score and lock directories under ``BFCL_PROJECT_ROOT`` when imported;
unless that is set, it points to a directory under the system's temp dir, never the
installed package.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

__all__ = ["BFCL_EVAL_VERSION", "INSTALL", "MODEL_NAME", "BFCLMissing", "load"]

BFCL_EVAL_VERSION = "2026.3.23"
"""The bfcl-eval release agentrl is tested with."""

INSTALL = f"pip install --no-deps bfcl-eval=={BFCL_EVAL_VERSION} && pip install 'agentrl[bfcl]'"
"""How to install it (docs/tasks.md "BFCL" says why --no-deps)."""

MODEL_NAME = "agentrl"
"""The model name given to BFCL's checkers (its key in ``MODEL_CONFIG_MAPPING``)."""

_lock = threading.Lock()
_modules: types.SimpleNamespace | None = None


class BFCLMissing(ImportError):
    """bfcl-eval, or one of the few packages its used parts import, is not installed."""


def load() -> types.SimpleNamespace:
    """BFCL's modules used by the bfcl tasks, imported once (thread-safe)::

        utils, category_mapping, default_prompts, type_mappings, enums, backend_config,
        handler_utils, ast_checker, multi_turn_checker, multi_turn_utils

    Raises BFCLMissing with the install command when something is not installed."""
    global _modules
    with _lock:
        if _modules is None:
            _modules = _import()
        return _modules


def _import() -> types.SimpleNamespace:
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "agentrl-bfcl"))
    try:
        _model_config()
        names = {
            "utils": "bfcl_eval.utils",
            "category_mapping": "bfcl_eval.constants.category_mapping",
            "default_prompts": "bfcl_eval.constants.default_prompts",
            "type_mappings": "bfcl_eval.constants.type_mappings",
            "enums": "bfcl_eval.constants.enums",
            "backend_config": "bfcl_eval.constants.executable_backend_config",
            "handler_utils": "bfcl_eval.model_handler.utils",
            "ast_checker": "bfcl_eval.eval_checker.ast_eval.ast_checker",
            "multi_turn_checker": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
            "multi_turn_utils": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils",
        }
        modules = {key: importlib.import_module(name) for key, name in names.items()}
    except ImportError as exc:
        raise BFCLMissing(f"the bfcl tasks need bfcl-eval ({exc}); install it: {INSTALL}") from exc
    return types.SimpleNamespace(**modules)


class _Config:
    """What the AST checker reads of a BFCL ModelConfig."""

    underscore_to_dot = True
    is_fc_model = True


def _model_config() -> None:
    """BFCL's model table with agentrl's entry, or a stand-in holding only that entry."""
    name = "bfcl_eval.constants.model_config"
    try:
        module: Any = importlib.import_module(name)
    except ImportError:  # a provider SDK of its handlers is not installed: the usual case
        module = types.ModuleType(name, "agentrl's stand-in: the flags of agentrl's model")
        module.MODEL_CONFIG_MAPPING = {}
        sys.modules[name] = module
    module.MODEL_CONFIG_MAPPING.setdefault(MODEL_NAME, _Config())
