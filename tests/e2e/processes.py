"""Helpers of the end-to-end tests that run `bmrl` in subprocesses (1 process or `bmrl launch --processes N`)
and compare their outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.paths import ROOT
from tests.xla import cpu_devices

TIMEOUT_S = 600  # a hang guard; the 2-process study takes about 2 minutes on an idle 2-core machine


def env_of(devices: int | None) -> dict[str, str]:
    """This process's environment for a `bmrl` child: no launcher variables, the repo importable, and with
    `devices` that many simulated CPU devices (the suite's XLA flags)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BMRL_COORDINATOR", "BMRL_NUM_PROCESSES",
                                                                     "BMRL_PROCESS_ID", "BMRL_DISTRIBUTED"))}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), CI="1")
    if devices:
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_devices(devices))
    return env


def start(args: list[str], log_path, devices: int | None) -> subprocess.Popen:
    """`python -m bmrl *args` in the background, its output to `log_path`."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "bmrl", *args], env=env_of(devices), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    return proc


def finish(proc: subprocess.Popen, log_path, what: str) -> None:
    """Wait for `proc` (at most TIMEOUT_S); fail with the log's tail unless it exited 0."""
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{what} did not finish within {TIMEOUT_S} s:\n{open(log_path).read()[-4000:]}")
    assert code == 0, f"{what} exited {code}:\n{open(log_path).read()[-4000:]}"


def read_run(out) -> dict:
    """A training run's summary, metric records, per-step losses and evaluations, from its out_dir."""
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return {"summary": json.load(open(os.path.join(out, "summary.json"))), "records": records,
            "losses": [r["train/loss"] for r in records if "train/loss" in r],
            "evals": {(r["step"], k): v for r in records for k, v in r.items() if k.startswith(("eval/", "val/"))}}


def assert_same_run(got: dict, ref: dict, evals: bool = True) -> None:
    """Same per-step losses, final train/rollout metrics and counts; with `evals`, the same evaluations."""
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-4, atol=1e-6)
    g, r = got["summary"], ref["summary"]
    if evals:
        assert got["evals"].keys() == ref["evals"].keys()
        np.testing.assert_allclose([got["evals"][k] for k in ref["evals"]], list(ref["evals"].values()), atol=1e-6)
        for key in ("eval", "eval_initial", "eval_history"):
            assert g[key] == r[key], key
    for key in ("steps", "tokens_seen", "skipped_updates"):
        assert g[key] == r[key], key
    for key, value in r["final"].items():
        if key.startswith(("train/", "rollout/")) and value is not None:
            np.testing.assert_allclose(g["final"][key], value, rtol=1e-4, atol=1e-6, err_msg=key)


def assert_close_tree(got, want, path: str = "") -> None:
    """Nested JSON values equal: the same keys and strings, numbers within float tolerance."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for key in want:
            assert_close_tree(got[key], want[key], f"{path}/{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close_tree(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=path)
    else:
        assert got == want, path
