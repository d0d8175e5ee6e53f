"""Fault injection on checkpoints (no model, ~seconds): a corrupt, partial or unreadable newest
checkpoint is reported by path, moved aside and the previous one restored bit for bit; all bad ->
NoGoodCheckpoint; another model's checkpoint -> CheckpointMismatch (nothing moved); a write that
fails (ENOSPC, at the start or in orbax's background thread) raises CheckpointWriteError at that
save and keeps the previous checkpoint; a full disk outside a checkpoint exits 3."""

import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from orbax.checkpoint._src.handlers import json_checkpoint_handler

from bmrl.checkpoint import (
    Checkpointer,
    CheckpointMismatch,
    CheckpointWriteError,
    NoGoodCheckpoint,
    OutputNotWritable,
    fingerprints,
    key_data,
    probe_writable,
)
from tests.paths import ROOT
from tests.xla import EIGHT_CPU_DEVICES


def _state(seed: int, rows: int = 64):
    k = jax.random.key(seed)
    return {"params": {"w": jax.random.normal(k, (rows, 48)), "b": jnp.arange(3, dtype=jnp.int32) + seed},
            "opt_state": (jax.random.uniform(jax.random.fold_in(k, 1), (rows, 48)), jnp.int32(seed)),
            "key": key_data(jax.random.key(7))}


def _largest(directory):
    files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
    return max(files, key=os.path.getsize)


def _flip(path):
    data = bytearray(open(path, "rb").read())
    for i in (len(data) // 2, len(data) // 2 + 9):
        data[i] ^= 0x5A
    open(path, "wb").write(bytes(data))


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


CORRUPTIONS = {
    "flipped bytes in the largest array file": lambda d: _flip(_largest(os.path.join(d, "state"))),
    "truncated largest array file": lambda d: _truncate(_largest(os.path.join(d, "state"))),
    "missing array file": lambda d: os.remove(_largest(os.path.join(d, "state"))),
    "missing manifest": lambda d: os.remove(os.path.join(d, "manifest", "metadata")),
    "altered manifest": lambda d: _flip(os.path.join(d, "manifest", "metadata")),
    "missing meta": lambda d: os.remove(os.path.join(d, "meta", "metadata")),
    "missing array metadata": lambda d: os.remove(os.path.join(d, "state", "_METADATA")),
}


def _two_checkpoints(directory):
    ck = Checkpointer(directory, keep=5)
    for step in (1, 2):
        ck.save(step, _state(step), {"data_position": step * 3, "config": {"seed": 0}})
        ck.commit()
    ck.close()


def _same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_newest_falls_back_to_previous_bitwise(tmp_path, kind, capsys):
    _two_checkpoints(tmp_path / "ck")
    CORRUPTIONS[kind](str(tmp_path / "ck" / "2"))
    ck = Checkpointer(tmp_path / "ck", keep=5)
    state, meta = ck.restore_latest(_state(0))
    assert meta["step"] == 1 and meta["data_position"] == 3 and ck.last_good == 1
    assert _same(state, _state(1))
    err = capsys.readouterr().err
    assert f"{tmp_path / 'ck' / '2'} is unusable" in err and "2.corrupt-1" in err
    assert sorted(os.listdir(tmp_path / "ck")) == ["1", "2.corrupt-1"]  # moved aside, never deleted
    ck.close()


def test_fingerprint_sees_one_flipped_bit_anywhere():
    s = _state(3)
    base = fingerprints(s)
    w = np.asarray(s["params"]["w"]).copy()
    w.view(np.uint32)[17, 5] ^= 1  # one bit of one element
    changed = fingerprints(dict(s, params=dict(s["params"], w=jnp.asarray(w))))
    assert changed["params/w"]["fingerprint"] != base["params/w"]["fingerprint"]
    assert {k: v for k, v in changed.items() if k != "params/w"} == {k: v for k, v in base.items() if k != "params/w"}
    swapped = np.asarray(s["params"]["w"]).copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # same values, other places
    assert fingerprints({"w": jnp.asarray(swapped)})["w"] != fingerprints({"w": s["params"]["w"]})["w"]
    assert not fingerprints({"x": jnp.array([1.0, jnp.inf])})["x"]["finite"]


def test_all_bad_is_a_clear_error_and_mismatch_moves_nothing(tmp_path):
    _two_checkpoints(tmp_path / "ck")
    ck = Checkpointer(tmp_path / "ck", keep=5)
    with pytest.raises(CheckpointMismatch, match="different training state.*params/w"):
        ck.restore_latest(_state(0, rows=65))  # another model: bad input, the checkpoints stay
    assert sorted(os.listdir(tmp_path / "ck")) == ["1", "2"]
    for step in (1, 2):
        CORRUPTIONS["flipped bytes in the largest array file"](str(tmp_path / "ck" / str(step)))
    with pytest.raises(NoGoodCheckpoint, match="all 2 failed verification"):
        ck.restore_latest(_state(0))
    assert sorted(os.listdir(tmp_path / "ck")) == ["1.corrupt-1", "2.corrupt-1"]
    ck.close()


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["start", "background"])
def test_enospc_raises_at_that_save_and_keeps_the_previous(tmp_path, monkeypatch, where):
    ck = Checkpointer(tmp_path / "ck", keep=1)
    ck.save(1, _state(1), {"data_position": 3})
    ck.commit()
    with monkeypatch.context() as m:
        if where == "start":  # the first write of the save fails
            m.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", _enospc)
        else:  # orbax's finalize thread fails after save() returned
            m.setattr(ocp.CheckpointManager, "_finalize", _enospc)
        with pytest.raises(CheckpointWriteError, match=r"step 2 .*no space left on device.*kept: step 1"):
            ck.save(2, _state(2), {"data_position": 6})
            ck.commit()  # the same step: the loop commits right after saving
    assert ck.all_steps() == [1]  # keep=1, yet the last good one was not deleted
    ck.save(3, _state(3), {"data_position": 9})  # the next save works, and only then is 1 deleted
    ck.commit()
    assert ck.all_steps() == [3]
    state, meta = Checkpointer(tmp_path / "ck").restore_latest(_state(0))
    assert meta["step"] == 3 and _same(state, _state(3))
    ck.close()


def test_probe_writable(tmp_path, monkeypatch):
    probe_writable(tmp_path / "new" / "deeper")  # nearest existing parent is writable
    assert not (tmp_path / "new").exists()  # nothing created
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputNotWritable, match="not a directory"):
        probe_writable(tmp_path / "file" / "out")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores permission bits: make the probe's create fail as EROFS would
        real_open = open
        monkeypatch.setattr("builtins.open", lambda p, *a, **k: _erofs() if str(p).startswith(str(ro)) else real_open(p, *a, **k))
    else:
        ro.chmod(0o500)
    with pytest.raises(OutputNotWritable, match="is not writable"):
        probe_writable(ro / "run")
    assert os.listdir(ro) == []


def _erofs():
    raise OSError(errno.EROFS, "Read-only file system")


def test_cli_full_disk_outside_a_checkpoint_exits_3(tmp_path, monkeypatch, capsys):
    """ENOSPC while writing metrics, the policy or the summary: exit 3 with a message, no traceback;
    any other OSError stays a bug (exit 1 through the traceback)."""
    import bmrl.train
    from bmrl.cli import main

    def full(cfg, progress=None, run=None, evaluate=True):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))

    monkeypatch.setattr(bmrl.train, "train", full)
    (tmp_path / "cfg.yaml").write_text("seed: 0\n")
    args = ["train", "--config", str(tmp_path / "cfg.yaml"), f"out_dir={tmp_path / 'run'}", "--no-progress"]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "no space left on device writing" in err and "metrics.jsonl" in err and "resume" in err
    monkeypatch.setattr(bmrl.train, "train", lambda cfg, progress=None, run=None, evaluate=True: _eacces())
    with pytest.raises(OSError, match="Permission"):
        main(args)


def _eacces():
    raise OSError(errno.EACCES, "Permission denied")


@pytest.mark.multidevice
def test_fingerprints_ignore_sharding_across_a_mesh_change(tmp_path):
    """Saved from 8 devices (a 4x2 mesh), restored onto 1 and onto another mesh: verifies, same prints."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from bmrl.checkpoint import Checkpointer, fingerprints
        mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
        x = jax.random.normal(jax.random.key(0), (64, 48)).astype(jnp.bfloat16)
        state = {{"w": jax.device_put(x, NamedSharding(mesh, P("a", "b"))), "n": jnp.int32(3)}}
        assert fingerprints(state) == fingerprints({{"w": x, "n": jnp.int32(3)}})
        ck = Checkpointer({str(tmp_path / "ck")!r})
        ck.save(1, state, {{}}); ck.commit()
        other = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
        for like in ({{"w": x, "n": jnp.int32(0)}}, {{"w": jax.device_put(x, NamedSharding(other, P(None, "b"))), "n": jnp.int32(0)}}):
            got, _ = ck.restore(1, like)
            assert np.asarray(got["w"]).tobytes() == np.asarray(x).tobytes()
        ck.close()
        print("PRINTS_OK")
        """)
    env = dict(os.environ, XLA_FLAGS=EIGHT_CPU_DEVICES, JAX_PLATFORMS="cpu")
    root = ROOT
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert "PRINTS_OK" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
