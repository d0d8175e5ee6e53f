"""Multi-host end to end: `bmrl launch` and its processes.

A 2-process `bmrl train` with one process killed stops within the heartbeat bound; a Python env's rows are
split across 2 processes and the run equals 1 process's; the launcher's own contract (stop the others when
one dies, its exit status) is checked on plain Python children, without JAX. The study on 2 processes
(`bmrl reproduce`, `bmrl eval`, restarts that reshard) is compared with the tiny study in
tests/e2e/test_reproduce_report.py, which runs it once in process as the reference.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

from tests.e2e.processes import TIMEOUT_S, assert_same_run, env_of, finish, read_run, start
from tests.paths import ROOT

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
        env = process_env({**env_of(None), "BMRL_HEARTBEAT_TIMEOUT_S": str(heartbeat)}, pid, 2, port, cpu_devices=2)
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
    multi = start(["launch", "--processes", "2", "--cpu-devices", "2", "--logs", str(tmp_path / "logs"), "--",
                    "train", "--config", config, f"out_dir={multi_out}", *overrides, "mesh.data=2", "mesh.fsdp=2",
                    "--no-progress"], tmp_path / "multi.log", None)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # the reference
        assert main(["train", "--config", config, f"out_dir={ref_out}", *overrides, "--no-progress"]) == 0
    finish(multi, tmp_path / "multi.log", "the 2-process Python-env run")
    got, want = read_run(multi_out), read_run(ref_out)
    assert_same_run(got, want)
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
