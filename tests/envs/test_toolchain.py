"""toolchain: lookups, failures that a retry recovers, unknown keys and wrong answers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.rollout import oracle_policy, play
from tests.env_helpers import env_with, seeds_task


def test_chain_text_errors_and_answer():
    env = env_with("toolchain", k=2, num_keys=6, num_values=50)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    s, o = reset(jax.random.PRNGKey(0), {"seed": jnp.int32(11)})
    chain, value = np.asarray(s.chain).tolist(), int(s.value)
    w = env.keys
    assert env.render_text(o) == f"Start key: {w[chain[0]]}.\n"
    stranger = next(i for i in range(6) if i not in chain)
    s, o, r, d, info = step(jax.random.PRNGKey(1), s, stranger)
    assert env.render_text(o) == f"Key {w[stranger]} not found.\n" and bool(info.error)
    s, o, r, d, info = step(jax.random.PRNGKey(1), s, chain[0])
    assert env.render_text(o) == f"Key {w[chain[0]]} points to {w[chain[1]]}.\n" and not bool(info.error)
    s, o, r, d, info = step(jax.random.PRNGKey(1), s, chain[1])
    assert env.render_text(o) == f"Key {w[chain[1]]} holds value {value}.\n"
    assert int(info.oracle_action) == chain[1] and int(env.oracle_action(s)) == 6 + value
    wrong = 6 + (value + 1) % 50
    s, o, r, d, info = step(jax.random.PRNGKey(1), s, wrong)
    assert env.render_text(o) == "Wrong answer.\n" and bool(info.error) and not bool(d)
    assert env.action_strings[6 + value] == f"answer {value}"
    s, o, r, d, info = step(jax.random.PRNGKey(1), s, 6 + value)
    assert bool(d) and float(r) == 1.0 and float(info.progress) == 1.0


def test_failed_lookups_are_retried_by_the_oracle():
    k, p = 3, 0.4
    env = env_with("toolchain", k=k, p_fail=p)
    n, horizon = 2000, 16
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    ep = play(oracle_policy, env, seeds_task(n), np.full(n, horizon, np.int32), keys, horizon)
    first = np.asarray(ep.first_success_turn)
    errors = np.asarray(ep.error).sum(1)
    # Every lookup fails independently: turns = k + 1 + failures (negative binomial), all errors shown.
    ok = first > 0
    np.testing.assert_array_equal(first[ok], k + 1 + errors[ok])
    assert abs(errors[ok].mean() - k * p / (1 - p)) < 0.15
    assert ok.mean() > 0.95
