"""keypad: the oracle's success within T matches the closed form; dynamics and text; the move after an
error (delete) is one the oracle never makes in a clean state; the seeds give many distinct codes."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.envs import make
from bmrl.envs.keypad import keypad_success_prob
from bmrl.rollout import oracle_policy, play
from bmrl.rollout.policies import NoisyOracle
from tests.env_helpers import assert_oracle_matches_closed_form, assert_roundtrip, env_with, seeds_task, tiny_tokenizer


def test_closed_form_against_a_direct_dynamic_program():
    for L, eps, T in [(3, 0.2, 5), (6, 0.5, 9), (5, 0.3, 14), (4, 0.0, 4), (4, 0.0, 3), (1, 0.9, 1), (2, 0.6, 2)]:
        clean = np.zeros(L + 1)  # probability of prefix p with a clean screen (p = L absorbing)
        wrong = np.zeros(L + 1)  # ... with a wrong digit (a slip) on the screen
        clean[0] = 1.0
        for _ in range(T):
            new_clean, new_wrong = np.zeros(L + 1), np.zeros(L + 1)
            new_clean[1:] += clean[:-1] * (1 - eps)  # the oracle's press registers
            new_wrong[:-1] += clean[:-1] * eps  # it slips
            new_clean[:] += wrong  # the oracle deletes the wrong digit
            new_clean[L] += clean[L]
            clean, wrong = new_clean, new_wrong
        assert keypad_success_prob(L, eps, T) == pytest.approx(clean[L], abs=1e-12)


@pytest.mark.parametrize("L,eps", [(4, 0.2), (6, 0.4)])
def test_oracle_monte_carlo_matches_closed_form(L, eps):
    env = env_with("keypad", length=L, eps=eps)
    assert_oracle_matches_closed_form(env, lambda T: keypad_success_prob(L, eps, T), L, range(L - 1, 3 * L + 1))


def test_oracle_solves_every_level_in_length_turns_without_slips():
    env = env_with("keypad", length=5)
    tasks = seeds_task(128, offset=1000)
    ep = play(oracle_policy, env, tasks, np.full(128, 7, np.int32), jax.random.split(jax.random.PRNGKey(0), 128), 7)
    assert np.asarray(ep.success).all() and (np.asarray(ep.first_success_turn) == 5).all()
    assert not np.asarray(ep.error).any()
    np.testing.assert_allclose(np.asarray(ep.progress)[0, :6], np.arange(6) / 5)


def test_dynamics_and_text():
    env = env_with("keypad", length=3, eps=0.0)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    key = jax.random.PRNGKey(0)
    s, o = reset(key, {"seed": jnp.int32(7)})
    code = np.asarray(s.code).tolist()
    assert env.render_text(o) == f"Typed 0 of 3. Next digit {code[0]}.\n"
    assert int(env.oracle_action(s)) == code[0] and env.action_strings[code[0]] == f"press {code[0]}"

    s, o, r, d, info = step(key, s, jnp.int32(code[0]))  # right press
    assert not bool(info.error) and int(s.typed) == 1 and not bool(s.wrong) and not bool(d)
    assert env.render_text(o) == f"Typed 1 of 3. Next digit {code[1]}.\n"
    assert float(info.progress) == pytest.approx(1 / 3)

    bad = (code[1] + 1) % 10
    s, o, r, d, info = step(key, s, jnp.int32(bad))  # wrong press: an error, a wrong digit on the screen
    assert bool(info.error) and not bool(info.invalid) and int(s.typed) == 1 and bool(s.wrong) and int(s.shown) == bad
    assert env.render_text(o) == "Wrong digit.\nTyped 1 of 3. Wrong digit to delete.\n"  # no next digit
    assert int(env.oracle_action(s)) == env.DELETE

    for digit in (code[1], bad):  # any press with a wrong digit on the screen is refused
        s2, o2, r, d, info = step(key, s, jnp.int32(digit))
        assert bool(info.error) and int(s2.typed) == 1 and bool(s2.wrong) and int(s2.shown) == bad
        assert env.render_text(o2) == "Delete the wrong digit first.\nTyped 1 of 3. Wrong digit to delete.\n"

    s, o, r, d, info = step(key, s, jnp.int32(env.DELETE))  # delete: back to clean, no error
    assert not bool(info.error) and int(s.typed) == 1 and not bool(s.wrong) and int(s.shown) == -1
    assert env.render_text(o) == f"Typed 1 of 3. Next digit {code[1]}.\n"

    s2, o2, r, d, info = step(key, s, jnp.int32(env.DELETE))  # delete on a clean screen: refused
    assert bool(info.error) and int(s2.typed) == 1 and not bool(s2.wrong)
    assert env.render_text(o2) == f"Nothing to delete.\nTyped 1 of 3. Next digit {code[1]}.\n"

    s2, o2, r, d, info = step(key, s, jnp.int32(-1))  # unparsed reply
    assert bool(info.invalid) and env.render_text(o2).startswith(
        "Invalid action. Valid actions are: press 0 to press 9, delete.\nTyped 1"
    )

    s, o, r, d, info = step(key, s, jnp.int32(code[1]))
    s, o, r, d, info = step(key, s, jnp.int32(code[2]))  # the last digit: solved
    assert bool(info.success) and bool(d) and float(r) == 1.0 and float(info.progress) == 1.0
    assert env.render_text(o) == "Typed 3 of 3. Code accepted.\n"
    assert_roundtrip(env, o)

    # Slips: a right press registers another digit (an error the agent sees), never the right one.
    slippery = env_with("keypad", length=3, eps=0.5)
    s, _ = jax.jit(slippery.reset)(key, {"seed": jnp.int32(7)})
    steps = jax.jit(jax.vmap(slippery.step, in_axes=(0, None, None)))
    s2, o2, _, _, info = steps(jax.random.split(jax.random.PRNGKey(2), 2000), s, slippery.oracle_action(s))
    slipped = np.asarray(info.error)
    assert 0.45 < slipped.mean() < 0.55
    assert (np.asarray(s2.wrong) == slipped).all() and (np.asarray(s2.typed) == 1 - slipped).all()
    shown = np.asarray(s2.shown)[slipped]
    assert (shown != code[0]).all() and set(shown.tolist()) == set(range(10)) - {code[0]}
    i = int(np.argmax(slipped))
    text = slippery.render_text(jax.tree.map(lambda x: x[i], o2))
    assert text == "Your press slipped: wrong digit.\nTyped 0 of 3. Wrong digit to delete.\n"


def test_recovery_is_a_distinct_skill():
    """Along a noisy oracle's runs on a slippery keypad, the oracle's move after an error that left a
    wrong digit is always delete, and it never deletes after a step that left the screen clean."""
    env = env_with("keypad", length=6, eps=0.2)
    n, horizon = 512, 24
    keys = jax.random.split(jax.random.PRNGKey(3), n)
    ep = play(NoisyOracle(0.3), env, seeds_task(n), np.full(n, horizon, np.int32), keys, horizon)
    action, oracle = np.asarray(ep.action), np.asarray(ep.oracle_action)
    error, active = np.asarray(ep.error), np.asarray(ep.turn_active)
    both = active[:, :-1] & active[:, 1:]
    after = oracle[:, 1:][both]
    left_wrong = (error[:, :-1] & (action[:, :-1] != env.DELETE))[both]  # wrong press, slip or refused press
    assert left_wrong.sum() > 500 and (~left_wrong).sum() > 500
    assert (after[left_wrong] == env.DELETE).all()
    assert (after[~left_wrong] != env.DELETE).all()  # clean: a right press, a delete, or a refused delete
    assert (oracle[:, 0] != env.DELETE).all()  # the first screen is clean


def test_levels_are_distinct_codes():
    env = env_with("keypad")
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 1000), seeds_task(1000))
    codes = np.asarray(states.code)
    assert codes.shape == (1000, 5) and codes.min() == 0 and codes.max() == 9
    assert len({tuple(c) for c in codes.tolist()}) > 900
    small = env_with("keypad", length=16, digits=2)
    small_states, _ = jax.jit(jax.vmap(small.reset))(jax.random.split(jax.random.PRNGKey(0), 100), seeds_task(100))
    codes = np.asarray(small_states.code)
    assert set(np.unique(codes).tolist()) == {0, 1} and len({tuple(c) for c in codes.tolist()}) > 95
    assert small.action_strings == ("press 0", "press 1", "delete")


def test_options_are_validated():
    tok = tiny_tokenizer()
    for bad, match in [
        ({"length": 0}, "length"),
        ({"length": 17}, "length"),
        ({"digits": 1}, "digits"),
        ({"digits": 11}, "digits"),
        ({"eps": 1.0}, "eps"),
        ({"eps": -0.1}, "eps"),
    ]:
        with pytest.raises(ValueError, match=match):
            make("keypad", tok, **bad)
