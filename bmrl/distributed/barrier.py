"""Barriers, and the one way a run's files are written: process 0 writes, every process waits.

A multi-process run makes the same calls on every process; only process 0 writes a run's outputs
(`is_main`), so `main_writes` runs the write there and then holds every process at a barrier until the
file is on disk for any of them to read. The barrier is the coordination service's, not a device
collective: no XLA program, and a timeout of its own (a process that never comes raises, it does not
hang the others).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from bmrl.distributed._coordination import coordination_client

BARRIER_TIMEOUT_S = 900  # how long a process waits at a barrier for the others (compiles may differ by minutes)
_barriers: dict[str, int] = {}


def is_main() -> bool:
    """True on process 0, the one process that writes a run's files (`bmrl.rundir`, `bmrl.metrics`, the
    Hugging Face export, reports); the others compute the same values and write nothing (orbax
    checkpoints are the exception: every process writes its shards). Never starts the JAX backend:
    before `jax.distributed` is initialised this is the only process."""
    return not jax.distributed.is_initialized() or jax.process_index() == 0


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process reaches the barrier `name` (a no-op for one process). A barrier of
    the coordination service, not a device collective: no XLA program, and its own timeout (a
    process that never comes raises instead of hanging). Names may repeat (each use is numbered)."""
    if not jax.distributed.is_initialized() or jax.process_count() == 1:
        return
    _barriers[name] = _barriers.get(name, 0) + 1
    coordination_client().wait_at_barrier(f"{name}#{_barriers[name]}", int(timeout_s * 1000))


def main_writes(name: str, write: Callable[[], Any], *, wait: bool = True) -> None:
    """Run `write` on process 0 alone, then wait at the barrier `name` until every process is there: when
    this returns, what process 0 wrote is on disk for any process to read (outputs on a filesystem every
    host sees). With one process: `write()`.

    `wait=False` skips the barrier, for a file no other process reads while the run goes on (a log
    appended step by step): process 0 still writes alone, without a meeting per line. Every process
    must make the same calls either way."""
    if is_main():
        write()
    if wait:
        barrier(name)


__all__ = ["BARRIER_TIMEOUT_S", "barrier", "is_main", "main_writes"]
