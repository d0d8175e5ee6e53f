"""Content hashes of levels: two tasks hash alike exactly when they build the same level.

    hashes = level_hashes(env, {"seed": seeds})     # uint64[n], a JAX env: its initial states
    hashes = level_hashes(None, [task, ...])        # uint64[n], a Python env's task dicts

Distinct seeds do not mean distinct levels (the corridor has two: exit left or right), so held-out
splits compare content. A JAX level's content is the leaves of `env._reset(PRNGKey(0), task)`
computed for all tasks by one jitted vmap; a Python task's content is its canonical JSON (`canonical`:
sorted keys, no whitespace, UTF-8), so key order and spacing in the task file do not make two tasks
differ. The hash is blake2b (8 bytes) of each row's bytes, the same on every run and machine.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

__all__ = ["canonical", "level_hashes"]

CHUNK = 256  # tasks reset per jitted call (one compile per env and chunk shape; small suites hash little)


def level_hashes(env, tasks: Any) -> np.ndarray:
    """uint64[n] content hashes of `tasks`: `{"seed": int[n]}` of JAX env `env`, or a list of task dicts
    (a Python env's; `env` unused)."""
    if isinstance(tasks, (list, tuple)):
        return np.fromiter((_digest(canonical(t).encode()) for t in tasks), np.uint64, len(tasks))
    seeds = np.asarray(tasks["seed"], np.int32)
    out = np.empty(len(seeds), np.uint64)
    reset = _batched_reset(env)
    for lo in range(0, len(seeds), CHUNK):
        chunk = seeds[lo:lo + CHUNK]
        padded = np.pad(chunk, (0, CHUNK - len(chunk)))  # one shape: one compile
        rows = _rows(reset(padded))[: len(chunk)]
        out[lo:lo + len(chunk)] = [_digest(r.tobytes()) for r in rows]
    return out


def canonical(task: dict) -> str:
    """`task` as canonical JSON: sorted keys, no whitespace, non-ASCII kept (hashed as UTF-8)."""
    return json.dumps(task, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _rows(states) -> np.ndarray:
    """The leaves of a batch of states as one little-endian byte row per level, `uint8[n, bytes]`."""
    import jax

    leaves = [np.asarray(x) for x in jax.tree.leaves(states)]
    n = leaves[0].shape[0]
    parts = [x.reshape(n, -1).astype(x.dtype.newbyteorder("<")).view(np.uint8) for x in leaves]
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def _batched_reset(env):
    """`reset(seeds int32[CHUNK]) -> states` of `env`, compiled once per env (`bmrl.compiles`)."""
    import jax

    from bmrl import compiles

    key = jax.random.PRNGKey(0)
    return compiles.program("level_reset", env, lambda: jax.jit(jax.vmap(lambda s: env._reset(key, {"seed": s}))))
