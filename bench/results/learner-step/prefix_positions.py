"""Positions a shared-prompt update computes for a run's trained groups: the prompt once per
micro-batch chunk (the learner before aac076a) against once per group (since).

    python bench/results/learner-step/prefix_positions.py \
        bench/results/rl60-full-s2-60min/trace.sqlite [BUDGET]

Groups are chunked as `group_micro_batches` does (rows by length, longest first; a chunk is
the prompt plus its rows padded to its longest, within ``BUDGET`` positions, default 2,048);
a chunk of one row ran alone, its whole length, in the per-chunk scheme.
"""

from __future__ import annotations

import collections
import sys

from agentrl.actors._trace_store import EpisodeFilter, TraceReader


def chunks(lengths: list[int], shared: int, budget: int) -> list[list[int]]:
    out: list[list[int]] = []
    current: list[int] = []
    for length in sorted(lengths, reverse=True):
        longest = current[0] if current else length
        if current and shared + (len(current) + 1) * (longest - shared) > budget:
            out.append(current)
            current = []
        current.append(length)
    return [*out, current]


def main() -> None:
    reader = TraceReader(sys.argv[1])
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    groups: dict[str, list[tuple[str, list[int]]]] = collections.defaultdict(list)
    for summary in reader.episodes(EpisodeFilter(), limit=100_000):
        trace = reader.episode(summary.episode_id)
        if trace.advantages is not None:  # trained groups only
            groups[summary.group_id].append((summary.task, trace.token_ids))
    totals = collections.Counter()
    per_task: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for rows in groups.values():
        ids = [tokens for _, tokens in rows]
        shared = 0
        while all(len(x) > shared for x in ids) and len({x[shared] for x in ids}) == 1:
            shared += 1
        parts = chunks([len(x) for x in ids], shared, budget)
        per_chunk = sum(c[0] if len(c) == 1 else shared + len(c) * (c[0] - shared) for c in parts)
        once = shared + sum(len(c) * (c[0] - shared) for c in parts)
        for counter in (totals, per_task[rows[0][0]]):
            counter.update(
                groups=1, chunks=len(parts), per_chunk=per_chunk, once=once, rows=sum(map(len, ids))
            )
    print(
        f"{totals['groups']} trained groups: {totals['rows']} positions per row, "
        f"{totals['per_chunk']} with the prompt once per chunk, {totals['once']} once per "
        f"group ({totals['once'] / totals['per_chunk']:.3f} of per chunk)"
    )
    for task, c in sorted(per_task.items()):
        print(
            f"  {task}: {c['groups']} groups, {c['chunks'] / c['groups']:.1f} chunks per group, "
            f"once / per chunk {c['once'] / c['per_chunk']:.3f}"
        )


if __name__ == "__main__":
    main()
