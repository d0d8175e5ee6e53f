"""Fault injection on a whole (tiny) training run, in process: a full disk at the last save stops the
run with exit 3 and keeps the previous checkpoint; the newest checkpoints then corrupted three ways
(flipped bytes in the largest array file, a truncated array file, a missing manifest) are moved aside
on resume, which falls back to the newest good one and ends bitwise equal to an uninterrupted run,
with the same summary (tokens_seen, eval_history from step 0) and metrics (no duplicates); resuming
the finished run changes nothing."""

import errno
import json
import os

import pytest
import yaml
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from tests.test_checkpoint_faults import CORRUPTIONS

STEPS = 5


def write_config(tmp_path, steps=STEPS, lr=3e-3, max_nonfinite=5):
    """A tiny corridor run: a 4-row batch (eval reuses the train rollout), one update per step,
    checkpoints every step, evaluations at 0, 2, 4 and the end."""
    cfg = dict(
        seed=3,
        env={"name": "corridor", "options": {"length": 2, "eps": 0.2}},
        budget={"kind": "uniform", "lo": 1, "hi": 3},
        rollout={"max_turns": 12, "max_reply_tokens": 4, "max_len": 192},
        model={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
        train={"steps": steps, "tasks_per_step": 2, "group_size": 2, "epochs": 1, "minibatches": 1,
               "kl_coef": 0.0, "max_nonfinite": max_nonfinite, "optim": {"lr": lr, "warmup_steps": 1}},
        eval={"ts": [3, 4], "ks": [1], "attempts": 1, "num_tasks": 2, "every": 2},
        data={"train_size": 5, "test_size": 4},
        checkpoint={"every": 1, "keep": 10},
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cli(cfg, out):
    from bmrl.cli import main

    return main(["train", "--config", str(cfg), f"out_dir={out}", "--no-progress"])


def _params(out):
    from safetensors.numpy import load_file

    return load_file(os.path.join(out, "policy", "model.safetensors"))


def _records(out):
    """metrics.jsonl without the timing and compile-count fields (they depend on the process: a program
    compiled by an earlier run in the same process is not compiled again)."""
    recs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "compiles/"))} for r in recs]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run."""
    tmp = tmp_path_factory.mktemp("ref")
    assert _cli(write_config(tmp), tmp / "run") == 0
    return tmp / "run"


def test_full_disk_then_corrupt_checkpoints_resume_bitwise(reference, tmp_path, monkeypatch, capsys):
    cfg, out = write_config(tmp_path), tmp_path / "run"
    real = json_checkpoint_handler.JsonCheckpointHandler._save_fn

    def full_at_last_step(self, item, directory):
        if os.path.basename(os.path.dirname(str(directory))).split(".")[0] == str(STEPS):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, item, directory)

    with monkeypatch.context() as m:
        m.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", full_at_last_step)
        assert _cli(cfg, out) == 3
    err = capsys.readouterr().err
    assert f"writing checkpoint step {STEPS}" in err and "no space left on device" in err
    assert f"kept: step {STEPS - 1}" in err and "Traceback" not in err
    ck = out / "checkpoints"
    assert sorted(int(p) for p in os.listdir(ck) if p.isdigit()) == list(range(1, STEPS))
    assert not (out / "summary.json").exists()

    kinds = ["flipped bytes in the largest array file", "truncated largest array file", "missing manifest"]
    for step, kind in zip((4, 3, 2), kinds):
        CORRUPTIONS[kind](str(ck / str(step)))
    assert _cli(cfg, out) == 0
    err = capsys.readouterr().err
    for step in (4, 3, 2):
        assert f"checkpoint {ck / str(step)} is unusable" in err and (ck / f"{step}.corrupt-1").is_dir()

    a, b = _params(reference), _params(out)
    assert a.keys() == b.keys()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a), "resumed params differ from the uninterrupted run"
    ref, got = (json.load(open(d / "summary.json")) for d in (reference, out))
    assert got["resumed_from"] == 1
    for key in ("tokens_seen", "eval_history", "eval_initial", "eval", "skipped_updates"):
        assert got[key] == ref[key], key
    assert list(got["eval_history"]) == ["0", "2", "4", str(STEPS)]
    drop_perf = lambda d: {k: v for k, v in d.items() if not k.startswith("perf/")}
    assert drop_perf(got["final"]) == drop_perf(ref["final"])
    assert _records(out) == _records(reference)  # one record per step and eval, none duplicated

    # Resuming the finished run: a no-op that rewrites nothing.
    before = {n: (out / n).read_bytes() for n in ("summary.json", "metrics.jsonl")}
    assert _cli(cfg, out) == 0
    assert "already finished" in capsys.readouterr().out
    assert {n: (out / n).read_bytes() for n in before} == before
