"""configs/corridor_long.yaml end to end: `bmrl train` with a history window of 2 turns, GiGPO and BudgetMix,
shrunk by overrides of turns, rows and steps only. Its buffer holds 3 turns, not a whole 8-turn episode
(351 tokens): episodes longer than 3 turns must run without overflowing, and the learner must train each
played turn's reply once per epoch, as a sample of its own."""

from __future__ import annotations

import json

from bmrl.cli import main
from tests.paths import REPO

SHRINK = ["rollout.max_turns=8", "budget.budgets=[4,8]", "eval.ts=[4,8]", "eval.ks=[1]", "eval.attempts=1",
          "eval.num_tasks=2", "eval.bootstrap=0", "eval.every=0", "train.steps=2", "train.tasks_per_step=2",
          "train.group_size=2", "checkpoint.every=2", "data.train_size=16", "data.test_size=8"]


def test_corridor_long_trains_with_a_history_window(tmp_path, capsys):
    code = main(["train", "--config", str(REPO / "configs" / "corridor_long.yaml"), f"out_dir={tmp_path / 'run'}",
                 *SHRINK, "--no-progress"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["rollout/overflow"] == 0 and r["rollout/turns_used"] > 3  # longer than the buffer's whole history
        assert r["train/num_tokens"] == r["rollout/sampled_tokens"] > 0  # every reply once (one epoch)
        assert r["train/rows_trained_min"] == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["compiles"]["rollout"] == 1 and summary["compiles"]["train_step"] == 1
    assert set(summary["eval"]) == {"4", "8"} and all(0 <= e["pass1"] <= 1 for e in summary["eval"].values())
