"""corridor: the oracle's Monte Carlo success within T matches the closed form; dynamics and text."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.envs.corridor import corridor_success_prob
from bmrl.rollout import oracle_policy, play
from tests.env_helpers import env_with, seeds_task


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
    n, horizon = 4000, 3 * L
    keys = jax.random.split(jax.random.PRNGKey(L), n)
    ep = play(oracle_policy, env, seeds_task(n), np.full(n, horizon, np.int32), keys, horizon)
    first = np.asarray(ep.first_success_turn)
    for T in range(L - 1, horizon + 1, 2):
        p = corridor_success_prob(L, eps, T)
        rate = np.mean((first >= 1) & (first <= T))
        se = math.sqrt(max(p * (1 - p), 1e-12) / n)
        # 4 sigma, plus two episodes of slack: near p = 1 the normal approximation of a count of ~1 fails.
        assert abs(rate - p) <= 4 * se + 2 / n, (T, rate, p)


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
