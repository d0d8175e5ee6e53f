"""Shared helpers of the multi-process tests: a host-side global batch cut to this process's rows.

They lived in `bmrl.distributed` but only tests used them: bmrl itself feeds its rows with
`local_rows` and `global_batch_array` directly (`bmrl.assembly.players`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, Sharding

from bmrl.distributed import global_batch_array, local_rows


def split_batch(tree: Any, mesh_or_sharding: Mesh | Sharding) -> Any:
    """This process's rows of every leaf of a host-side global batch (leading axis = batch)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return tree
    rows = local_rows(mesh_or_sharding, int(np.shape(leaves[0])[0]))
    return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def shard_host_batch(tree: Any, mesh: Mesh) -> Any:
    """Place a host batch that every process holds in full (same values everywhere, e.g. task seeds from
    a shared seed) on `mesh`, batch-sharded: each process contributes only its own rows."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return tree
    rows = int(np.shape(leaves[0])[0])
    return global_batch_array(mesh, split_batch(tree, mesh), rows)
