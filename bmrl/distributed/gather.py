"""Gathers: device arrays and host results from every process, to every process, timed.

`to_host` is THE way bmrl fetches device arrays to the host; an array split across processes is
gathered (`jax.experimental.multihost_utils.process_allgather`), so every process must call it at the
same point. `gather_rows` and `gather_objects` do the same for host-side results each process made of
its own share (a Python env's rows, its faults). The seconds they take add up in `TRANSFERS`, the cost
of a multi-host run that a summary reports. `warm_collectives` opens the CPU backend's communicators
while every process waits for them, so the first gather of a run does not time out.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from bmrl.distributed.barrier import barrier
from bmrl.distributed.startup import DistributedError

# Seconds and calls spent gathering arrays across processes in `to_host` (the cost of multi-host runs
# that a summary reports: evaluation rows, Python-env rows, the export); zero on one process.
TRANSFERS = {"seconds": 0.0, "calls": 0}


def _count_transfer(t0: float) -> None:
    TRANSFERS["seconds"] += time.perf_counter() - t0
    TRANSFERS["calls"] += 1


def to_host(tree: Any) -> Any:
    """Numpy copies of every leaf: THE way bmrl fetches device arrays to the host. Arrays split across
    processes are gathered (`process_allgather`; every process gets all, so every process must call
    it at the same point); the time that takes is added to `TRANSFERS`."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            t0 = time.perf_counter()
            out = np.asarray(multihost_utils.process_allgather(x, tiled=True))
            _count_transfer(t0)
            return out
        return np.asarray(x)

    return jax.tree.map(one, tree)


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
    _count_transfer(t0)
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
    _count_transfer(t0)
    return [json.loads(bytes(rows[i, : sizes[i]]).decode()) for i in range(len(sizes))]


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


__all__ = ["TRANSFERS", "gather_objects", "gather_rows", "to_host", "warm_collectives"]
