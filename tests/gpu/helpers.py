"""Batches for the GPU suite: the engine's generations as trajectories, and synthetic ones."""

from __future__ import annotations

import torch

from agentrl.actors.engines.base import Generation
from agentrl.trainer import TrainBatch, build_batch
from tests.unit.records import trajectory

PROMPTS = [
    "What is 17 * 23? Answer with the number.",
    "Name three prime numbers above 50.",
    "Write one sentence about the sea.",
    "List the files a Linux shell shows with ls -a in an empty directory.",
    "Translate 'good morning' into French.",
    "What is the capital of Canada?",
    "Count from 5 down to 1.",
    "Give a SQL query that counts the rows of a table named users.",
]


def chat_prompts(tokenizer) -> list[list[int]]:
    """The token ids of each prompt as a one-message chat, ready for the assistant."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        for text in PROMPTS
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def generations_batch(
    prompts: list[list[int]], generations: list[Generation], pad_id: int
) -> TrainBatch:
    """Prompt + sampled tokens per row, the sampled ones masked in with their recorded
    logprobs and versions (rewards alternate 1/0 in groups of two)."""
    rows = []
    for i, (prompt, gen) in enumerate(zip(prompts, generations, strict=True)):
        mask = [0] * len(prompt) + [1] * len(gen.token_ids)
        rows.append(
            trajectory(
                mask,
                group=f"g{i // 2}",
                reward=float(i % 2),
                episode_id=f"e{i}",
                token_ids=list(prompt) + list(gen.token_ids),
                logprobs=[0.0] * len(prompt) + list(gen.logprobs),
                versions=[-1] * len(prompt) + [gen.version] * len(gen.token_ids),
            )
        )
    return build_batch(rows, pad_id)


def synthetic_batch(
    vocab: int, *, episodes: int = 8, tokens: int = 160, seed: int = 0, copies: bool = False
):
    """``episodes`` random-token rows, the last third of each trained, in groups of four
    with reward spread, recorded logprobs -2 (so importance weights are not all 1). With
    ``copies``, members 2 and 3 of each group copy members 0 and 1 token for token."""
    gen = torch.Generator().manual_seed(seed)
    trained = tokens // 3
    mask = [0] * (tokens - trained) + [1] * trained
    ids = [torch.randint(1, vocab, (tokens,), generator=gen).tolist() for _ in range(episodes)]
    rows = [
        trajectory(
            mask,
            group=f"g{i // 4}",
            reward=float(i % 2),
            logprob=-2.0,
            episode_id=f"s{seed}-{i}",
            token_ids=ids[i - 2 if copies and i % 4 >= 2 else i],
            group_size=4,
        )
        for i in range(episodes)
    ]
    return build_batch(rows, 0)


def logprob_gap(learner_logp: torch.Tensor, batch: TrainBatch) -> tuple[float, float, int]:
    """Mean and max |learner - recorded| logprob over the trained tokens, and their count."""
    mask = batch.loss_mask.bool()
    gap = (learner_logp.float() - batch.old_logprobs.float()).abs()[mask]
    return float(gap.mean()), float(gap.max()), int(mask.sum())


def relative_difference(a: dict, b: dict, base: dict) -> float:
    """||a - b|| / ||a - base|| over every tensor: how far two updates of ``base`` differ,
    relative to the size of the update."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    den = sum(float((a[k].double() - base[k].double()).pow(2).sum()) for k in a)
    return (num / den) ** 0.5 if den else float("inf")


def hf_weights(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(path)))
    return state
