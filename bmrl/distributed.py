"""Multi-process JAX: start `jax.distributed` once, feed each process its rows of the global batch.

On a TPU pod slice (or several GPU nodes) one Python process runs per host and sees only its own
devices; `jax.devices()` lists every device of every process, so `bmrl.parallel.make_mesh` builds one
mesh over the whole slice and jit runs the same program everywhere. What changes is the host side:

    info = initialize()                    # before any other JAX call; a no-op for one process
    mesh = make_mesh(MeshConfig(data=-1))  # all devices of all processes
    rows = local_rows(mesh, global_batch)  # this process's slice of the global batch
    batch = global_batch_array(mesh, {"tokens": host_tokens[rows]}, global_batch)
    host = to_host(traj.success)           # gathers rows held by other processes

`initialize` takes its settings from explicit arguments, else from the environment
(BMRL_COORDINATOR=host:port, BMRL_NUM_PROCESSES, BMRL_PROCESS_ID, optional BMRL_LOCAL_DEVICE_IDS),
else lets JAX detect the cluster (`BMRL_DISTRIBUTED=auto`, or TPU/Slurm/Open MPI variables showing
more than one process). `BMRL_DISTRIBUTED=off` forces a single process.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding

ENV_COORDINATOR = "BMRL_COORDINATOR"
ENV_NUM_PROCESSES = "BMRL_NUM_PROCESSES"
ENV_PROCESS_ID = "BMRL_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "BMRL_LOCAL_DEVICE_IDS"
ENV_MODE = "BMRL_DISTRIBUTED"  # auto | off (unset: explicit settings or cluster variables decide)
ENV_HEARTBEAT = "BMRL_HEARTBEAT_TIMEOUT_S"  # seconds without a heartbeat before a process counts as dead


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


def is_main() -> bool:
    """True on process 0, the one process that writes a run's files (`bmrl.rundir`, `bmrl.metrics`, the
    Hugging Face export, reports); the others compute the same values and write nothing (orbax
    checkpoints are the exception: every process writes its shards). Never starts the JAX backend:
    before `jax.distributed` is initialised this is the only process."""
    return not jax.distributed.is_initialized() or jax.process_index() == 0


# ---------------------------------------------------------------- initialisation
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
        if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:  # jax 0.10, 0.11
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


# ---------------------------------------------------------------- batches across processes
def _batch_sharding(mesh_or_sharding: Mesh | Sharding, ndim: int) -> Sharding:
    if isinstance(mesh_or_sharding, Mesh):
        from bmrl.parallel import batch_sharding

        return batch_sharding(mesh_or_sharding, ndim)
    return mesh_or_sharding


def local_rows(mesh_or_sharding: Mesh | Sharding, global_batch: int) -> slice:
    """The contiguous rows [start, stop) of a `global_batch`-row array that this process's devices hold
    under the batch sharding (leading axis over (data, fsdp)); what the process must load and feed.

    Raises DistributedError when the global batch does not split evenly over the batch axes, or when
    this process's rows are not contiguous (a mesh whose batch axes interleave processes).
    """
    sharding = _batch_sharding(mesh_or_sharding, 1)
    if isinstance(sharding, NamedSharding):
        spec = sharding.spec[0] if len(sharding.spec) else None
        axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
        ways = int(np.prod([sharding.mesh.shape[a] for a in axes])) if axes else 1
        if global_batch % ways:
            raise DistributedError(
                f"a global batch of {global_batch} rows does not split over {ways} batch shards "
                f"(mesh axes {axes}); use a multiple of {ways}."
            )
    index_map = sharding.addressable_devices_indices_map((global_batch,))
    starts = sorted({(idx[0].start or 0, global_batch if idx[0].stop is None else idx[0].stop)
                     for idx in index_map.values()})
    lo, hi = starts[0][0], starts[0][1]
    for a, b in starts[1:]:
        if a > hi:
            raise DistributedError(
                f"process {jax.process_index()} holds rows that are not contiguous ({starts}); build the mesh "
                "from jax.devices() in process order (bmrl.parallel.make_mesh does) so each process feeds one block."
            )
        hi = max(hi, b)
    return slice(lo, hi)


def split_batch(tree: Any, mesh_or_sharding: Mesh | Sharding) -> Any:
    """This process's rows of every leaf of a host-side global batch (leading axis = batch)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return tree
    rows = local_rows(mesh_or_sharding, int(np.shape(leaves[0])[0]))
    return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def global_batch_array(mesh_or_sharding: Mesh | Sharding, local_tree: Any, global_batch: int | None = None) -> Any:
    """Global `jax.Array`s, batch-sharded over (data, fsdp), assembled from every process's local rows
    (`jax.make_array_from_process_local_data`). `global_batch` defaults to local rows x processes."""

    def one(x):
        x = np.asarray(x)
        rows = x.shape[0] * jax.process_count() if global_batch is None else int(global_batch)
        sharding = _batch_sharding(mesh_or_sharding, x.ndim)
        want = local_rows(sharding, rows)
        if want.stop - want.start != x.shape[0]:
            raise DistributedError(
                f"process {jax.process_index()} gave {x.shape[0]} rows but holds rows {want.start}..{want.stop - 1} "
                f"of a global batch of {rows}; pass split_batch(...) of the global batch."
            )
        return jax.make_array_from_process_local_data(sharding, x, (rows, *x.shape[1:]))

    return jax.tree.map(one, local_tree)


def shard_host_batch(tree: Any, mesh: Mesh) -> Any:
    """Place a host batch that every process holds in full (same values everywhere, e.g. task seeds from
    a shared seed) on `mesh`, batch-sharded: each process contributes only its own rows."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return tree
    rows = int(np.shape(leaves[0])[0])
    return global_batch_array(mesh, split_batch(tree, mesh), rows)


# Seconds and calls spent gathering arrays across processes in `to_host` (the cost of multi-host runs
# that a summary reports: evaluation rows, Python-env rows, the export); zero on one process.
TRANSFERS = {"seconds": 0.0, "calls": 0}


def to_host(tree: Any) -> Any:
    """Numpy copies of every leaf: THE way bmrl fetches device arrays to the host. Arrays split across
    processes are gathered (`process_allgather`; every process gets all, so every process must call
    it at the same point); the time that takes is added to `TRANSFERS`."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            t0 = time.perf_counter()
            out = np.asarray(multihost_utils.process_allgather(x, tiled=True))
            TRANSFERS["seconds"] += time.perf_counter() - t0
            TRANSFERS["calls"] += 1
            return out
        return np.asarray(x)

    return jax.tree.map(one, tree)


def process_share(n: int) -> np.ndarray:
    """The indices of `n` items this process handles when host work is split over processes: one
    contiguous share each, in process order, the first `n % processes` one longer (`np.array_split`)."""
    return np.array_split(np.arange(n), jax.process_count())[jax.process_index()]


def gather_rows(tree: Any, n: int) -> Any:
    """The `n` rows of a host batch from the rows each process made of its `process_share(n)` (`tree`:
    numpy leaves, batch first), in order, on every process; every process must call it at the same
    point. For rows each process played on its own (a Python env's evaluation rows); the time goes to
    `TRANSFERS`."""
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, tree)
    shares = np.array_split(np.arange(n), jax.process_count())
    longest, mine = len(shares[0]), len(shares[jax.process_index()])
    if not len(shares[-1]):
        raise DistributedError(f"{n} rows cannot be shared by {jax.process_count()} processes (one would have "
                               "none); play fewer rows than processes on every process instead.")

    def padded(x):  # every process sends `longest` rows (copies of its last one at the end)
        x = np.asarray(x)
        return x[np.minimum(np.arange(longest), mine - 1)]

    t0 = time.perf_counter()
    every = multihost_utils.process_allgather(jax.tree.map(padded, tree), tiled=True)
    TRANSFERS["seconds"] += time.perf_counter() - t0
    TRANSFERS["calls"] += 1
    keep = np.concatenate([p * longest + np.arange(len(share)) for p, share in enumerate(shares)])
    return jax.tree.map(lambda x: np.asarray(x)[keep], every)


def gather_objects(obj: Any) -> list[Any]:
    """Every process's `obj` (JSON-able), in process order; every process must call it at the same
    point. For host-side results such as the faults of Python environments, logged once by process 0."""
    import json

    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return [obj]
    t0 = time.perf_counter()
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    TRANSFERS["seconds"] += time.perf_counter() - t0
    TRANSFERS["calls"] += 1
    return [json.loads(bytes(rows[i, : sizes[i]]).decode()) for i in range(len(sizes))]


EXIT_PEER_FAILED = 4  # exit status of a process stopped because the run failed across processes
HEARTBEAT_TIMEOUT_S = 60  # a process silent this long is declared dead by the coordination service


def dead_processes() -> list[int] | None:
    """The processes the coordination service no longer sees (their heartbeats stopped), or None when
    it cannot be asked (process 0, which hosts it, is gone)."""
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    try:
        live = client.get_live_nodes(list(range(jax.process_count())))
    except Exception:  # noqa: BLE001 - the service itself is unreachable
        return None
    return [p for p in range(jax.process_count()) if p not in live]


def stop_after_failure(prog: str, err: BaseException) -> None:
    """End this process of a multi-process run at once after `err`, saying which processes are gone.

    A process that raises normally would wait in jax.distributed's shutdown barrier (minutes) for
    peers that may be dead, and they for it; so the error is printed, with the dead processes named,
    and the process exits with `EXIT_PEER_FAILED` without that barrier (`os._exit`). Checkpoints
    are safe: orbax commits a step only once every process has written it (a temporary directory
    is all a cut save leaves, removed on restart)."""
    import sys
    import traceback

    traceback.print_exception(err, file=sys.stderr)
    dead = dead_processes()
    me = jax.process_index()
    if dead is None:
        who = "process 0 (the coordinator) is unreachable: it stopped or its host is gone"
    elif dead:
        who = f"process{'es' if len(dead) > 1 else ''} {', '.join(map(str, dead))} stopped (no heartbeat)"
    else:
        who = "every process is still alive: the error above is this process's own"
    print(f"bmrl {prog}: process {me} of {jax.process_count()} stops: {type(err).__name__}; {who}. "
          f"Restart all processes with the same command to resume from the last complete checkpoint.",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_PEER_FAILED)


BARRIER_TIMEOUT_S = 900  # how long a process waits at a barrier for the others (compiles may differ by minutes)
_barriers: dict[str, int] = {}


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process reaches the barrier `name` (a no-op for one process). A barrier of
    the coordination service, not a device collective: no XLA program, and its own timeout (a
    process that never comes raises instead of hanging). Names may repeat (each use is numbered)."""
    if not jax.distributed.is_initialized() or jax.process_count() == 1:
        return
    from jax._src import distributed as jax_distributed

    _barriers[name] = _barriers.get(name, 0) + 1
    jax_distributed.global_state.client.wait_at_barrier(f"{name}#{_barriers[name]}", int(timeout_s * 1000))


def main_writes(name: str, write: Callable[[], Any]) -> None:
    """Run `write` on process 0 alone, then wait at the barrier `name` until every process is there: when
    this returns, what process 0 wrote is on disk for any process to read (outputs on a filesystem every
    host sees). With one process: `write()`."""
    if is_main():
        write()
    barrier(name)


def warm_collectives(mesh: Mesh) -> None:
    """Open every cross-process communicator the run's programs can use, all processes together.

    XLA:CPU's Gloo collectives connect a group of devices at its first collective and give the
    peers 30 s to show up (`GetKeyValue() timed out with key: cpu:gloo/...`, not configurable): a
    process still compiling its program (minutes on a busy machine) then kills the run. So after a
    barrier, one program runs a psum over every combination of the mesh's axes, and a gather of
    all devices (`to_host`): the groups are made while every process waits for them, and XLA keeps
    them. A no-op for one process, and for accelerators (their collectives do not use Gloo)."""
    if jax.process_count() == 1 or jax.default_backend() != "cpu":
        return
    import itertools

    from jax.sharding import PartitionSpec as P

    axes = [a for a in mesh.axis_names if mesh.shape[a] > 1]
    groups = [g for n in range(1, len(axes) + 1) for g in itertools.combinations(axes, n)]
    spec = P(*mesh.axis_names)
    body = lambda x: [jax.lax.psum(x, g) for g in groups]  # noqa: E731
    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=[spec] * len(groups)))
    x = jax.device_put(np.zeros(mesh.devices.shape, np.float32), NamedSharding(mesh, spec))
    program.lower(x).compile()  # every process compiles first; only then do they meet
    barrier("bmrl-warm-collectives")
    jax.block_until_ready(program(x))
    to_host(x)


__all__ = [
    "ENV_COORDINATOR",
    "ENV_HEARTBEAT",
    "EXIT_PEER_FAILED",
    "HEARTBEAT_TIMEOUT_S",
    "dead_processes",
    "stop_after_failure",
    "ENV_LOCAL_DEVICE_IDS",
    "ENV_MODE",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "DistributedError",
    "ProcessInfo",
    "BARRIER_TIMEOUT_S",
    "barrier",
    "gather_objects",
    "gather_rows",
    "process_share",
    "global_batch_array",
    "initialize",
    "TRANSFERS",
    "is_main",
    "is_multiprocess",
    "local_rows",
    "process_info",
    "resolve_settings",
    "shard_host_batch",
    "split_batch",
    "to_host",
    "warm_collectives",
]
