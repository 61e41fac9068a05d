"""What the ``alfworld`` task says to the model and how it reads actions: AgentBench's protocol.

Every text here follows AgentBench's ``src/server/tasks/alfworld/task.py`` and
``utils.py`` (the constants cite the lines):

- the system message is AgentBench's task instruction (`SYSTEM_PROMPT`); the
  generated levels 0 and 1 get a shorter one in the same terms (`LEVEL_PROMPT`).
  AgentBench loads an in-context example file (``prompts_path``) but its
  episode loop never uses it, so no example is shown;
- the first user message is ``Here is your task. `` + the game's opening text
  without its banner, its paragraphs joined by one newline (`opening`);
- every reply (the opening too) ends with the admissible commands of the new
  state, ``" AVAILABLE ACTIONS: " + "\\n".join(commands) + "\\n"``
  (`available_actions`);
- an observation that starts ``You arrive at loc N. `` loses that prefix
  (`observation`);
- the action text is lower-cased and cut at its first newline; when it is not
  an admissible command it becomes the admissible command with the highest
  sentence BLEU against it (`sentence_bleu`, NLTK's definition with smoothing
  method 4), if that BLEU is above 0.01 (`match_action`).
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

__all__ = [
    "LEVEL_PROMPT",
    "NO_TOOL_CALL",
    "NO_VALID_CALL",
    "REPEATS",
    "SYSTEM_PROMPT",
    "TOOLS",
    "available_actions",
    "match_action",
    "observation",
    "opening",
    "sentence_bleu",
]

SYSTEM_PROMPT = (
    "Interact with a household to solve a task. Imagine you are an intelligent agent in a "
    "household environment and your target is to perform actions to complete) the task goal. "
    "At the beginning of your interactions, you will be given the detailed description of the "
    "current environment and your goal to accomplish. A tool will be provided for you to use "
    "to submit the action you want to take. This tool is the only tool you should and must "
    "take in order to operate any action in the environment. The way you perform action is to "
    "place the action chosen by you in the arguments field of your tool call. For each of your "
    "turn, you will be given a list of actions which you can choose one to perform in this "
    'turn. The action you would like to take should be offered in this format: "the name of '
    'your next action", and you should fill it in the argument field of your tool call. Note '
    "that you should always call a tool to operate an action from the given choices. After "
    "your each turn, the environment will give you immediate feedback based on which you plan "
    'your next few steps. if the environment output "Nothing happened", that means the '
    "previous action is invalid and you should try more options.\n"
    " Reminder:\n"
    "1. the action must be chosen from the given available actions. Any actions except "
    "provided available actions will be regarded as illegal.\n"
    "2. Always call the tool to hand in your next action and think when necessary."
)
"""AgentBench's task instruction, verbatim with its typos (alfworld/task.py:110-114)."""

LEVEL_PROMPT = (
    "Interact with a household to solve a task. At the beginning you will be given the room "
    "and your goal. Each turn, call the take_action tool with one action chosen from the "
    "AVAILABLE ACTIONS listed after every observation. If the environment outputs "
    '"Nothing happens.", the action was invalid and you should try another one.'
)
"""The shorter instruction of the generated levels 0 and 1 (same tool, same replies)."""

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "take_action",
            "description": "Take an action.",
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {
                        "type": "string",
                        "description": "The action you would like to take",
                    }
                },
                "required": ["action"],
                "additionalProperties": False,
            },
        },
    }
]
"""AgentBench's one tool (configs/tasks/alfworld.yaml:11-25)."""

NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
"""The user reply to a message without a tool call (AgentBench alfworld/task.py:160)."""

NO_VALID_CALL = "No valid tool calls found. Please call a tool instead."
"""The user reply to a call whose arguments cannot be read (AgentBench alfworld/task.py:179)."""

REPEATS = 3
"""The same action this many times in a row (after more than this many actions) fails the
episode (AgentBench alfworld/task.py:208-213)."""

TASK_INTRO = "Here is your task. "
"""The opening user message's prefix (AgentBench alfworld/task.py:141)."""

ARRIVAL = "You arrive at loc "
"""The prefix `observation` removes (AgentBench alfworld/utils.py:16-19)."""

MATCH_FLOOR = 0.01
"""A free-text action becomes the best-matching command only above this BLEU
(AgentBench alfworld/utils.py:21, ``limit=0.01``)."""

BLEU_WEIGHTS = (0.25, 0.25, 0.25, 0.25)
"""NLTK's default ``sentence_bleu`` weights: uniform over 1- to 4-grams."""

SMOOTHING_K = 5
"""NLTK's ``SmoothingFunction(k=5)`` default, used by its method 4."""


def available_actions(commands: list[str]) -> str:
    """The suffix of every reply (AgentBench alfworld/task.py:125-128)."""
    return " AVAILABLE ACTIONS: " + "\n".join(commands) + "\n"


def opening(feedback: str, commands: list[str]) -> str:
    """The first user message from the game's opening text (AgentBench alfworld/task.py:134,
    141): the banner paragraph dropped, the other paragraphs joined by one newline."""
    body = "\n".join(feedback.split("\n\n")[1:])
    return TASK_INTRO + body + available_actions(commands)


def observation(text: str) -> str:
    """A game observation as AgentBench shows it: without ``You arrive at loc N. ``."""
    if text.startswith(ARRIVAL):
        return text[text.find(". ") + 2 :]
    return text


def _ngrams(tokens: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def sentence_bleu(reference: str, candidate: str) -> float:
    """BLEU of ``candidate`` against one ``reference``, both split on whitespace, with
    uniform weights over 1- to 4-grams and Chen & Cherry's smoothing method 4, as NLTK's
    ``sentence_bleu(..., smoothing_function=SmoothingFunction().method4)`` computes it
    (NLTK 3.8-3.10: a precision still zero after smoothing, as for one-word candidates,
    drops out of the geometric mean)."""
    ref, hyp = reference.split(), candidate.split()
    precisions: list[Fraction] = []
    for n in range(1, len(BLEU_WEIGHTS) + 1):
        counts, limits = _ngrams(hyp, n), _ngrams(ref, n)
        clipped = sum(min(c, limits[gram]) for gram, c in counts.items())
        precisions.append(Fraction(clipped, max(1, sum(counts.values()))))
    if precisions[0].numerator == 0:
        return 0.0
    hyp_len, ref_len = len(hyp), len(ref)
    smoothed: list[float | Fraction] = list(precisions)
    times = 1
    for n, p in enumerate(precisions, start=1):
        if p.numerator == 0 and hyp_len > 1:
            # method 4: 1 / (2^times * k / ln(len)) over the n-gram count
            smoothed[n - 1] = (
                1 / (2**times * SMOOTHING_K / math.log(hyp_len)) / max(1, hyp_len - n + 1)
            )
            times += 1
    penalty = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    total = math.fsum(w * math.log(p) for w, p in zip(BLEU_WEIGHTS, smoothed, strict=True) if p > 0)
    return penalty * math.exp(total)


def match_action(text: str, choices: list[str]) -> str:
    """The command AgentBench plays for the action ``text`` (alfworld/utils.py:21-48):
    lower-cased, cut at the first newline; kept when admissible or when no choice scores
    above `MATCH_FLOOR`, else the first choice with the highest `sentence_bleu`."""
    action = text.strip().lower().split("\n")[0]
    if not choices or action in choices:
        return action
    scores = [sentence_bleu(choice, action) for choice in choices]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return choices[best] if scores[best] > MATCH_FLOOR else action
