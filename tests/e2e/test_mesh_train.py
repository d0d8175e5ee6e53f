"""Every mesh trains like one device: `bmrl train` (the real loop: rollout, GRPO update, checkpoints,
evaluation) on 8 simulated CPU devices for the meshes (fsdp 8 -> resumed as fsdp 4 x tensor 2) and
(data 2, fsdp 2, tensor 2), against the same run on one device. Every sharding axis is covered: the data
axis by the (data 2, fsdp 2, tensor 2) run (a pure data 8 mesh was dropped: it repeated that run's data
sharding at about 35 CPU-seconds of its own compiles), fsdp by all three runs, tensor by two. The runs keep
a history window of 1 turn, so the update trains per-turn samples (B x Tm rows over the mesh) and the
rollout drops and re-prefills turns on every mesh; append-only episodes train on a mesh in
`tests/e2e/test_launch.py` (2 processes, data 2 x fsdp 2).

One subprocess runs every mesh in sequence (XLA_FLAGS=--xla_force_host_platform_device_count=8) while
this process runs the one-device reference. STEPS is 4, not 10, to keep the suite's cost down (each
mesh compiles the rollout and the update afresh; the compiles dominate). Checked per mesh: the same
rollout token counts and successes and the same losses (float tolerance) at every step; the train step
compiled exactly once (XLA backend compiles counted by `jax.monitoring`, not just traces) and the rollout
once; the fsdp 8 run's checkpoint restores onto fsdp 4 x tensor 2 (resharded) and continues identically;
the loop's evaluation, run on the (data 2, fsdp 2, tensor 2) mesh, gives the one-device Pass@(1,T).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.paths import ROOT
from tests.xla import EIGHT_CPU_DEVICES

STEPS = 4
TINY = dict(
    seed=0,
    env={"name": "corridor", "options": {"length": 2, "eps": 0.1}},
    budget={"kind": "mix", "budgets": [1, 2, 3], "probs": [0.3, 0.3, 0.4]},
    rollout={"max_turns": 4, "max_reply_tokens": 4, "max_len": 224, "history_turns": 1},
    model={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2},
    # A random policy never succeeds (GRPO advantages all 0): the entropy bonus gives every step a
    # loss and a gradient, so the runs drift apart if any mesh computes differently.
    train={"steps": STEPS, "tasks_per_step": 4, "group_size": 2, "entropy_coef": 0.05,
           "optim": {"lr": 3e-3, "schedule": "constant"}},
    eval={"ts": [2], "ks": [1], "attempts": 1, "num_tasks": 8, "every": 0},  # 8 rows: the train batch's shape
    data={"train_size": 16, "test_size": 8},
    checkpoint={"every": 2, "keep": 2},
)
# (name, mesh overrides, steps, out_dir name, evaluate): the fsdp8 run stops at step 2; its directory
# then resumes on fsdp 4 x tensor 2 (the checkpoint resharded on restore) up to STEPS. The loop's
# evaluation (initial and final Pass@(1,T), its own compiled program per mesh) runs on the mesh with
# every axis, and must give the one-device numbers; the other two skip it (train(evaluate=False):
# the evaluation draws its own keys, so training is unchanged).
RUNS = [
    ("fsdp8", dict(data=1, fsdp=8, tensor=1), 2, "fsdp", False),
    ("fsdp4_tensor2", dict(data=1, fsdp=4, tensor=2), STEPS, "fsdp", False),
    ("data2_fsdp2_tensor2", dict(data=2, fsdp=2, tensor=2), STEPS, "dft", True),
]


def run_one(out_dir: str, mesh: dict, steps: int, evaluate: bool = True) -> dict:
    """One `bmrl.train.train` run; per-step losses / token counts / successes, compiles, XLA compiles."""
    import collections

    import jax

    from bmrl import config as config_lib
    from bmrl.train import train

    backend = collections.Counter()

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            backend[kw.get("fun_name", "")] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    data = json.loads(json.dumps(TINY))
    data["out_dir"], data["mesh"] = out_dir, mesh
    data["train"]["steps"] = steps
    cfg = config_lib.build(data)
    try:
        summary = train(cfg, progress=False, evaluate=evaluate)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    records = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    steps_rec = [r for r in records if "train/loss" in r and r["step"] > summary["resumed_from"]]  # this run's
    return {
        "steps": [r["step"] for r in steps_rec],
        "loss": [r["train/loss"] for r in steps_rec],
        "tokens": [r["rollout/tokens"] for r in steps_rec],
        "success": [r["rollout/success"] for r in steps_rec],
        "compiles": summary["compiles"],
        "metric_compiles": {k: v for k, v in steps_rec[-1].items() if k.startswith("compiles/")},
        "update_backend_compiles": backend["jit(update)"],
        "rollout_backend_compiles": backend["jit(rollout)"],  # the training rollout (eval has its own)
        "resumed_from": summary["resumed_from"],
        "eval": [summary["eval_initial"], summary["eval"]] if evaluate else None,
        "checkpoints": sorted(os.listdir(os.path.join(out_dir, "checkpoints"))),
    }


def meshes_main(root: str) -> None:
    """The 8-device subprocess: every run of RUNS in sequence; prints one JSON line."""
    out = {name: run_one(os.path.join(root, d), mesh, steps, ev) for name, mesh, steps, d, ev in RUNS}
    print("MESHES " + json.dumps(out))


@pytest.mark.multidevice
@pytest.mark.slow
def test_every_mesh_trains_like_one_device(tmp_path):
    env = dict(os.environ, XLA_FLAGS=EIGHT_CPU_DEVICES, JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(tmp_path / "meshes")], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ref = run_one(str(tmp_path / "one"), dict(data=1, fsdp=1, tensor=1), STEPS)  # overlaps with the subprocess
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("MESHES ")]
    assert proc.returncode == 0 and lines, stderr[-4000:]
    runs = json.loads(lines[0][len("MESHES "):])

    assert ref["update_backend_compiles"] == 1 and ref["compiles"]["train_step"] == 1
    assert len(set(np.round(ref["loss"], 6))) > 1  # the steps changed something
    for name, mesh, steps, _, evaluated in RUNS:
        r = runs[name]
        first = 2 if name == "fsdp4_tensor2" else 0  # resumed at step 2
        assert r["steps"] == list(range(first + 1, steps + 1)), (name, r["steps"])
        assert r["resumed_from"] == first, name
        assert r["tokens"] == ref["tokens"][first:steps], name  # identical rollouts
        assert r["success"] == ref["success"][first:steps], name
        np.testing.assert_allclose(r["loss"], ref["loss"][first:steps], rtol=1e-4, atol=1e-5, err_msg=name)
        # One compile of the train step and of the rollout (one batch shape), counted and real.
        assert r["compiles"]["train_step"] == 1 and r["update_backend_compiles"] == 1, (name, r)
        assert r["compiles"]["rollout"] == 1 and r["rollout_backend_compiles"] == 1, (name, r)
        assert r["metric_compiles"]["compiles/train_step"] == 1, name
        assert r["checkpoints"] == [str(s) for s in range(2, steps + 1, 2)][-2:], name
        if evaluated:  # the loop's evaluation on the mesh: the one-device Pass@(1,T), before and after
            assert r["eval"] == ref["eval"], (name, r["eval"], ref["eval"])
    assert any(ev for *_, ev in RUNS)


if __name__ == "__main__":
    meshes_main(sys.argv[1])
