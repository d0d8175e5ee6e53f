"""Advantage estimators and process supervision against hand-computed examples."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.learn import advantages as adv


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# Two groups of 4: [1, 0, 1, 0] and [0, 0, 0, 1].
REWARDS = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])


def test_grpo_hand_example():
    # group 1: mean .5, std .5 -> +-1; group 2: mean .25, std sqrt(3)/4 = 0.4330127.
    s3 = 1.0 / np.sqrt(3.0)
    expected = [1, -1, 1, -1, -s3, -s3, -s3, np.sqrt(3.0)]
    close(adv.grpo_advantages(REWARDS, 4), expected, tol=1e-4)
    # Without the std: mean baseline only.
    close(adv.grpo_advantages(REWARDS, 4, normalize_std=False),
          [0.5, -0.5, 0.5, -0.5, -0.25, -0.25, -0.25, 0.75])


def test_grpo_constant_group_is_zero():
    out = adv.grpo_advantages(jnp.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    close(out, np.zeros(6))
    assert np.isfinite(np.asarray(out)).all()


CONSTANTS = (1.0, 3.0, 0.1, -2.5, 1e3, 0.7, 1 / 3)


@pytest.mark.parametrize("name", ["grpo", "grpo_mean_only", "rloo", "reinforce"])
def test_constant_groups_get_exactly_zero_under_jit(name):
    """Regression (issue 16): GRPO gave a constant group -0.0298 (G=3 of ones) or -0.19 (G=7 of 3.0)
    in float32 under jit, the mean's rounding error divided by a near-zero std. Every estimator gives
    exactly 0 to a group of identical rewards, for every group size 1..32 (one jitted program holds
    them all), and eagerly; a varied group next to constant ones keeps its advantages."""
    fn = {"grpo_mean_only": lambda r, g: adv.grpo_advantages(r, g, normalize_std=False)}.get(
        name, adv.ADVANTAGES.get(name))
    sizes = list(range(2 if name == "rloo" else 1, 33))
    values = np.asarray(CONSTANTS, np.float32)
    if name == "reinforce":  # a batch baseline: the whole batch must be constant, one batch per value
        batches = {g: np.repeat(values[:, None], 3 * g, axis=1) for g in sizes}  # [values, 3g]
        run = lambda b: [jax.vmap(lambda row, g=g: fn(row, g))(b[g]) for g in sizes]
    else:  # one constant group per value, side by side: [values * g]
        batches = {g: np.repeat(values, g) for g in sizes}
        run = lambda b: [fn(b[g], g) for g in sizes]
    jitted = jax.jit(run)({g: jnp.asarray(b) for g, b in batches.items()})
    eager = [fn(jnp.asarray(row), g) for g in (3, 7) if g in batches
             for row in batches[g].reshape(len(values), -1)]
    for out in jax.tree.leaves((jitted, eager)):
        out = np.asarray(out)
        assert (out == 0).all(), (name, out.shape, out[out != 0][:3])
    r = jnp.asarray([1.0, 1.0, 1.0, 0.0, 1.0, 2.0])
    out = np.asarray(jax.jit(fn, static_argnums=1)(r, 3))
    if name != "reinforce":
        assert (out[:3] == 0).all() and np.abs(out[3:]).max() > 0.5


def test_grpo_matches_numpy_random():
    r = np.random.default_rng(0).normal(size=12).astype(np.float32)
    g = r.reshape(4, 3)
    expected = ((g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-6)).reshape(-1)
    close(adv.grpo_advantages(jnp.asarray(r), 3), expected, tol=1e-4)


def test_rloo_hand_example():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0, 0.0])
    # row - mean of the 3 others: 1 - 1/3, 0 - 2/3, ...; 3 - 0, 0 - 3/3.
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 3.0, -1.0, -1.0, -1.0]
    close(adv.rloo_advantages(rewards, 4), expected)


def test_rloo_is_scaled_mean_baseline():
    r = jnp.asarray(np.random.default_rng(1).normal(size=10), jnp.float32)
    g = 5
    close(adv.rloo_advantages(r, g), g / (g - 1) * adv.grpo_advantages(r, g, normalize_std=False))


def test_reinforce_hand_example():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0, 0.0])  # mean 5/8
    close(adv.reinforce_advantages(rewards, 4), np.array([1, 0, 0, 1, 3, 0, 0, 0]) - 0.625)


def test_registry_and_jit():
    assert set(adv.ADVANTAGES) == {"grpo", "rloo", "reinforce", "gigpo"}
    outcome = [name for name in adv.ADVANTAGES if not adv.takes_trajectory(adv.get_advantage(name))]
    assert sorted(outcome) == ["grpo", "reinforce", "rloo"]  # gigpo reads the trajectory (tests/learn/test_gigpo.py)
    for name in outcome:
        fn = adv.get_advantage(name)
        jitted = jax.jit(fn, static_argnums=1)
        close(jitted(REWARDS, 4), fn(REWARDS, 4))
    with pytest.raises(ValueError, match="gigpo, grpo, reinforce, rloo"):
        adv.get_advantage("ppo")


def test_errors():
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        adv.grpo_advantages(jnp.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        adv.rloo_advantages(jnp.zeros(6), 1)
    with pytest.raises(ValueError, match=r"\[batch\]"):
        adv.grpo_advantages(jnp.zeros((2, 4)), 4)


def test_token_advantages_masks():
    mask = jnp.array([[0, 1, 1, 0], [1, 0, 0, 1]], jnp.float32)
    close(adv.token_advantages(jnp.array([2.0, -1.0]), mask), [[0, 2, 2, 0], [-1, 0, 0, -1]])


# --------------------------------------------------------------------------- process supervision

# Row 0 acts 3 turns: progress 0 -> .25 -> .25 -> 1.0. Row 1 acts 1 turn: 0 -> .5 (then inactive;
# progress after inactive turns is ignored, even if it moves).
PROGRESS = jnp.array([[0.0, 0.25, 0.25, 1.0], [0.0, 0.5, 0.9, 0.1]])
ACTIVE = jnp.array([[True, True, True], [True, False, False]])


def test_process_turn_rewards():
    close(adv.process_turn_rewards(PROGRESS, ACTIVE), [[0.25, 0.0, 0.75], [0.5, 0, 0]])
    # The outcome reward lands on each row's last active turn.
    out = adv.process_turn_rewards(PROGRESS, ACTIVE, outcome=jnp.array([1.0, 2.0]))
    close(out, [[0.25, 0.0, 1.75], [2.5, 0, 0]])


def test_discounted_returns_hand_example():
    r = adv.process_turn_rewards(PROGRESS, ACTIVE)
    # gamma .5: G2 = .75, G1 = 0 + .5 * .75 = .375, G0 = .25 + .5 * .375 = .4375.
    close(adv.discounted_returns(r, ACTIVE, 0.5), [[0.4375, 0.375, 0.75], [0.5, 0, 0]])
    close(adv.discounted_returns(r, ACTIVE, 1.0), [[1.0, 0.75, 0.75], [0.5, 0, 0]])
    # With the outcome at the final turn: r = [.25, 0, 1.75] -> [.6875, .875, 1.75].
    r = adv.process_turn_rewards(PROGRESS, ACTIVE, outcome=jnp.array([1.0, 0.0]))
    close(adv.discounted_returns(r, ACTIVE, 0.5), [[0.6875, 0.875, 1.75], [0.5, 0, 0]])


def test_normalize_turn_values():
    values = jnp.array([[1.0, 2.0, 3.0], [4.0, 99.0, -99.0]])
    out = np.asarray(adv.normalize_turn_values(values, ACTIVE))
    on = np.asarray(ACTIVE)
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    close(out[on], (ref - ref.mean()) / (ref.std() + 1e-6))
    assert (out[~on] == 0).all()


def test_spread_to_tokens():
    turn_values = jnp.array([[10.0, 20.0, 30.0], [5.0, 0.0, 0.0]])
    turn_of_token = jnp.array(
        [[-1, -1, 0, 0, 0, 1, 1, 2, 2, -1], [-1, 0, 0, 0, -1, -1, -1, -1, -1, -1]]
    )
    mask = jnp.array([[0, 1, 0, 1, 1, 0, 1, 0, 1, 1], [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]], jnp.float32)
    out = adv.spread_to_tokens(turn_values, turn_of_token, mask)
    close(out, [[0, 0, 0, 10, 10, 0, 20, 0, 30, 0], [0, 0, 5, 5, 0, 0, 0, 0, 0, 0]])


def test_process_advantages_and_combine():
    turn_of_token = jnp.array([[-1, 0, 0, 1, 2, 2], [-1, 0, 0, -1, -1, -1]])
    mask = jnp.array([[0, 0, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0]], jnp.float32)
    out = adv.process_advantages(PROGRESS, ACTIVE, turn_of_token, mask, gamma=0.5, normalize=False)
    close(out, [[0, 0, 0.4375, 0.375, 0.75, 0.75], [0, 0, 0.5, 0, 0, 0]])
    jitted = jax.jit(adv.process_advantages, static_argnames=("gamma", "normalize"))
    close(jitted(PROGRESS, ACTIVE, turn_of_token, mask, gamma=0.5, normalize=False), out)
    outcome = adv.token_advantages(jnp.array([1.0, -1.0]), mask)
    close(adv.combine_advantages(outcome, out, 2.0), outcome + 2.0 * out)
    close(adv.combine_advantages(outcome, out, 0.0), outcome)
