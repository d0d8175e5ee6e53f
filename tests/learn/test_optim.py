"""Optimizer chain, learning-rate schedule and the non-finite update guard."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bmrl.learn import optim


def close(a, b, tol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_cosine_schedule_values():
    lr = optim.make_schedule(2.0, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    steps = jnp.array([0, 5, 10, 60, 110, 500])
    # warmup 2 * s / 10; then 2 * (.1 + .9 * (1 + cos(pi p)) / 2) with p = (s - 10) / 100.
    expected = [0.0, 1.0, 2.0, 2.0 * (0.1 + 0.9 * 0.5), 0.2, 0.2]
    close(jax.vmap(lr)(steps), expected)
    close(lr(35), 2.0 * (0.1 + 0.45 * (1 + np.cos(np.pi * 0.25))))


def test_constant_schedule_and_no_warmup():
    lr = optim.make_schedule(1e-3, warmup_steps=4, total_steps=100, schedule="constant")
    close(jax.vmap(lr)(jnp.array([0, 2, 4, 1000])), [0.0, 5e-4, 1e-3, 1e-3])
    lr = optim.make_schedule(1.0, warmup_steps=0, total_steps=4)
    close(jax.vmap(lr)(jnp.array([0, 2, 4])), [1.0, 0.5, 0.0])


def test_schedule_errors():
    with pytest.raises(ValueError, match="total_steps > warmup_steps"):
        optim.make_schedule(1.0, warmup_steps=10, total_steps=10)
    with pytest.raises(ValueError, match="'cosine', 'constant'"):
        optim.make_schedule(1.0, schedule="linear")
    with pytest.raises(ValueError, match="min_lr_ratio"):
        optim.make_schedule(1.0, total_steps=5, min_lr_ratio=2.0)


def _one_update(tx, grads, params):
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    return updates, state


def test_adamw_step_with_clipping_and_decay_mask():
    # b1 = b2 = 0 and eps = 1 make adam's step g / (|g| + 1), so the clipping shows up.
    params = {"w": jnp.array([[1.0, 2.0]]), "b": jnp.array([1.0, 1.0])}
    grads = {"w": jnp.array([[30.0, 0.0]]), "b": jnp.array([0.0, 40.0])}  # global norm 50
    kw = dict(lr=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5, b1=0.0, b2=0.0, eps=1.0,
              schedule="constant")
    updates, _ = _one_update(optim.make_optimizer(max_grad_norm=5.0, **kw), grads, params)
    # clipped grads: w [3, 0], b [0, 4]; decay 0.5 * p on the matrix only.
    close(updates["w"], -0.1 * (np.array([[3 / 4, 0.0]]) + 0.5 * np.array([[1.0, 2.0]])))
    close(updates["b"], -0.1 * np.array([0.0, 4 / 5]))
    updates, _ = _one_update(optim.make_optimizer(max_grad_norm=None, **kw), grads, params)
    close(updates["b"], -0.1 * np.array([0.0, 40 / 41]))
    updates, _ = _one_update(
        optim.make_optimizer(max_grad_norm=5.0, decay_matrices_only=False, **kw), grads, params)
    close(updates["b"], -0.1 * (np.array([0.0, 4 / 5]) + 0.5))


def test_optimizer_reduces_a_quadratic():
    tx = optim.make_optimizer(0.3, warmup_steps=2, total_steps=50, weight_decay=0.0)
    params = jnp.array([3.0, -2.0])
    state = tx.init(params)
    loss_fn = lambda p: jnp.sum(p**2)

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, s = tx.update(g, s, p, loss=loss)
        return optax.apply_updates(p, u), s

    for _ in range(50):
        params, state = step(params, state)
    assert float(loss_fn(params)) < 0.05


def test_nonfinite_update_skipped_and_counted():
    tx = optim.make_optimizer(0.1, warmup_steps=0, total_steps=100, weight_decay=0.1)
    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    good = {"w": jnp.full((2, 2), 0.5), "b": jnp.ones(2)}
    bad = {"w": jnp.array([[0.5, jnp.nan], [0.5, 0.5]]), "b": jnp.ones(2)}
    inf = {"w": jnp.full((2, 2), 0.5), "b": jnp.array([1.0, jnp.inf])}

    @jax.jit
    def step(p, s, g, loss):
        u, s = tx.update(g, s, p, loss=loss)
        return optax.apply_updates(p, u), s

    state = tx.init(params)
    p1, s1 = step(params, state, good, jnp.float32(1.0))
    assert not np.allclose(p1["w"], params["w"])
    counts = optim.skip_counts(s1)
    assert int(counts["consecutive_skips"]) == 0 and int(counts["total_skips"]) == 0

    # nan gradient, inf gradient, finite gradients with a nan loss: all skipped.
    p, s = p1, s1
    for n, (g, loss) in enumerate([(bad, 1.0), (inf, 1.0), (good, jnp.nan)], start=1):
        p, s = step(p, s, g, jnp.float32(loss))
        jax.tree.map(np.testing.assert_array_equal, p, p1)
        jax.tree.map(np.testing.assert_array_equal, s.inner_state, s1.inner_state)
        counts = optim.skip_counts(s)
        assert int(counts["consecutive_skips"]) == n and int(counts["total_skips"]) == n
        assert not bool(s.last_finite)

    # A finite step applies and resets the consecutive count, not the total.
    p, s = step(p, s, good, jnp.float32(1.0))
    assert not np.allclose(p["w"], p1["w"]) and np.isfinite(np.asarray(p["w"])).all()
    counts = optim.skip_counts(s)
    assert int(counts["consecutive_skips"]) == 0 and int(counts["total_skips"]) == 3
    # Same result as if the skipped steps never happened.
    p_ref, _ = step(*step(params, state, good, jnp.float32(1.0)), good, jnp.float32(1.0))
    jax.tree.map(np.testing.assert_array_equal, p, p_ref)


def test_skip_counts_needs_the_wrapper():
    tx = optim.make_optimizer(0.1, total_steps=10, skip_nonfinite_updates=False)
    with pytest.raises(ValueError, match="skip_nonfinite"):
        optim.skip_counts(tx.init({"w": jnp.ones(2)}))
    # The wrapper also works around any other optax transformation, found inside a tuple state.
    wrapped = optim.skip_nonfinite(optax.sgd(1.0))
    state = (optax.EmptyState(), wrapped.init(jnp.ones(2)))
    assert int(optim.skip_counts(state)["total_skips"]) == 0


def test_all_finite():
    assert bool(optim.all_finite({"a": jnp.ones(3), "b": [jnp.zeros(2)]}))
    assert not bool(optim.all_finite({"a": jnp.ones(3), "b": [jnp.array([0.0, -jnp.inf])]}))
    assert bool(optim.all_finite({}))
