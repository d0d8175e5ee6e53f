"""corridor: the oracle's Monte Carlo success within T matches the closed form; dynamics and text."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.envs.corridor import corridor_success_prob
from tests.env_helpers import assert_oracle_matches_closed_form, env_with


def test_closed_form_against_a_direct_dynamic_program():
    for L, eps, T in [(3, 0.2, 5), (6, 0.5, 9), (4, 0.0, 4), (4, 0.0, 3), (1, 0.9, 1)]:
        dist = np.zeros(L + 1)  # probability of having made k successful moves (k = L absorbing)
        dist[0] = 1.0
        for _ in range(T):
            new = dist * eps
            new[1:] += dist[:-1] * (1 - eps)
            new[L] += dist[L] * (1 - eps)
            dist = new
        assert corridor_success_prob(L, eps, T) == pytest.approx(dist[L], abs=1e-12)


@pytest.mark.parametrize("L,eps", [(4, 0.2), (6, 0.4)])
def test_oracle_monte_carlo_matches_closed_form(L, eps):
    env = env_with("corridor", length=L, eps=eps)
    assert_oracle_matches_closed_form(env, lambda T: corridor_success_prob(L, eps, T), L, range(L - 1, 3 * L + 1, 2))


def test_text_walls_slips_and_exit_direction():
    env = env_with("corridor", length=3, eps=0.0)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    texts = set()
    for seed in range(6):
        s, o = reset(jax.random.PRNGKey(0), {"seed": jnp.int32(seed)})
        texts.add(env.render_text(o))
        away = 1 - env.oracle_action(s)  # walk into the wall behind the start
        s2, o2, r, d, info = step(jax.random.PRNGKey(1), s, away)
        assert bool(info.error) and not bool(info.invalid) and int(s2.pos) == int(s.pos)
        assert env.render_text(o2).startswith("You hit a wall.\nPosition")
    assert texts == {"Position 0. Exit at 3.\n", "Position 3. Exit at 0.\n"}  # both exits occur
    slippery = env_with("corridor", length=3, eps=0.5)
    s, _ = jax.jit(slippery.reset)(jax.random.PRNGKey(0), {"seed": jnp.int32(0)})
    steps = jax.jit(jax.vmap(slippery.step, in_axes=(0, None, None)))
    s2, o2, _, _, info = steps(jax.random.split(jax.random.PRNGKey(2), 2000), s, slippery.oracle_action(s))
    slipped = np.asarray(info.error)
    assert 0.45 < slipped.mean() < 0.55
    assert (np.asarray(s2.pos)[slipped] == int(s.pos)).all()
    i = int(np.argmax(slipped))
    assert slippery.render_text(jax.tree.map(lambda x: x[i], o2)).startswith("You slipped and did not move.\n")
