"""An episode's tokens back into turns: what the model read, what it sampled, what it called.

The rollout's loss mask marks the sampled tokens: each run of them is one assistant turn
(`actors/_episode.play_episode` appends a turn's sampled ids, then the environment's
reply with the chat template's markup, mask 0), and the tokens before it are what the
model read (the prompt, then the tool results). A turn's tool calls are parsed from its
text as the rollout parsed them (`parse_assistant`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.actors._trace_store import EpisodeTrace
from agentrl.environments import ChatFormat, MalformedToolCall, parse_assistant
from agentrl.messages import ToolCall

__all__ = ["Piece", "Turn", "episode_turns"]


@dataclass(frozen=True, slots=True)
class Piece:
    """Sampled tokens shown as one span: one token, or the few a character is split over."""

    text: str
    advantage: float | None
    """The advantage the update gave them (their mean); None for a dropped episode."""
    trained: bool
    """Whether the update trained them (false: dropped, or older than the lag bound)."""
    logprob: float
    """Their rollout logprob (the sum)."""
    version: int
    """The policy version that sampled them."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One assistant turn and what the model read before it."""

    context: str
    """The tokens before the turn, decoded with the template's markup: the prompt for the
    first turn, the environment's reply to the previous turn for the others."""
    context_tokens: int
    pieces: list[Piece]
    versions: list[int]
    """The policy versions that sampled the turn (one, unless the weights changed within)."""
    pool: str | None
    """The sampler pool (None where the turns cannot be matched to the trajectory's pools)."""
    calls: list[ToolCall]
    malformed: str | None
    """Why the turn's tool call could not be read, if it could not."""


def _runs(mask: list[int]) -> list[tuple[int, int, bool]]:
    """Maximal runs ``(start, end, sampled)`` of equal mask values."""
    out: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, bool(mask[start])))
            start = i
    return out


def _pieces(tokenizer: Any, trace: EpisodeTrace, start: int, end: int) -> list[Piece]:
    """The sampled tokens ``start:end`` as spans; a token whose text is an incomplete
    UTF-8 character is joined with the next ones until the character is whole."""
    out: list[Piece] = []
    ids = trace.token_ids
    i = start
    while i < end:
        j = i + 1
        text = tokenizer.decode(ids[i:j])
        while text.endswith("\ufffd") and j < end:
            j += 1
            text = tokenizer.decode(ids[i:j])
        span = range(i, j)
        adv = None
        if trace.advantages is not None:
            adv = sum(trace.advantages[k] for k in span) / len(span)
        out.append(
            Piece(
                text=text,
                advantage=adv,
                trained=trace.trained is not None and any(trace.trained[k] for k in span),
                logprob=sum(trace.logprobs[k] for k in span),
                version=trace.versions[i],
            )
        )
        i = j
    return out


def episode_turns(trace: EpisodeTrace, tokenizer: Any, fmt: ChatFormat) -> tuple[list[Turn], str]:
    """The episode's turns, and the text after its last turn (usually empty)."""
    turns: list[Turn] = []
    context, context_tokens = "", 0
    runs = _runs(trace.loss_mask)
    sampled = sum(1 for *_, s in runs if s)
    pools = trace.pools if len(trace.pools) == sampled else None
    for start, end, is_sampled in runs:
        ids = trace.token_ids[start:end]
        if not is_sampled:
            context, context_tokens = tokenizer.decode(ids), end - start
            continue
        calls: list[ToolCall] = []
        malformed = None
        try:
            calls = list(parse_assistant(fmt.decode_assistant(ids)).tool_calls)
        except MalformedToolCall as exc:
            malformed = str(exc)
        turns.append(
            Turn(
                context=context,
                context_tokens=context_tokens,
                pieces=_pieces(tokenizer, trace, start, end),
                versions=sorted(set(trace.versions[start:end])),
                pool=pools[len(turns)] if pools is not None else None,
                calls=calls,
                malformed=malformed,
            )
        )
        context, context_tokens = "", 0
    return turns, context
