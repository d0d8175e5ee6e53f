"""Local multi-process runs: start N JAX processes of one command on this machine, as N hosts would.

    code = launch([sys.executable, "-m", "bmrl", "train", "--config", "c.yaml"], processes=2,
                  cpu_devices=2, log_dir="runs/x/launch")

Each process gets the variables `bmrl.distributed.initialize` reads (BMRL_COORDINATOR=127.0.0.1:<a
free port>, BMRL_NUM_PROCESSES, BMRL_PROCESS_ID); with `cpu_devices` also JAX_PLATFORMS=cpu and
XLA_FLAGS simulating that many CPU devices per process (testing a multi-host mesh without hosts).
Process 0 writes to this terminal; process i > 0 to `log_dir/process<i>.log`. When any process
exits non-zero (or is killed), the others are stopped at once (SIGTERM, then SIGKILL after
`grace_s`: a process blocked in a collective whose peer is gone does not stop on SIGTERM) and the
launcher returns the first failing process's status (128 + signal for a killed one). On several
hosts, start one process per host with the same variables instead (tpu/run.sh; Slurm and TPU pod
slices set their own, which `initialize` detects).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from bmrl.distributed import ENV_COORDINATOR, ENV_LOCAL_DEVICE_IDS, ENV_MODE, ENV_NUM_PROCESSES, ENV_PROCESS_ID

GRACE_S = 10.0  # SIGTERM -> SIGKILL for the processes left when one failed
POLL_S = 0.2
# Variables of bmrl or an enclosing launcher that would make a child join another cluster.
_FOREIGN = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, ENV_LOCAL_DEVICE_IDS, ENV_MODE, "TPU_WORKER_",
            "TPU_PROCESS_", "MEGASCALE_", "SLURM_", "OMPI_")


class LaunchError(ValueError):
    """Launcher arguments that cannot work (exit status 2)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the coordinator's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def process_env(base: Mapping[str, str], process_id: int, processes: int, port: int,
                cpu_devices: int | None = None) -> dict[str, str]:
    """The environment of process `process_id` of `processes`: `base` without another launcher's
    variables, plus the BMRL_* settings (and, with `cpu_devices`, a simulated CPU platform)."""
    env = {k: v for k, v in base.items() if not k.startswith(_FOREIGN)}
    env.update({ENV_COORDINATOR: f"127.0.0.1:{port}", ENV_NUM_PROCESSES: str(processes),
                ENV_PROCESS_ID: str(process_id)})
    if cpu_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={int(cpu_devices)}"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status (killed by signal s: 128 + s)."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every running process, then SIGKILL those still running after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(command: Sequence[str], processes: int, *, cpu_devices: int | None = None, log_dir: str | None = None,
           env: Mapping[str, str] | None = None, cwd: str | None = None, grace_s: float = GRACE_S,
           log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> int:
    """Run `command` as `processes` JAX processes (module docstring); returns the exit status: 0 when
    all exit 0, else the first failing process's. `log_dir` (default: a new temporary directory) holds
    the logs of processes 1..N-1."""
    if processes < 1:
        raise LaunchError(f"--processes must be >= 1, got {processes}.")
    if cpu_devices is not None and cpu_devices < 1:
        raise LaunchError(f"--cpu-devices must be >= 1, got {cpu_devices}.")
    if not command:
        raise LaunchError("no command to launch; e.g. bmrl launch --processes 2 -- train --config FILE")
    log_dir = log_dir or tempfile.mkdtemp(prefix="bmrl-launch-")
    os.makedirs(log_dir, exist_ok=True)
    port = free_port()
    base = os.environ if env is None else env
    procs: list[subprocess.Popen] = []
    files = []
    try:
        for pid in range(processes):
            out = None
            if pid > 0:
                out = open(os.path.join(log_dir, f"process{pid}.log"), "w")
                files.append(out)
            procs.append(subprocess.Popen(list(command), env=process_env(base, pid, processes, port, cpu_devices),
                                          cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None))
        if processes > 1:
            log(f"bmrl launch: {processes} processes, coordinator 127.0.0.1:{port}; process 0 below, "
                f"the others' logs in {log_dir}")
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                pid, code = failed[0]
                others = [p for p in procs if p.poll() is None]
                if others:
                    log(f"bmrl launch: process {pid} exited with status {exit_status(code)}; stopping the other "
                        f"{len(others)} (logs: {log_dir})")
                _stop(procs, grace_s)
                return exit_status(code)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)
    except BaseException:  # Ctrl-C or an error here: never leave processes behind
        _stop(procs, grace_s)
        raise
    finally:
        for f in files:
            f.close()


__all__ = ["GRACE_S", "LaunchError", "exit_status", "free_port", "launch", "process_env"]
