"""Rows: which rows of a global batch this process holds and feeds, and its share of host-side work.

Under the batch sharding (leading axis over the mesh's (data, fsdp) axes) each process's devices hold
one contiguous block of rows: `local_rows` says which, `global_batch_array` assembles the global
`jax.Array` from every process's block, and `process_share` splits host work (a Python env's rows) the
same way, in process order. Nothing here moves data between processes (that is `bmrl.distributed.gather`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding

from bmrl.distributed.startup import DistributedError


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
                f"of a global batch of {rows}; pass the global batch's rows that local_rows(...) names."
            )
        return jax.make_array_from_process_local_data(sharding, x, (rows, *x.shape[1:]))

    return jax.tree.map(one, local_tree)


def process_share(n: int) -> np.ndarray:
    """The indices of `n` items this process handles when host work is split over processes: one
    contiguous share each, in process order, the first `n % processes` one longer (`np.array_split`)."""
    return np.array_split(np.arange(n), jax.process_count())[jax.process_index()]


__all__ = ["global_batch_array", "local_rows", "process_share"]
