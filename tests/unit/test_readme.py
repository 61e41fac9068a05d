"""The README stays true to the code: its links, its commands' flags, its example configs.

Cheap checks, no run: every relative link (and its `#anchor`) of README.md points to a file
(and a heading) that exists; every `--flag` of an `agentrl`, `agentrl-supervisor`,
`agentrl-env` or `agentrl-env-worker` command in a fenced code block or an inline code span
is an option of that subcommand's argparse parser; every `examples/*.yaml` it names loads
with `load_config`. A renamed flag, a moved doc or a deleted example fails here.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from agentrl.ops.cli import agentrl as agentrl_cli
from agentrl.ops.cli import agentrl_env, agentrl_supervisor
from agentrl.ops.config.load import load_config

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_PARSERS = {
    "agentrl": agentrl_cli._parser,
    "agentrl-supervisor": agentrl_supervisor._parser,
    "agentrl-env": agentrl_env._parser,
}
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_EXAMPLE = re.compile(r"examples/[\w./-]+?\.yaml")
_OPERATORS = {"|", "||", "&", "&&", ";", "(", ")"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError(f"{parser.prog} has no subcommands")


def _options() -> dict[tuple[str, str], set[str]]:
    """(command, subcommand) -> the option strings its parser accepts."""
    out = {}
    for command, build in _PARSERS.items():
        for name, sub in _subcommands(build()).items():
            out[command, name] = set(sub._option_string_actions)
    out["agentrl-env-worker", ""] = out["agentrl-env", "worker"]
    return out


def _code(text: str) -> list[str]:
    """The command lines of `text`: fenced blocks (continuation lines joined) and inline spans."""
    lines = []
    for block in _FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    outside = _FENCE.sub("", text)
    lines += [span for span in _INLINE.findall(outside) if span.split()[0] in _COMMANDS]
    return lines


_COMMANDS = {*_PARSERS, "agentrl-env-worker"}


def flag_problems(text: str) -> list[str]:
    """Each flag of an agentrl command in `text`'s code that its subcommand does not take."""
    options = _options()
    problems = []
    for line in _code(text):
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError as exc:  # an unbalanced quote: not a command line
            problems.append(f"cannot split {line!r}: {exc}")
            continue
        start = True
        for i, token in enumerate(tokens):
            if token in _OPERATORS:
                start = True
                continue
            if not (start and token in _COMMANDS):
                start = False
                continue
            start = False
            if token == "agentrl-env-worker":
                key, args = (token, ""), tokens[i + 1 :]
            elif i + 1 < len(tokens) and (token, tokens[i + 1]) in options:
                key, args = (token, tokens[i + 1]), tokens[i + 2 :]
            else:
                problems.append(f"{token}: no such subcommand in {line!r}")
                continue
            for arg in args:
                if arg in _OPERATORS:
                    break
                flag = arg.strip("[]").split("=", 1)[0]
                if flag.startswith("--") and flag not in options[key]:
                    problems.append(f"{' '.join(key).strip()}: no option {flag} (in {line!r})")
    return problems


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def link_problems(path: Path) -> list[str]:
    """Each relative link of the markdown file `path` whose file or `#anchor` does not exist."""
    problems = []
    for target in _LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            problems.append(f"{path.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", _FENCE.sub("", dest.read_text()), re.M)
            if anchor not in {_slug(h) for h in headings}:
                problems.append(f"{path.name}: {target}: no such heading in {file or path.name}")
    return problems


def test_every_relative_link_of_the_readme_and_its_new_docs_points_to_a_file_and_heading():
    docs = [README, ROOT / "docs" / "running.md", ROOT / "docs" / "gpus.md"]
    assert [p for doc in docs for p in link_problems(doc)] == []


def test_every_flag_in_the_readme_commands_is_an_option_of_that_subcommand():
    text = README.read_text()
    assert "agentrl-supervisor start --config examples/local.yaml" in text
    assert flag_problems(text) == []


def test_a_renamed_flag_or_subcommand_is_caught():
    text = (
        "```bash\n"
        "agentrl-supervisor start --config examples/local.yaml --max-step 3\n"
        'agentrl eval --checkpoint "$(ls -d runs/x/v* | tail -1)" --tasks calculator \\\n'
        "    --task-opt calculator.seed=1\n"
        "agentrl-env-worker --task os --run demo --capacity 8 --cap 2\n"
        "```\n"
        "and inline `agentrl evaluate --tasks db`.\n"
    )
    problems = flag_problems(text)
    assert len(problems) == 4, problems
    assert "start: no option --max-step" in problems[0]
    assert "eval: no option --task-opt" in problems[1]
    assert "agentrl-env-worker: no option --cap" in problems[2]
    assert "agentrl: no such subcommand" in problems[3]


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## A heading: with `code`\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#a-heading-with-code) [gone](missing.md) [bad](other.md#nope) "
        "[web](https://example.org/x)\n"
    )
    assert link_problems(doc) == [
        "doc.md: missing.md: no such file",
        "doc.md: other.md#nope: no such heading in other.md",
    ]


@pytest.mark.parametrize("example", sorted(set(_EXAMPLE.findall(README.read_text()))))
def test_every_example_config_the_readme_names_loads(example):
    load_config(ROOT / example)
