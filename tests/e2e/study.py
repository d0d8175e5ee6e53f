"""The tiny study: `bmrl reproduce` of configs/quickstart.yaml shrunk to seconds (SFT, three RL variants,
evaluation, report): the report tests' run and the 2-process tests' reference (tests/e2e/test_reproduce_report.py)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

CONFIG = "configs/quickstart.yaml"
TINY = ["sft.steps=3", "sft.batch_size=4", "train.steps=2", "train.tasks_per_step=2", "train.group_size=2",
        "eval.num_tasks=4", "eval.attempts=4", "eval.ks=[1,4]", "eval.ts=[4,5,8]",
        "reproduce.small_t=5",  # F1's small T inside the grid, not its smallest: the report must say T=5 throughout
        "eval.probe_states=8",
        "eval.bootstrap=20", "data.train_size=64", "data.test_size=16", "reproduce.variants.budgetmix.budgets=[4,8]",
        # A smaller model than quickstart's (nothing here depends on its size): the study is compile-bound.
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
        "rollout.compact_min_rows=0"]  # 48-row evaluations: no second copy of the turn (tested in rollout/test_engine.py)
# The entropy term gives every RL step a loss (runs that compute differently drift apart); a checkpoint at
# every step leaves the step-1 checkpoint a restart resumes from.
STUDY = [*TINY, "train.entropy_coef=0.01", "checkpoint.every=1", "checkpoint.keep=2"]


def run_tiny_study(out: Path):
    """The study run in this process (one device) into `out`: (out, its config, its stderr lines)."""
    from bmrl.config import load
    from bmrl.reproduce import reproduce

    cfg = load(CONFIG, [f"out_dir={out}", *STUDY])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        reproduce(cfg)
    return out, cfg, err.getvalue().splitlines()
