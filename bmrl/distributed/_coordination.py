"""The coordination service's client: bmrl.distributed's one use of a private JAX name (`jax._src`), kept
here (bmrl's only other one: `bmrl.sampling._unrolled_threefry_rule`, the unrolled CPU threefry lowering).

Two things need the client that `jax.distributed.initialize` connects: `bmrl.distributed.barrier`
(`wait_at_barrier`: a barrier with its own timeout and no XLA program) and
`bmrl.distributed.failure.dead_processes` (`get_live_nodes`: which processes still send heartbeats).
No public API hands the client out. Checked in jax 0.10.2 (installed): `jax.distributed` exports only
`initialize`, `is_initialized` and `shutdown`; `jax.experimental.multihost_utils.sync_global_devices` is
a barrier made of an all-gather (a device collective in a compiled program, no timeout of its own), and
its `live_devices` (marked unstable) is itself a barrier over the live processes, so a failing process
asking alone would wait for peers that never ask. orbax's public `multihost.sync_global_processes`
runs `sync_global_devices` by default and reads this same private attribute. jax 0.11 could not be
checked (the package index this project installs from stops at 0.10.2). If a JAX release moves the
attribute, this function is the only place to change.
"""

from __future__ import annotations

from typing import Any


def coordination_client() -> Any:
    """The `DistributedRuntimeClient` of this process, or None before `jax.distributed.initialize`."""
    from jax._src import distributed as jax_distributed  # private: no public API (module docstring)

    return jax_distributed.global_state.client


__all__ = ["coordination_client"]
