"""Multi-host end to end: `bmrl launch --processes 2` runs the study like one process, resumes and reshards.

The tiny study (`tests.e2e.study`: SFT, three RL variants with checkpoints at every step, evaluation,
report) is the reference, run once per session in the test process on one device (shared with
tests/e2e/test_reproduce_report.py). `bmrl launch --processes 2 --cpu-devices 2 -- reproduce ...` runs it
as 2 processes with 2 devices each, on mesh data 2 x fsdp 2 (the data axis across the processes): SFT and
RL losses, exported weights, evaluation results episode by episode, the findings and each stage's summary
must equal the reference's within float tolerance, with one set of outputs written by process 0.
`bmrl eval` of its BudgetMix policy runs on 2 processes and on 1 (the same results). One RL stage of the
2-process study is then restarted from its step-1 checkpoint with 1 process x 4 devices or 2 processes
again (orbax reshards it onto the new process layout): it must end where the reference stage ends. A
2-process `bmrl train` with one process killed, and a Python env's rows split across processes, have
tests of their own. The launcher's own contract (stop the others when one dies, its exit status) is
checked on plain Python children, without JAX.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.paths import ROOT
from tests.xla import cpu_devices
from tests.e2e.study import CONFIG, GROUP, STUDY

pytestmark = pytest.mark.xdist_group(GROUP)  # shares the tiny study with test_reproduce_report.py

TIMEOUT_S = 600  # a hang guard; the 2-process study takes about 2 minutes on an idle 2-core machine
VARIANTS = ("fixed_long", "fixed_short", "budgetmix")

# A `bmrl train` run for the kill test (it never finishes: one process is killed after its first evaluation).
TRAIN_CONFIG = """\
seed: 0
model: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
env: {name: corridor, options: {length: 3, eps: 0.1}, show_budget: false}
budget: {kind: fixed, budgets: [6]}
rollout: {max_turns: 6, max_reply_tokens: 6, max_len: 256, temperature: 1.0}
train: {steps: 40, tasks_per_step: 2, group_size: 4, entropy_coef: 0.01, optim: {lr: 3.0e-3, warmup_steps: 0}}
eval: {ts: [3, 6], ks: [1], attempts: 1, num_tasks: 8, every: 2, bootstrap: 0}
data: {train_size: 64, test_size: 16}
checkpoint: {every: 2, keep: 2}
mesh: {data: 2, fsdp: 2}
"""


def _env(devices: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BMRL_COORDINATOR", "BMRL_NUM_PROCESSES",
                                                                     "BMRL_PROCESS_ID", "BMRL_DISTRIBUTED"))}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), CI="1")
    if devices:
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_devices(devices))
    return env


def _start(args: list[str], log_path, devices: int | None) -> subprocess.Popen:
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "bmrl", *args], env=_env(devices), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    return proc


def _finish(proc: subprocess.Popen, log_path, what: str) -> None:
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{what} did not finish within {TIMEOUT_S} s:\n{open(log_path).read()[-4000:]}")
    assert code == 0, f"{what} exited {code}:\n{open(log_path).read()[-4000:]}"


def _read(out) -> dict:
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return {"summary": json.load(open(os.path.join(out, "summary.json"))), "records": records,
            "losses": [r["train/loss"] for r in records if "train/loss" in r],
            "evals": {(r["step"], k): v for r in records for k, v in r.items() if k.startswith(("eval/", "val/"))}}


@pytest.fixture(scope="module")
def study(tiny_study, tmp_path_factory):
    """The tiny study on 2 processes x 2 devices, beside the 1-device reference (`tiny_study`)."""
    tmp = tmp_path_factory.mktemp("multihost")
    multi_out, logs = tmp / "multi", tmp / "logs"
    multi = _start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(logs), "--", "reproduce",
                    "--config", CONFIG, *STUDY, "mesh.data=2", "mesh.fsdp=2", f"out_dir={multi_out}"],
                   tmp / "multi.log", None)
    _finish(multi, tmp / "multi.log", "bmrl launch --processes 2 reproduce")
    return {"tmp": tmp, "ref": tiny_study[0], "multi": multi_out, "logs": logs}


def _assert_same_run(got: dict, ref: dict, evals: bool = True) -> None:
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


def _assert_close_tree(got, want, path: str = "") -> None:
    """Nested JSON values equal: the same keys and strings, numbers within float tolerance."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for key in want:
            _assert_close_tree(got[key], want[key], f"{path}/{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close_tree(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=path)
    else:
        assert got == want, path


def test_two_processes_run_the_study_like_one(study):
    """SFT losses, every RL stage's run (losses, summary, where it ran), the saved evaluation results turn by
    turn and the study's findings agree; process 0 alone writes the study's outputs (process 1 only logs)."""
    ref_out, multi_out = study["ref"], study["multi"]
    sft = [r["loss"] for r in map(json.loads, open(ref_out / "seed0" / "sft" / "sft_metrics.jsonl"))]
    assert len(sft) == 3 and len(set(sft)) == 3
    np.testing.assert_allclose([r["loss"] for r in map(json.loads, open(multi_out / "seed0" / "sft" / "sft_metrics.jsonl"))],
                               sft, rtol=1e-4, atol=1e-6)
    for variant in VARIANTS:
        got, want = _read(multi_out / "seed0" / variant), _read(ref_out / "seed0" / variant)
        assert len(want["losses"]) == 2 and all(want["losses"]), variant  # the entropy term moves every loss
        _assert_same_run(got, want)
        assert sorted(os.listdir(multi_out / "seed0" / variant / "checkpoints")) == ["1", "2"]
        d, dr = got["summary"]["distributed"], want["summary"]["distributed"]
        assert (d["processes"], d["devices"], d["local_devices"]) == (2, 4, 2)
        assert (dr["processes"], dr["devices"], dr["local_devices"]) == (1, 1, 1)
        assert d["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1} and dr["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
        assert dr["transfer_s_per_step"] == 0
        # The exported policies are the same weights.
        from safetensors.numpy import load_file

        a, b = (load_file(o / "seed0" / variant / "policy" / "model.safetensors") for o in (multi_out, ref_out))
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=f"{variant} {name}")
    got, want = (json.load(open(o / "seed0" / "eval" / "results.json")) for o in (multi_out, ref_out))
    assert got["policies"].keys() == want["policies"].keys() == {"base", *VARIANTS}
    for name, w in want["policies"].items():
        np.testing.assert_allclose(got["policies"][name]["per_task"], w["per_task"], atol=1e-6, err_msg=name)
        assert got["policies"][name]["episodes"] == w["episodes"], name  # the same episodes, turn by turn
        assert got["policies"][name]["probe_correct"] == w["probe_correct"], name
    g, w = (json.load(open(o / "summary.json")) for o in (multi_out, ref_out))
    assert g["sentences"] == w["sentences"] and g["table"] == w["table"]
    assert os.listdir(study["logs"]) == ["process1.log"]
    assert sorted(os.listdir(multi_out / "figures")) == sorted(os.listdir(ref_out / "figures"))


def test_eval_on_two_processes_equals_one(study):
    """`bmrl eval` of the study's BudgetMix policy (Pass@(K,T) grid, decision-accuracy probes, error injection)
    on 2 processes x 2 devices (mesh data 2 x fsdp 2) and in this process on one device: the same results,
    episode by episode, written by process 0 alone, and the same verdict lines printed by every process."""
    from bmrl.cli import main

    tmp = study["tmp"]

    def args(out, *mesh):  # the overrides in one run of positionals: argparse takes them only together
        return ["eval", "--config", CONFIG, "--no-plots", "--names", "budgetmix",
                "--policy", str(study["ref"] / "seed0" / "budgetmix" / "policy"), "--out", str(out),
                *STUDY, *mesh, f"out_dir={out}"]

    two = _start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(tmp / "eval2_logs"), "--",
                  *args(tmp / "eval2", "mesh.data=2", "mesh.fsdp=2")], tmp / "eval2.log", None)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert main(args(tmp / "eval1")) == 0
    _finish(two, tmp / "eval2.log", "the 2-process bmrl eval")
    want, got = (json.load(open(tmp / d / "results.json"))["policies"]["budgetmix"] for d in ("eval1", "eval2"))
    assert {"surface", "probe", "injected_eval", "decomposition"} <= want.keys()  # grid, probes, injection all ran
    want.pop("compiles"), got.pop("compiles")
    _assert_close_tree(got, want)
    # Both processes print the same verdicts (process 0's through the launcher); process 1 writes no file.
    assert os.listdir(tmp / "eval2_logs") == ["process1.log"]
    lines = {name: [line for line in text.splitlines() if "Pass@(1," in line]
             for name, text in [("one", printed.getvalue()), ("0", open(tmp / "eval2.log").read()),
                                ("1", open(tmp / "eval2_logs" / "process1.log").read())]}
    assert lines["one"] and lines["0"] == lines["one"] and lines["1"] == lines["one"], lines
    assert f"process 0 writes the results to {tmp / 'eval2'}" in open(tmp / "eval2_logs" / "process1.log").read()


@pytest.mark.parametrize("processes", [1, 2])
def test_restart_resumes_the_two_process_checkpoint(study, processes):
    """An RL stage of the 2-process study restarted from its step-1 checkpoint, as 2 processes again or
    as 1 process x 4 devices (orbax reshards it onto the new process layout): the stage ends equal to the
    uninterrupted reference's."""
    out = study["tmp"] / f"restart{processes}"
    shutil.copytree(study["multi"] / "seed0" / "budgetmix", out)
    shutil.rmtree(out / "checkpoints" / "2")
    (out / "summary.json").unlink()
    log = study["tmp"] / f"restart{processes}.log"
    args = ["train", "--config", str(out / "config.yaml"), f"out_dir={out}", "--no-progress"]
    if processes == 1:
        proc = _start(args, log, 4)
    else:
        proc = _start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(out / "logs"), "--", *args],
                      log, None)
    _finish(proc, log, f"the {processes}-process restart")
    assert "resumed from" in open(log).read() and "at step 1" in open(log).read()
    got, ref = _read(out), _read(study["ref"] / "seed0" / "budgetmix")
    _assert_same_run(got, ref, evals=False)  # the stage ran without evaluations; `bmrl train` adds a final one
    assert got["summary"]["resumed_from"] == 1 and got["summary"]["distributed"]["processes"] == processes


def test_a_killed_process_stops_the_other_within_the_heartbeat_bound(tmp_path):
    """Two processes started by hand (as on two hosts: no launcher to stop them), process 1 SIGKILLed
    after the first evaluation: process 0 fails in its next collective, waits for the coordination
    service to declare process 1 dead (BMRL_HEARTBEAT_TIMEOUT_S, 10 s here) and exits with status 4
    (EXIT_PEER_FAILED) naming it, instead of hanging; no half-written checkpoint is left as a step. On a busy
    machine process 0 may be outside any collective (compiling) when the heartbeat runs out: then JAX's
    coordination service aborts it (SIGABRT) naming process 1, at the same bound; jaxlib's handler for that
    cannot be replaced from Python (its status argument has no Python type)."""
    from bmrl.distributed import EXIT_PEER_FAILED
    from bmrl.launch import free_port, process_env

    config = tmp_path / "tiny.yaml"
    config.write_text(TRAIN_CONFIG)
    out, heartbeat = tmp_path / "killed", 10
    port, procs, logs = free_port(), [], [tmp_path / f"killed{i}.log" for i in range(2)]
    for pid in range(2):
        env = process_env({**_env(None), "BMRL_HEARTBEAT_TIMEOUT_S": str(heartbeat)}, pid, 2, port, cpu_devices=2)
        with open(logs[pid], "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "bmrl", "train", "--config", str(config),
                                           f"out_dir={out}", "--no-progress"], env=env, cwd=ROOT,
                                          stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.time() + TIMEOUT_S
        while "eval step 0" not in logs[0].read_text():
            assert time.time() < deadline and procs[0].poll() is None, logs[0].read_text()[-3000:]
            time.sleep(0.5)
        procs[1].kill()
        t0 = time.time()
        code = procs[0].wait(timeout=heartbeat + 90)
        waited = time.time() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = logs[0].read_text()
    assert waited < heartbeat + 60  # the stated bound: the heartbeat timeout plus the failing collective's wait
    if code == -signal.SIGABRT:  # not inside a collective when the heartbeat ran out (a busy host): JAX aborts it
        assert "stopped sending heartbeats" in text and "unhealthy" in text and "\n1\n" in text, text[-3000:]
    else:  # its collective failed first: bmrl's handler names the dead process and exits EXIT_PEER_FAILED
        assert code == EXIT_PEER_FAILED, text[-3000:]
        assert "process 0 of 2 stops" in text and "process 1 stopped (no heartbeat)" in text
    steps = [s for s in (os.listdir(out / "checkpoints") if (out / "checkpoints").is_dir() else []) if s.isdigit()]
    assert all(os.path.isfile(out / "checkpoints" / s / "_CHECKPOINT_METADATA") for s in steps), steps  # whole ones


def test_python_env_two_processes_step_their_own_rows(tmp_path):
    """A Python env (tests/e2e/test_python_env.py's guessing game, two tasks in three raise in step):
    with 2 processes (mesh data 2 x fsdp 2) each steps only its half of the batch's environments; the
    trajectories, losses, fault counts and evaluations equal those of 1 process on one device (run in this
    process), and faults.jsonl holds every fault once."""
    from bmrl.cli import main
    from tests.e2e.test_python_env import ENV_MODULE, _write

    # The game, each reset logged as "process task-id" (BMRL_PROCESS_ID; "-" for the 1-process run).
    resets = tmp_path / "resets.txt"
    logged_env = ENV_MODULE.replace("    def reset(self, *, seed=None, options=None):\n", (
        "    def reset(self, *, seed=None, options=None):\n"
        "        import os\n"
        f"        with open({str(resets)!r}, 'a') as f:\n"
        "            f.write(os.environ.get('BMRL_PROCESS_ID', '-') + ' ' + dict(options or {})['id'] + '\\n')\n"))
    assert logged_env != ENV_MODULE
    config = _write(tmp_path, "guess_mh", body=logged_env)
    overrides = ["train.group_size=4", "train.entropy_coef=0.01", "eval.num_tasks=4", "eval.probe_states=0"]
    ref_out, multi_out = tmp_path / "ref", tmp_path / "multi"
    multi = _start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(tmp_path / "logs"), "--",
                    "train", "--config", config, f"out_dir={multi_out}", *overrides, "mesh.data=2", "mesh.fsdp=2",
                    "--no-progress"], tmp_path / "multi.log", None)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # the reference
        assert main(["train", "--config", config, f"out_dir={ref_out}", *overrides, "--no-progress"]) == 0
    _finish(multi, tmp_path / "multi.log", "the 2-process Python-env run")
    got, want = _read(multi_out), _read(ref_out)
    _assert_same_run(got, want)
    faults = [r["rollout/faults"] for r in want["records"] if "rollout/faults" in r]
    assert faults == [r["rollout/faults"] for r in got["records"] if "rollout/faults" in r] and sum(faults) > 0
    logged = [json.loads(line) for line in open(multi_out / "faults.jsonl")]
    assert sorted((r["step"], r["row"], r["turn"]) for r in logged) == sorted(
        (r["step"], r["row"], r["turn"]) for r in map(json.loads, open(ref_out / "faults.jsonl")))
    assert {r["row"] for r in logged} & set(range(4)) and {r["row"] for r in logged} & set(range(4, 8))  # both halves
    assert got["summary"]["distributed"]["transfer_s_per_step"] > 0  # the rows and faults crossed processes
    # Every environment reset (training batches and evaluations) happened on exactly one process: the two
    # processes' resets together are the 1-process run's, and each did a share of them.
    by = {}
    for who, task in (line.split() for line in resets.read_text().splitlines()):
        by.setdefault(who, []).append(task)
    assert sorted(by["0"] + by["1"]) == sorted(by["-"]), by
    assert 0 < len(by["0"]) < len(by["-"]) and 0 < len(by["1"]) < len(by["-"])


# ------------------------------------------------------------------ the launcher, without JAX
def _children(tmp_path, script_by_pid: dict[int, str]) -> list[str]:
    """A command whose process i runs `script_by_pid[i]` (Python source), chosen by BMRL_PROCESS_ID."""
    path = tmp_path / "child.py"
    cases = "\n".join(f"if pid == {i}:\n" + "\n".join("    " + line for line in src.splitlines())
                      for i, src in script_by_pid.items())
    path.write_text(f"import os, signal, sys, time\npid = int(os.environ['BMRL_PROCESS_ID'])\n{cases}\n")
    return [sys.executable, str(path)]


def test_launcher_sets_the_variables_and_stops_all_when_one_dies(tmp_path):
    from bmrl.launch import GRACE_S, launch

    # Every process sees its id, the count and one coordinator; all exit 0: status 0.
    report = "print(os.environ['BMRL_PROCESS_ID'], os.environ['BMRL_NUM_PROCESSES'], os.environ['BMRL_COORDINATOR'])"
    logs = tmp_path / "ok"
    assert launch(_children(tmp_path, {1: report, 2: report}) , 3, log_dir=str(logs), log=lambda m: None) == 0
    lines = [open(logs / f"process{i}.log").read().split() for i in (1, 2)]
    assert [x[:2] for x in lines] == [["1", "3"], ["2", "3"]] and lines[0][2] == lines[1][2]
    assert lines[0][2].startswith("127.0.0.1:")
    # Process 1 is killed (SIGKILL) while process 0 would run on (and ignores SIGTERM): the launcher
    # stops process 0 within its grace period and returns 128 + 9, naming process 1.
    messages = []
    hang = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)"
    t0 = time.time()
    code = launch(_children(tmp_path, {0: hang, 1: "time.sleep(0.5)\nos.kill(os.getpid(), signal.SIGKILL)"}), 2,
                  log_dir=str(tmp_path / "killed"), grace_s=2.0, log=messages.append)
    assert code == 128 + 9
    assert time.time() - t0 < 0.5 + 2.0 + 5.0 < GRACE_S + 10
    assert any("process 1 exited with status 137" in m for m in messages)
    # A failing process's own status comes back.
    assert launch(_children(tmp_path, {1: "sys.exit(3)"}), 2, log_dir=str(tmp_path / "three"), log=lambda m: None) == 3


def test_launch_command_refuses_bad_arguments(capsys):
    from bmrl.cli import main

    assert main(["launch", "--processes", "0", "--", "train"]) == 2
    assert "--processes must be >= 1" in capsys.readouterr().err
    assert main(["launch", "--processes", "2"]) == 2
    assert "no command to launch" in capsys.readouterr().err
    assert main(["launch", "--processes", "2", "--", "launch", "--processes", "2"]) == 2
