"""Start-up: which settings start `jax.distributed`, starting it once, and where this process stands.

`initialize` must run before any other JAX call, so its settings are resolved apart from it
(`resolve_settings`, pure: explicit arguments, else BMRL_* variables, else a cluster launcher seen in
the environment) and every mistake is a `DistributedError` that names the fix. The heartbeat timeout
is set here too: it bounds how long a dead peer goes unnoticed (`bmrl.distributed.failure`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

ENV_COORDINATOR = "BMRL_COORDINATOR"
ENV_NUM_PROCESSES = "BMRL_NUM_PROCESSES"
ENV_PROCESS_ID = "BMRL_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "BMRL_LOCAL_DEVICE_IDS"
ENV_MODE = "BMRL_DISTRIBUTED"  # auto | off (unset: explicit settings or cluster variables decide)
ENV_HEARTBEAT = "BMRL_HEARTBEAT_TIMEOUT_S"  # seconds without a heartbeat before a process counts as dead
HEARTBEAT_TIMEOUT_S = 60  # a process silent this long is declared dead by the coordination service


class DistributedError(RuntimeError):
    """Multi-process settings that cannot work (missing coordinator, bad process id, ...)."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands: its index among `process_count` processes and its devices."""

    process_index: int
    process_count: int
    local_device_count: int
    device_count: int

    @property
    def is_main(self) -> bool:
        """True on process 0, the one that writes logs, reports and Hugging Face exports."""
        return self.process_index == 0


def process_info() -> ProcessInfo:
    """The current process's `ProcessInfo` (initialises the JAX backend)."""
    return ProcessInfo(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def is_multiprocess() -> bool:
    """True when more than one JAX process takes part (after `initialize`)."""
    return jax.process_count() > 1


def _int(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedError(f"{name} must be an integer, got {value!r}.") from None


def _count(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env.get(name, "") or 0)
    except ValueError:
        return 0


def _cluster_detected(env: Mapping[str, str]) -> str | None:
    """The name of a multi-process launcher visible in `env` (TPU pod, Slurm, Open MPI), or None."""
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    if len([h for h in hosts.split(",") if h.strip()]) > 1 or _count(env, "MEGASCALE_NUM_SLICES") > 1:
        return "tpu"
    if _count(env, "SLURM_NTASKS") > 1 and "SLURM_STEP_ID" in env:  # inside an srun step, not salloc
        return "slurm"
    if _count(env, "OMPI_COMM_WORLD_SIZE") > 1:
        return "openmpi"
    return None


def resolve_settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """The keyword arguments for `jax.distributed.initialize`, or None for a single process.

    Explicit arguments win over the BMRL_* environment variables; `{}` means "let JAX detect the
    cluster" (TPU pod slices, Slurm, Open MPI). Pure: reads `env` (default `os.environ`), starts nothing.
    """
    env = os.environ if env is None else env
    mode = env.get(ENV_MODE, "").strip().lower()
    if mode not in ("", "auto", "off"):
        raise DistributedError(f"{ENV_MODE}={env[ENV_MODE]!r} is not allowed; use auto, off, or leave it unset.")
    coordinator = coordinator_address if coordinator_address is not None else env.get(ENV_COORDINATOR) or None
    num = num_processes if num_processes is not None else env.get(ENV_NUM_PROCESSES) or None
    pid = process_id if process_id is not None else env.get(ENV_PROCESS_ID) or None
    if local_device_ids is None and env.get(ENV_LOCAL_DEVICE_IDS):
        local_device_ids = [_int(ENV_LOCAL_DEVICE_IDS, d) for d in env[ENV_LOCAL_DEVICE_IDS].split(",")]
    explicit = any(v is not None for v in (coordinator, num, pid))
    if mode == "off" or (not explicit and mode == "" and _cluster_detected(env) is None):
        return None
    if not explicit:  # mode == "auto" or a cluster launcher: JAX fills in everything
        return {} if local_device_ids is None else {"local_device_ids": list(local_device_ids)}
    if num is None:
        raise DistributedError(f"the number of processes is missing; pass num_processes or set {ENV_NUM_PROCESSES}.")
    num = _int(ENV_NUM_PROCESSES, num)
    if num < 1:
        raise DistributedError(f"{ENV_NUM_PROCESSES} must be >= 1, got {num}.")
    if num == 1:
        return None
    if coordinator is None:
        raise DistributedError(
            f"{num} processes need a coordinator; pass coordinator_address or set {ENV_COORDINATOR}=HOST:PORT "
            "(the address of process 0, reachable from every process)."
        )
    if ":" not in str(coordinator):
        raise DistributedError(f"{ENV_COORDINATOR}={coordinator!r} needs a port, e.g. 10.0.0.2:8476.")
    if pid is None:
        raise DistributedError(f"the process id is missing; pass process_id or set {ENV_PROCESS_ID} (0..{num - 1}).")
    pid = _int(ENV_PROCESS_ID, pid)
    if not 0 <= pid < num:
        raise DistributedError(f"{ENV_PROCESS_ID}={pid} is out of range for {num} processes (0..{num - 1}).")
    out: dict[str, Any] = {"coordinator_address": str(coordinator), "num_processes": num, "process_id": pid}
    if local_device_ids is not None:
        out["local_device_ids"] = list(local_device_ids)
    return out


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Sequence[int] | None = None,
    timeout_s: int = 300,
) -> ProcessInfo:
    """Start `jax.distributed` when running as one of several processes; returns this `ProcessInfo`.

    Call it first thing, before any other JAX computation. Idempotent (a second call returns the same
    info) and a no-op for a single process. Settings come from the arguments, else BMRL_* variables,
    else JAX's cluster detection (see `resolve_settings`).
    """
    if jax.distributed.is_initialized():
        info = process_info()
        if num_processes is not None and int(num_processes) != info.process_count:
            raise DistributedError(
                f"jax.distributed already runs {info.process_count} processes; "
                f"cannot re-initialise for {num_processes}."
            )
        return info
    settings = resolve_settings(coordinator_address, num_processes, process_id, local_device_ids)
    if settings is not None:
        import inspect

        extra = {}
        if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:  # in jax 0.10.2
            extra["heartbeat_timeout_seconds"] = _int(ENV_HEARTBEAT, os.environ.get(ENV_HEARTBEAT) or HEARTBEAT_TIMEOUT_S)
        try:
            jax.distributed.initialize(**settings, initialization_timeout=timeout_s, **extra)
        except (RuntimeError, ValueError) as err:
            where = settings.get("coordinator_address", "auto-detected cluster")
            raise DistributedError(
                f"jax.distributed.initialize failed ({where}): {err}. Call bmrl.distributed.initialize() before "
                f"any other JAX call; check that every process uses the same coordinator and process count, "
                f"that process 0 started and that its port is reachable; set {ENV_MODE}=off to run as a "
                f"single process."
            ) from err
    return process_info()


__all__ = ["ENV_COORDINATOR", "ENV_HEARTBEAT", "ENV_LOCAL_DEVICE_IDS", "ENV_MODE", "ENV_NUM_PROCESSES",
           "ENV_PROCESS_ID", "HEARTBEAT_TIMEOUT_S", "DistributedError", "ProcessInfo", "initialize",
           "is_multiprocess", "process_info", "resolve_settings"]
