"""Training checkpoints that verify themselves (orbax `CheckpointManager`): arrays, a JSON record and
a manifest, written atomically; the newest *verified* one restored, bad ones moved aside.

    ckpt = Checkpointer(out_dir / "checkpoints", keep=3)
    ckpt.save(step, {"params": ..., "opt_state": ..., "key": ...}, {"data_position": ..., "config": ...})
    ckpt.commit()                                      # wait for the write; raise CheckpointWriteError
    state, meta = ckpt.restore_latest(like=state)      # None when there is no checkpoint at all

A checkpoint at step s holds the state after s updates (the next step to run is s). Each one holds
three orbax items: `state` (the arrays), `meta` (JSON) and `manifest`: the step, a sha256 of the
meta (so of its config) and, per array, shape, dtype, finite-ness and a 64-bit content fingerprint
computed on device (`fingerprints`). Orbax writes the step into a temporary directory and renames
it when every item is complete, so the manifest is committed with, never before, the arrays; a run
killed at any moment leaves a whole checkpoint or a temporary directory that is ignored.

Restore checks the manifest (its own sha256, the shapes of this run's state), restores, and checks
every fingerprint and the meta's hash. A checkpoint that fails is reported on stderr by path and
renamed to `<step>.corrupt-<n>` (never deleted), and the next older one is tried. Orbax's own
retention is off: older checkpoints are deleted only after a newer one is committed and its
manifest read back (`commit`), so the last good checkpoint is never deleted first.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bmrl.distributed import main_writes, to_host
from bmrl.rundir import OutputNotWritable, probe_writable  # exported here too: the checkpoint's output checks

MANIFEST_FORMAT = 1


class CheckpointError(RuntimeError):
    """Base of the checkpoint errors below."""


class CheckpointNonFinite(CheckpointError):
    """Refused to write a checkpoint whose arrays hold nan or inf (a guard: exit 3)."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint is unreadable, partial, or its content differs from its manifest."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint holds a different state structure than this run builds (bad input: exit 2)."""


class NoGoodCheckpoint(CheckpointError):
    """Every checkpoint in the directory failed verification (exit 2)."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (disk full, permissions...); the previous one is kept (exit 3)."""


# ------------------------------------------------------------------ content fingerprints
def _words(x: jax.Array) -> jax.Array:
    """The raw bits of `x` as uint32 (one word per element; two trailing words for 64-bit types)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    bits = jnp.dtype(x.dtype).itemsize * 8
    if bits in (32, 64):
        return jax.lax.bitcast_convert_type(x, jnp.uint32)  # 64-bit: [..., 2]
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{bits}")).astype(jnp.uint32)


def _leaf_print(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(lane a, lane b, finite) of one array: a = sum(w_i * word_i), b = sum(v_i * rotl(word_i, 13))
    mod 2**32 with odd weights w_i, v_i from the element's position i (two multiplicative hashes),
    so any change of one element changes both lanes and a change of several is missed with odds
    ~2**-64; integer sums make it independent of sharding and reduction order. ~10 integer ops an
    element, one pass, on device."""
    w = _words(x)
    idx = jnp.zeros(w.shape, jnp.uint32)
    stride = 1
    for d in reversed(range(w.ndim)):  # row-major position without reshaping a sharded array
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, w.shape, d) * jnp.uint32(stride % 2**32)
        stride *= w.shape[d]
    w1 = idx * jnp.uint32(0x9E3779B1) + jnp.uint32(0x7F4A7C15) | jnp.uint32(1)
    w2 = idx * jnp.uint32(0x85EBCA6B) + jnp.uint32(0xC2B2AE35) | jnp.uint32(1)
    a = jnp.sum(w * w1, dtype=jnp.uint32)
    b = jnp.sum(((w << 13) | (w >> 19)) * w2, dtype=jnp.uint32)
    finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.asarray(True)
    return a, b, finite


# All leaves in ONE program: a launch per leaf (as before) hung a 2-process CPU run, one process's
# device waiting in a Gloo all-reduce of one leaf's program while its other device's launch of the
# next waited on XLA:CPU's execution semaphore (py-spy/gdb); one launch leaves nothing to interleave.
_print_all = jax.jit(lambda leaves: [_leaf_print(x) for x in leaves])


def _on_one_mesh(leaves: list) -> list:
    """`leaves` as arrays on one set of devices (jit needs that): leaves off the mesh the sharded ones
    use (host arrays, a key on one device) are placed on it replicated; every process holds them whole."""
    mesh = next((x.sharding.mesh for x in leaves
                 if isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.NamedSharding)), None)
    if mesh is None:  # device_put: jnp.asarray of a host array compiles a program per shape
        return [x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x)) for x in leaves]
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return [x if isinstance(x, jax.Array) and getattr(x.sharding, "mesh", None) == mesh
            else jax.device_put(np.asarray(x), replicated) for x in leaves]


def _paths(tree: Any) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(p, simple=True, separator="/"), x) for p, x in flat]


def fingerprints(tree: Any) -> dict[str, dict]:
    """Per array of `tree`: {path: {shape, dtype, fingerprint (16 hex digits), finite}}, computed on
    device, in one jitted program (works on sharded and multi-host arrays)."""
    named = _paths(tree)
    leaves = _on_one_mesh([x for _, x in named])
    out = to_host(_print_all(leaves))  # replicated scalars, readable on every process
    return {
        name: {"shape": list(x.shape), "dtype": str(x.dtype), "fingerprint": f"{int(a):08x}{int(b):08x}",
               "finite": bool(f)}
        for (name, _), x, (a, b, f) in zip(named, leaves, out)
    }


def _brief(err: BaseException, limit: int = 240) -> str:
    """An exception's text on one line, cut at `limit` characters (orbax errors span pages)."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit] + " ..."


class _QuietOrbax(logging.Filter):
    """Drops orbax's own tracebacks of a failed background save while `commit` reports it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def _sha256(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def make_manifest(step: int, arrays: dict[str, dict], meta: dict) -> dict:
    """The manifest of a checkpoint; its `sha256` covers every other field."""
    body = {"format": MANIFEST_FORMAT, "step": int(step), "meta_sha256": _sha256(meta),
            "config_sha256": _sha256(meta.get("config")), "all_finite": all(a["finite"] for a in arrays.values()),
            "arrays": arrays}
    return dict(body, sha256=_sha256(body))


def check_manifest(manifest: Any, step: int) -> dict:
    """`manifest` if it is whole and belongs to `step`; raises CheckpointCorrupt otherwise."""
    if not isinstance(manifest, dict) or "sha256" not in manifest:
        raise CheckpointCorrupt("the manifest is not a manifest")
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    if _sha256(body) != manifest["sha256"]:
        raise CheckpointCorrupt("the manifest's own checksum does not match (the manifest was altered)")
    if manifest.get("step") != int(step):
        raise CheckpointCorrupt(f"the manifest is for step {manifest.get('step')}, not {step}")
    return manifest


def _dtype(x: Any) -> str:
    """The dtype `jnp.asarray(x)` has, read on the host (no program compiled for a host array)."""
    return str(x.dtype if isinstance(x, jax.Array) else jax.dtypes.canonicalize_dtype(np.result_type(x)))


def _abstract(tree: Any) -> Any:
    """Shape/dtype/sharding placeholders of `tree`, the restore target orbax needs."""

    def one(x):
        x = jax.numpy.asarray(x) if not hasattr(x, "shape") else x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree.map(one, tree)


class Checkpointer:
    """Save the steps it is given (when: `bmrl.loop.Schedule`), keep the last `keep` committed, restore the newest
    verified one."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, *, async_save: bool = True):
        if keep < 1:
            raise ValueError(f"checkpoint.keep must be >= 1, got {keep}.")
        self.directory = os.path.abspath(os.fspath(directory))
        self.keep = int(keep)
        self._pending: int | None = None
        self.last_good: int | None = None  # newest checkpoint known to be whole (committed or verified)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # retention is ours: delete only after a newer one is committed
            create=True,
            cleanup_tmp_directories=True,  # leftovers of a save interrupted by a kill
            enable_async_checkpointing=async_save,
        )
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta", "manifest")
        )

    # ------------------------------------------------------------------ queries
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (not yet verified), or None."""
        self.manager.reload()
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def step_path(self, step: int) -> str:
        return os.path.join(self.directory, str(int(step)))

    def describe_last_good(self) -> str:
        """'step N (path)' of the newest good checkpoint, or 'none (...)'."""
        if self.last_good is None:
            return "none (a rerun starts from step 0)"
        return f"step {self.last_good} ({self.step_path(self.last_good)})"

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Start writing `state` (a pytree of arrays) and `meta` (JSON-able) as checkpoint `step`, with
        its manifest. Raises CheckpointNonFinite for nan/inf arrays, CheckpointWriteError when the
        write cannot start. Call `commit()` to wait for it (asynchronous writes)."""
        self.commit()
        arrays = fingerprints(state)
        bad = [name for name, a in arrays.items() if not a["finite"]]
        if bad:
            raise CheckpointNonFinite(
                f"refusing to checkpoint step {step}: the training state holds nan or inf values "
                f"(in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''})."
            )
        meta = json.loads(json.dumps(dict(meta, step=int(step))))  # the JSON that will be restored
        try:
            saved = self.manager.save(
                int(step), force=force,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta),
                                        manifest=ocp.args.JsonSave(make_manifest(step, arrays, meta))),
            )
        except Exception as err:  # any failure to start the write stops the run
            raise self._write_error(step, err) from err
        if saved:
            self._pending = int(step)
        return saved

    def _write_error(self, step: int, err: BaseException) -> CheckpointWriteError:
        base = err
        while base is not None and not isinstance(base, OSError):
            base = base.__cause__ or base.__context__
        why = ("no space left on device" if isinstance(base, OSError) and base.errno == errno.ENOSPC
               else f"{type(err).__name__}: {_brief(err)}")
        return CheckpointWriteError(
            f"writing checkpoint step {step} to {self.step_path(step)} failed: {why}. The previous checkpoint "
            f"is kept: {self.describe_last_good()}. Free space (or fix the directory) and rerun the same command "
            "to resume from it."
        )

    def commit(self) -> None:
        """Wait for the pending write; check it landed with a readable manifest; then delete
        checkpoints beyond the newest `keep`. Raises CheckpointWriteError when the write failed."""
        step, self._pending = self._pending, None
        if step is None:
            return
        quiet = _QuietOrbax()
        logging.getLogger("absl").addFilter(quiet)
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
            self.manager.reload()
            if step not in self.manager.all_steps():
                raise OSError(errno.EIO, "the checkpoint directory did not appear after the write")
            self._read_manifest(step)
        except Exception as err:
            raise self._write_error(step, err) from err
        finally:
            logging.getLogger("absl").removeFilter(quiet)
        self.last_good = step
        for old in sorted(self.manager.all_steps())[: -self.keep]:
            self.manager.delete(old)

    # ------------------------------------------------------------------ restore
    def _read_manifest(self, step: int) -> dict:
        try:
            out = self.manager.restore(int(step), args=ocp.args.Composite(manifest=ocp.args.JsonRestore()))
        except Exception as err:
            raise CheckpointCorrupt(f"the manifest is missing or unreadable ({type(err).__name__}: {_brief(err)})") from err
        return check_manifest(dict(out["manifest"]), step)

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """Checkpoint `step` restored into the structure, dtypes and shardings of `like`, verified
        against its manifest. Raises CheckpointCorrupt or CheckpointMismatch."""
        manifest = self._read_manifest(step)
        want = {name: (list(np.shape(x)), _dtype(x)) for name, x in _paths(like)}
        have = {name: (a["shape"], a["dtype"]) for name, a in manifest["arrays"].items()}
        if want != have:
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            raise CheckpointMismatch(
                f"checkpoint {self.step_path(step)} holds a different training state than this run builds "
                f"(differs at {', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}): the model or optimizer "
                "config changed. Use a new out_dir, or restore the config of that run."
            )
        try:
            out = self.manager.restore(
                int(step),
                args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(like)), meta=ocp.args.JsonRestore()),
            )
            state, meta = out["state"], dict(out["meta"])
        except Exception as err:  # unreadable arrays: the checkpoint is unusable
            raise CheckpointCorrupt(f"its arrays are unreadable ({type(err).__name__}: {_brief(err)})") from err
        if _sha256(meta) != manifest["meta_sha256"]:
            raise CheckpointCorrupt("its meta record differs from the manifest")
        got = fingerprints(state)
        wrong = [n for n, a in manifest["arrays"].items() if got[n]["fingerprint"] != a["fingerprint"]]
        if wrong:
            raise CheckpointCorrupt(
                f"{len(wrong)} of {len(got)} arrays differ from the manifest ({', '.join(wrong[:3])}"
                f"{' ...' if len(wrong) > 3 else ''})"
            )
        if not all(a["finite"] for a in got.values()):
            raise CheckpointCorrupt("it holds nan or inf values")
        return state, meta

    def move_aside(self, step: int) -> str:
        """Rename checkpoint `step` to `<step>.corrupt-<n>` (kept for inspection); returns the new path."""
        src = self.step_path(step)
        n = 1
        while os.path.exists(f"{src}.corrupt-{n}"):
            n += 1
        dst = f"{src}.corrupt-{n}"
        # process 0 renames; every process sees the rename before listing steps again
        main_writes(f"bmrl-move-aside-{step}", lambda: os.rename(src, dst))
        self.manager.reload()
        return dst

    def restore_latest(self, like: Any) -> tuple[Any, dict] | None:
        """The newest checkpoint that verifies, or None when there is none at all. Each bad one is
        reported on stderr and moved aside; raises NoGoodCheckpoint when every one is bad."""
        bad = []
        for step in reversed(self.all_steps()):
            try:
                out = self.restore(step, like)
            except CheckpointCorrupt as err:
                moved = self.move_aside(step)
                print(f"bmrl: checkpoint {self.step_path(step)} is unusable: {err}; moved it to {moved} "
                      "and trying the previous one.", file=sys.stderr, flush=True)
                bad.append(moved)
                continue
            self.last_good = step
            return out
        if bad:
            raise NoGoodCheckpoint(
                f"no usable checkpoint in {self.directory}: all {len(bad)} failed verification and were moved "
                f"aside ({', '.join(bad)}). Rerunning now starts from step 0; to keep the run, put a good copy of "
                f"a checkpoint back into {self.directory}."
            )
        return None

    def wait(self) -> None:
        """Block until a background (async) save has finished, and commit it."""
        self.commit()

    def close(self) -> None:
        """Commit a pending save when possible and release orbax's threads (never raises for a write
        that failed: `commit` is where that is reported)."""
        try:
            self.commit()
        except CheckpointWriteError:
            pass
        finally:
            try:
                self.manager.close()
            except Exception:  # the write error was already reported by commit
                pass


def key_data(key: jax.Array) -> np.ndarray:
    """A typed PRNG key as its raw uint32 data (what a checkpoint stores)."""
    return np.asarray(jax.random.key_data(key))


__all__ = [
    "CheckpointCorrupt", "CheckpointError", "CheckpointMismatch", "CheckpointNonFinite", "CheckpointWriteError",
    "Checkpointer", "NoGoodCheckpoint", "OutputNotWritable", "check_manifest", "fingerprints", "key_data",
    "make_manifest", "probe_writable",
]
