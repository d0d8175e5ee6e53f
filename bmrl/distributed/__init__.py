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

One module per concern, every public name re-exported here:
- `startup`: settings, `initialize`, `ProcessInfo`, `DistributedError`;
- `rows`: which rows of a global batch this process holds (`local_rows`, `global_batch_array`) and its
  share of host work (`process_share`);
- `gather`: `to_host`, `gather_rows`, `gather_objects`, their cost (`TRANSFERS`), `warm_collectives`;
- `barrier`: `barrier`, `is_main` and `main_writes`, the one way process 0 writes a run's files;
- `failure`: `stop_after_failure` and `dead_processes` when a peer is gone;
- `_coordination`: the coordination service's client, the one private JAX name used (and why).
"""

from __future__ import annotations

from bmrl.distributed.barrier import BARRIER_TIMEOUT_S, barrier, is_main, main_writes
from bmrl.distributed.failure import EXIT_PEER_FAILED, dead_processes, stop_after_failure
from bmrl.distributed.gather import TRANSFERS, gather_objects, gather_rows, to_host, warm_collectives
from bmrl.distributed.rows import global_batch_array, local_rows, process_share
from bmrl.distributed.startup import (
    ENV_COORDINATOR,
    ENV_HEARTBEAT,
    ENV_LOCAL_DEVICE_IDS,
    ENV_MODE,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    HEARTBEAT_TIMEOUT_S,
    DistributedError,
    ProcessInfo,
    initialize,
    is_multiprocess,
    process_info,
    resolve_settings,
)

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
    "main_writes",
    "process_info",
    "resolve_settings",
    "to_host",
    "warm_collectives",
]
