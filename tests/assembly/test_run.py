"""`bmrl.assembly`: the run's objects are built once from the config, frozen, and passed down by the CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings

import pytest

from bmrl import assembly
from bmrl.cli import main
from bmrl.config import load, make_budget
from tests.paths import ROOT

TINY = ["env.options.length=3", "budget.budgets=[4]", "rollout.max_turns=4", "eval.ts=[2,4]", "rollout.max_len=256"]


def test_run_bundle_is_frozen_and_built_from_the_config(tiny_tokenizer):
    cfg = load(None, TINY + ["eval.temperature=0.5"])
    run = assembly.build_run(cfg, tiny_tokenizer)
    assert run.budget == make_budget(cfg.budget) and run.tokenizer is tiny_tokenizer
    assert (run.rollout.max_len, run.rollout.max_turns) == (256, 4)
    assert run.rollout.sampling.temperature == 1.0 and run.eval_rollout.sampling.temperature == 0.5
    assert run.env.name == "corridor" and run.env.options["length"] == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.budget = None


@pytest.mark.parametrize("command, target", [("train", "bmrl.train.train"), ("sft", "bmrl.sft.run_sft")])
def test_cli_builds_once_and_passes_the_bundle_down(command, target, tmp_path, monkeypatch):
    """The command builds the Run (checking it) before anything is written and hands it to the runner."""
    module, name = target.rsplit(".", 1)
    calls, received = [], []
    real = assembly.build_run

    def counting(cfg, tokenizer=None):
        calls.append(os.path.exists(cfg.out_dir))
        return real(cfg, tokenizer)

    def runner(cfg, **kwargs):
        received.append(kwargs["run"])
        raise SystemExit(0)  # stop here: the run itself is tested elsewhere

    monkeypatch.setattr(assembly, "build_run", counting)
    monkeypatch.setattr(__import__(module, fromlist=[name]), name, runner)
    (tmp_path / "cfg.yaml").write_text("seed: 0\n")
    with warnings.catch_warnings(), pytest.raises(SystemExit):
        warnings.simplefilter("ignore")
        main([command, "--config", str(tmp_path / "cfg.yaml"), f"out_dir={tmp_path / 'out'}", *TINY])
    assert calls == [False]  # built once, before the output directory exists
    assert isinstance(received[0], assembly.Run) and received[0].budget.max_cap == 4


def test_refusal_exit_status_of_the_real_process(tmp_path):
    """One subprocess: `python -m bmrl train` exits 2 with the key and no traceback, writing nothing."""
    (tmp_path / "cfg.yaml").write_text("seed: 0\n")
    repo = ROOT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "bmrl", "train", "--config", "cfg.yaml", "out_dir=out", f"seed={2**80}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "config error: seed:" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]
