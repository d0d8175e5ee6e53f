"""Training checkpoints with orbax `CheckpointManager`: arrays + a JSON record, atomic, last N kept.

    ckpt = Checkpointer(out_dir / "checkpoints", keep=3)
    ckpt.save(step, {"params": ..., "opt_state": ..., "key": ...}, {"data_position": ..., "config": ...})
    state, meta = ckpt.restore_latest(like=state)      # None when there is no finished checkpoint

A checkpoint at step s holds the state after s updates (the next step to run is s). Orbax writes
each step into a temporary directory and renames it when complete, so a run killed at any moment
leaves either a whole checkpoint or a temporary directory that is ignored (and cleaned up) on
resume. `save` refuses arrays holding nan or inf, so a checkpoint never holds them.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bmrl.learn.optim import all_finite


class CheckpointNonFinite(RuntimeError):
    """Refused to write a checkpoint whose arrays hold nan or inf."""


def _abstract(tree: Any) -> Any:
    """Shape/dtype/sharding placeholders of `tree`, the restore target orbax needs."""

    def one(x):
        x = jax.numpy.asarray(x) if not hasattr(x, "shape") else x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree.map(one, tree)


class Checkpointer:
    """Save every `every` steps, keep the last `keep`, restore the latest complete one."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, every: int = 1, *, async_save: bool = True):
        if keep < 1:
            raise ValueError(f"checkpoint.keep must be >= 1, got {keep}.")
        self.directory = os.path.abspath(os.fspath(directory))
        self.every = max(int(every), 0)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            cleanup_tmp_directories=True,  # leftovers of a save interrupted by a kill
            enable_async_checkpointing=async_save,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    # ------------------------------------------------------------------ queries
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        self.manager.reload()
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def due(self, step: int, last_step: int) -> bool:
        """Save after `step` updates? Every `every` steps, and always at the end of the run."""
        return step == last_step or (self.every > 0 and step % self.every == 0)

    # ------------------------------------------------------------------ save / restore
    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Write `state` (a pytree of arrays) and `meta` (JSON-able) as checkpoint `step`."""
        if not bool(all_finite(state)):
            raise CheckpointNonFinite(
                f"refusing to checkpoint step {step}: the training state holds nan or inf values."
            )
        meta = dict(meta, step=int(step))
        return self.manager.save(
            int(step),
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=force,
        )

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """Checkpoint `step` restored into the structure, dtypes and shardings of `like`."""
        out = self.manager.restore(
            int(step),
            args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(like)), meta=ocp.args.JsonRestore()),
        )
        return out["state"], dict(out["meta"])

    def restore_latest(self, like: Any) -> tuple[Any, dict] | None:
        """The newest complete checkpoint, or None when there is none."""
        step = self.latest_step()
        return None if step is None else self.restore(step, like)

    def wait(self) -> None:
        """Block until a background (async) save has finished."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def key_data(key: jax.Array) -> np.ndarray:
    """A typed PRNG key as its raw uint32 data (what a checkpoint stores)."""
    return np.asarray(jax.random.key_data(key))


__all__ = ["CheckpointNonFinite", "Checkpointer", "key_data"]
