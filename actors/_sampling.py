"""Per-row token sampling for the engine: greedy or temperature + top-p, with logprobs.

The recorded logprob is taken before top-p truncation (see `sample_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_tokens(
    logits: torch.Tensor,
    *,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """Draw one token per row of ``logits`` ``[B, V]``; return the tokens and their logprobs.

    Row i: greedy when ``temperatures[i] == 0`` (logprob from ``log_softmax(logits)``),
    else multinomial from ``softmax(logits / T)`` restricted to the top-p nucleus,
    with the logprob taken from the untruncated ``log_softmax(logits / T)``.
    """
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=logits.dtype)
    logp = torch.log_softmax(logits / temps.to(logits.device)[:, None], dim=-1)  # [B, V]
    tokens: list[int] = []
    for i, (temp, top_p, gen) in enumerate(zip(temperatures, top_ps, generators, strict=True)):
        if temp == 0:
            tok = int(torch.argmax(logits[i]))
        else:
            probs = logp[i].exp()
            if top_p < 1:
                probs = _nucleus(probs, top_p)
            tok = int(torch.multinomial(probs, 1, generator=gen))
        tokens.append(tok)
    index = torch.tensor(tokens, device=logits.device)[:, None]
    return tokens, logp.gather(1, index)[:, 0].tolist()


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set whose probability mass reaches ``top_p``."""
    ordered, order = probs.sort(descending=True)
    keep = (ordered.cumsum(0) - ordered) < top_p  # mass before the token; the first always stays
    return torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
