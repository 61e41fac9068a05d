"""`agentrl compare`: paired comparison of two evaluations of the same instances."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentrl.ops.cli.agentrl import main
from agentrl.ops.eval.compare import CompareError, compare_reports


def report(tasks: dict[str, list[int]], runs: int = 1, options=None) -> dict:
    return {
        "checkpoint": "x",
        "tasks": {
            name: {
                "task": name,
                "options": (options or {}).get(name, {"split": "test"}),
                "runs": runs,
                "episodes": len(solved),
                "solved_per_instance": solved,
            }
            for name, solved in tasks.items()
        },
    }


def test_hand_values_and_a_paired_interval_narrower_than_an_unpaired_one():
    # db: 10 instances, 2 runs; before solves instances 0-5 in both runs, after adds 6 and
    # half of 7 -> per-instance after - before = (0 x6, 1, 0.5, 0, 0): Δ = 1.5 / 10 = 0.15
    before = report({"db": [2] * 6 + [0] * 4, "os": [1, 0, 1, 0]}, runs=2)
    after = report({"db": [2] * 6 + [2, 1, 0, 0], "os": [1, 0, 1, 0]}, runs=2)
    got = compare_reports(before, after, resamples=4000)
    db, os_ = got.tasks
    assert (db.task, db.instances, db.before, db.after) == ("db", 10, 0.6, 0.75)
    assert db.delta == pytest.approx(0.15)
    assert os_.delta == 0.0 and os_.low == os_.high == 0.0  # nothing changed: no width
    # mean over tasks: before (0.6 + 0.25) / 2 = 0.425, after (0.75 + 0.25) / 2 = 0.5
    assert got.mean.before == pytest.approx(0.425) and got.mean.after == pytest.approx(0.5)
    assert got.mean.delta == pytest.approx(0.075)
    assert 0.0 <= db.low < db.delta < db.high <= 0.5  # draws of 10 differences in {0, .5, 1}
    # Unpaired, the instances' own spread (solved 0 or 1, before and after) enters the width.
    rng = np.random.default_rng(0)
    b = np.array([1.0] * 6 + [0.0] * 4)
    a = np.array([1.0] * 7 + [0.5, 0.0, 0.0])
    pick = lambda: rng.integers(0, 10, size=(4000, 10))  # noqa: E731
    unpaired = a[pick()].mean(axis=1) - b[pick()].mean(axis=1)
    low, high = np.percentile(unpaired, [2.5, 97.5])
    assert db.high - db.low < (high - low) / 2


def test_the_interval_covers_zero_when_changes_cancel():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, 200).tolist()
    flipped = [1 - s if i % 2 == 0 else s for i, s in enumerate(base)]  # ~half up, half down
    got = compare_reports(report({"kg": base}), report({"kg": flipped}), resamples=2000)
    (kg,) = got.tasks
    assert kg.low < 0 < kg.high
    assert abs(kg.delta) < 0.1


def test_other_options_or_instances_are_refused_with_the_reasons():
    before = report({"db": [1, 0], "os": [1]})
    after = report({"db": [1, 0, 1], "os": [0]}, options={"os": {"split": "train"}})
    with pytest.raises(CompareError) as info:
        compare_reports(before, after)
    text = str(info.value)
    assert "db: 2 instances against 3" in text and "os: evaluated with other options" in text
    with pytest.raises(CompareError, match="share no task"):
        compare_reports(report({"db": [1]}), report({"os": [1]}))


def test_the_command_prints_the_table_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report({"db": [1, 0, 0, 0]})))
    b.write_text(json.dumps(report({"db": [1, 1, 1, 0]})))
    argv = ["compare", str(a), str(b), "--resamples", "500", "--out", str(tmp_path / "t")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| db | 4 | 0.250 | 0.750 | +0.500 |" in out and "| **mean** |" in out
    assert (tmp_path / "t").read_text() == out
    (tmp_path / "bad.json").write_text("{nope")
    assert main(["compare", str(a), str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read an eval result" in err
