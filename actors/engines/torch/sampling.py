"""Per-row token sampling for the engine: greedy or temperature + top-p, with logprobs.

The recorded logprob is taken before top-p truncation (see `sample_tokens`).
Sampling is inverse-CDF with one uniform draw per row from that row's own
generator, so a seeded request draws the same tokens whatever it is batched
with, while the softmax, cumulative sums and searches run for all rows at once.
The generators are CPU generators whatever device the logits are on (one
scalar per row and step crosses to the device), so a seed draws the same
uniforms on every device.
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
    else drawn from ``softmax(logits / T)`` restricted to the top-p nucleus,
    with the logprob taken from the untruncated ``log_softmax(logits / T)``.
    ``generators`` are CPU ``torch.Generator``s (None for greedy rows).
    """
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=logits.dtype)
    scaled = logits / temps.to(logits.device)[:, None]  # [B, V]
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)  # log of the softmax normaliser
    drawn = [i for i, t in enumerate(temperatures) if t > 0]
    if len(drawn) < len(temperatures):
        tokens = logits.argmax(dim=-1)
    else:
        tokens = torch.zeros(len(temperatures), dtype=torch.long, device=logits.device)
    if drawn:
        every = len(drawn) == len(temperatures)
        index = None if every else torch.tensor(drawn, device=logits.device)
        probs = (scaled - lse).exp_() if every else (scaled[index] - lse[index]).exp_()
        cut = [j for j, i in enumerate(drawn) if top_ps[i] < 1]
        if cut:
            rows = torch.tensor(cut, device=logits.device)
            top_p = torch.tensor([top_ps[drawn[j]] for j in cut], dtype=probs.dtype)
            probs[rows] = _nucleus(probs[rows], top_p.to(logits.device))
        cdf = probs.cumsum_(dim=-1)
        uniform = torch.stack(
            [torch.rand((), generator=generators[i], dtype=cdf.dtype) for i in drawn]
        ).to(logits.device)
        # The first position whose cumulative mass exceeds u * total: never a zero-mass token.
        picks = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)[:, 0]
        picks = picks.clamp_(max=logits.shape[-1] - 1)
        if every:
            tokens = picks
        else:
            tokens[index] = picks
    chosen = scaled.gather(1, tokens[:, None]) - lse  # log_softmax(logits / T) at the token
    return tokens.tolist(), chosen[:, 0].tolist()


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor, candidates: int = 1024) -> torch.Tensor:
    """Zero, per row, every token outside the smallest set whose mass reaches ``top_p[row]``.

    The nucleus is looked for among each row's ``candidates`` most likely tokens
    (a partial sort); rows whose candidates do not reach ``top_p`` sort fully.
    """
    k = min(candidates, probs.shape[-1])
    ordered, order = probs.topk(k, dim=-1)
    short = ordered.sum(-1) < top_p
    if bool(short.any()):
        ordered, order = probs.sort(dim=-1, descending=True)
    keep = (ordered.cumsum(-1) - ordered) < top_p[:, None]  # mass before; the first always stays
    return torch.zeros_like(probs).scatter(-1, order, ordered * keep)
