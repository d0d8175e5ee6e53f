"""Checkpoints: orbax round trip, keep-last-N, no nan, interrupted saves ignored, and the
kill-and-resume guarantee: a `bmrl train` subprocess SIGKILLed while it writes a checkpoint and
resumed ends with bitwise-identical parameters, and the same summary (tokens, evaluations from step
0), as an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from bmrl.checkpoint import CheckpointNonFinite, Checkpointer, key_data


def _state(x=1.0):
    return {"params": {"w": jnp.full((3, 2), x, jnp.float32), "b": jnp.arange(2, dtype=jnp.int32)},
            "opt_state": (jnp.zeros((3, 2)), jnp.int32(4)), "key": key_data(jax.random.key(7))}


def test_roundtrip_keep_last_and_refuse_nan(tmp_path):
    ck = Checkpointer(tmp_path / "ck", keep=2)
    for step in (2, 4, 6):
        ck.save(step, _state(step), {"data_position": step * 3, "config": {"seed": 0}})
    ck.wait()
    assert ck.all_steps() == [4, 6] and ck.latest_step() == 6
    state, meta = ck.restore_latest(_state(0.0))
    assert meta["data_position"] == 18 and meta["step"] == 6 and meta["config"] == {"seed": 0}
    np.testing.assert_array_equal(np.asarray(state["params"]["w"]), np.full((3, 2), 6.0, np.float32))
    assert np.asarray(state["key"]).dtype == np.uint32
    with pytest.raises(CheckpointNonFinite, match="nan or inf"):
        ck.save(8, _state(float("nan")), {"data_position": 0})
    ck.close()


def test_interrupted_save_is_ignored(tmp_path):
    """A temporary directory left by a save killed mid-write is neither restored nor fatal."""
    ck = Checkpointer(tmp_path / "ck", keep=3)
    ck.save(2, _state(2.0), {"data_position": 6})
    ck.close()
    junk = tmp_path / "ck" / "4.orbax-checkpoint-tmp-1234567"
    (junk / "state").mkdir(parents=True)
    (junk / "state" / "partial").write_bytes(b"\x00" * 10)
    ck = Checkpointer(tmp_path / "ck", keep=3)
    assert ck.latest_step() == 2
    state, meta = ck.restore_latest(_state(0.0))
    assert meta["step"] == 2 and float(state["params"]["w"][0, 0]) == 2.0
    ck.close()


CFG = dict(
    seed=3,
    env={"name": "corridor", "options": {"length": 2, "eps": 0.2}},
    budget={"kind": "uniform", "lo": 1, "hi": 3},
    rollout={"max_turns": 12, "max_reply_tokens": 4, "max_len": 192},  # caps stay <= 3
    model={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
    train={"steps": 6, "tasks_per_step": 2, "group_size": 2, "epochs": 2, "minibatches": 2,
           "kl_coef": 0.05, "optim": {"lr": 3e-3, "warmup_steps": 2}},
    eval={"ts": [3, 4], "ks": [1], "attempts": 1, "num_tasks": 2, "every": 3},  # the train batch's shape
    data={"train_size": 5, "test_size": 4},  # 5 train tasks: the data stream wraps mid-run
    checkpoint={"every": 2, "keep": 2},
)


def _launch(cfg_path, out_dir):
    env = dict(os.environ, CI="true", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "bmrl", "train", "--config", str(cfg_path), f"out_dir={out_dir}", "--no-progress"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _params(out_dir):
    from safetensors.numpy import load_file

    return load_file(os.path.join(out_dir, "policy", "model.safetensors"))


def test_sigkill_and_resume_is_bitwise_identical(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(CFG))
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"

    # The interrupted run alone first: it compiles every program of the run (rollout, update, evaluation)
    # into the session's persistent compile cache (BMRL_COMPILE_CACHE, inherited), so the reference and
    # the resumed run, started side by side after the kill, load them instead of compiling them again.
    victim = _launch(cfg_path, run_dir)
    ckdir = run_dir / "checkpoints"
    deadline = time.time() + 600  # generous: the machine may be shared
    found = during_save = False
    while not found and time.time() < deadline and victim.poll() is None:
        names = os.listdir(ckdir) if ckdir.is_dir() else []
        done = [int(n) for n in names if n.isdigit()]
        during_save = bool(done) and any("tmp" in n for n in names)  # writing the 2nd+ step: kill mid-save
        found = during_save or any(d >= 4 for d in done)
        time.sleep(0.002)
    assert found and victim.poll() is None, "no checkpoint before the end:\n" + (victim.stdout.read() if victim.poll() is not None else "")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()
    killed_at = sorted(int(p.name) for p in ckdir.iterdir() if p.name.isdigit())
    assert killed_at and max(killed_at) < CFG["train"]["steps"]
    print(f"killed {'during a save' if during_save else 'after a save'}; complete checkpoints: {killed_at}")

    ref = _launch(cfg_path, ref_dir)
    resumed = _launch(cfg_path, run_dir)
    out_resumed, _ = resumed.communicate(timeout=300)
    out_ref, _ = ref.communicate(timeout=300)
    assert ref.returncode == 0, out_ref
    assert resumed.returncode == 0, out_resumed
    assert "resumed from" in out_resumed and "at step" in out_resumed

    a, b = _params(ref_dir), _params(run_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), f"{name} differs after kill-and-resume"
    # The metrics file reads as one run: one train record per step.
    import json

    steps = [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")]
    train_steps = [s for s, line in zip(steps, open(run_dir / "metrics.jsonl")) if "train/loss" in line]
    assert train_steps == list(range(1, CFG["train"]["steps"] + 1))
    # The summary counts every step's tokens and keeps every evaluation, from step 0.
    ref_sum, run_sum = (json.load(open(d / "summary.json")) for d in (ref_dir, run_dir))
    for key in ("tokens_seen", "eval_history", "eval_initial", "eval"):
        assert run_sum[key] == ref_sum[key], key
    assert list(run_sum["eval_history"]) == ["0", "3", "6"]
