"""The non-finite guard covers overflow anywhere in the update, not only in the gradients: a learning
rate that overflows float32 (lr=1e39 once passed the guard and ended in a CheckpointNonFinite
traceback), gradients whose square overflows Adam's second moment, and the CLI stops such a run with
exit 3 and a message naming the step and the last good checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bmrl.learn import make_optimizer
from bmrl.learn import step as step_lib
from bmrl.learn.optim import skip_counts
from tests.test_train import flat


def _one_step(params, grads, tx):
    state = tx.init(params)
    loss = jnp.float32(1.0)
    updates, new_state = tx.update(grads, state, params, loss=loss)
    new_params = optax.apply_updates(params, updates)
    kept = step_lib.keep_finite(params, state, new_params, new_state, loss, optax.tree.norm(grads))
    return state, new_params, new_state, kept


def test_guard_catches_overflow_after_finite_gradients():
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    # lr=1e39 is inf in float32: the gradients are finite, the step is not.
    state, raw, _, (p, s) = _one_step(params, jax.tree.map(jnp.ones_like, params), make_optimizer(1e39))
    assert not np.isfinite(np.asarray(raw["w"])).all()  # what used to be applied
    assert flat(p).tobytes() == flat(params).tobytes()
    assert int(skip_counts(s)["consecutive_skips"]) == 1 and int(skip_counts(s)["total_skips"]) == 1
    assert flat(s.inner_state).tobytes() == flat(state.inner_state).tobytes()
    # Gradients of 1e20: finite, but Adam's nu = g**2 overflows while the params stay finite.
    grads = jax.tree.map(lambda x: jnp.full_like(x, 1e20), params)
    _, raw, raw_state, (p, s) = _one_step(params, grads, make_optimizer(1e-3, max_grad_norm=None))
    assert np.isfinite(flat(raw)).all() and not np.isfinite(flat(raw_state.inner_state)).all()
    assert flat(p).tobytes() == flat(params).tobytes() and int(skip_counts(s)["total_skips"]) == 1
    # A finite step goes through untouched and resets the count.
    _, raw, raw_state, (p, s) = _one_step(params, jax.tree.map(jnp.ones_like, params), make_optimizer(1e-3))
    assert flat(p).tobytes() == flat(raw).tobytes() and int(skip_counts(s)["consecutive_skips"]) == 0


def test_cli_diverged_run_exits_3_naming_step_and_checkpoint(tmp_path, capsys, monkeypatch):
    """The command's side of the guard: a run that stops on non-finite updates exits 3 with the
    message (step, last good checkpoint), no traceback. (lr=1e39 itself is now refused by the config
    with exit 2; the guard on a real diverging update is tested above and in tests/test_train.py.)"""
    import bmrl.train
    from bmrl.cli import main
    from tests.e2e.test_faults_train import write_config

    cfg = write_config(tmp_path, steps=3, max_nonfinite=1)
    with pytest.raises(SystemExit) as refused:
        main(["train", "--config", str(cfg), f"out_dir={tmp_path / 'refused'}", "train.optim.lr=1e39"])
    assert refused.value.code == 2 and not (tmp_path / "refused").exists()

    def diverge(cfg, progress=None, run=None, evaluate=True):
        raise bmrl.train.NonFiniteError("stopping at step 1: 1 non-finite updates in a row. Last good checkpoint: none.")

    monkeypatch.setattr(bmrl.train, "train", diverge)
    status = main(["train", "--config", str(cfg), f"out_dir={tmp_path / 'run'}", "--no-progress"])
    err = capsys.readouterr().err
    assert status == 3, err
    assert "stopping at step 1" in err and "Last good checkpoint: none" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_one_guard_for_no_signal_and_non_finite_steps():
    """`keep_finite` with `signal`: a minibatch without signal keeps params and state as they were (no skip
    counted), a non-finite loss is counted signal or not, and only a finite step with signal is taken."""
    params = {"w": jnp.ones((4, 3))}
    tx = make_optimizer(1e-3)
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, new_state = tx.update(grads, state, params, loss=jnp.float32(1.0))
    new_params = optax.apply_updates(params, updates)
    norm = optax.tree.norm(grads)

    def run(loss, signal):
        p, s = step_lib.keep_finite(params, state, new_params, new_state, jnp.float32(loss), norm, jnp.bool_(signal))
        return flat(p), int(skip_counts(s)["total_skips"]), flat(s.inner_state)

    p, skips, inner = run(1.0, True)
    assert p.tobytes() == flat(new_params).tobytes() and skips == 0 and inner.tobytes() == flat(new_state.inner_state).tobytes()
    for loss, counted in ((1.0, 0), (float("nan"), 1)):  # no signal: nothing moves; a NaN loss is still counted
        p, skips, inner = run(loss, False)
        assert p.tobytes() == flat(params).tobytes() and inner.tobytes() == flat(state.inner_state).tobytes()
        assert skips == counted
    assert run(float("nan"), True)[1] == 1 and run(float("nan"), True)[0].tobytes() == flat(params).tobytes()
    assert bool(step_lib.signal_of(jnp.zeros(3))) is False and bool(step_lib.signal_of(jnp.array([0.0, -1e-9, 0.0])))
