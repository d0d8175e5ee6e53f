"""The env protocol, for every env: oracle optimality, jit + vmap, invalid actions, determinism."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmrl.envs import INVALID, make
from bmrl.rollout import oracle_policy, play
from tests.env_helpers import MY_ENVS, NOISY_OPTIONS, assert_roundtrip, batched, env_with, seeds_task, tiny_tokenizer

CLEAN_OPTIONS = {"corridor": {"length": 5}, "frozenlake": {"size": 6, "p_hole": 0.3}, "toolchain": {"k": 4}}


@pytest.mark.parametrize("name,options", list(CLEAN_OPTIONS.items()))
def test_oracle_solves_every_level_in_optimal_turns(name, options):
    env = env_with(name, **options)
    tasks = seeds_task(256, offset=1000)
    opt = np.asarray(jax.vmap(env.optimal_turns)(tasks))
    assert (opt >= 1).all()
    horizon = int(opt.max()) + 2
    keys = jax.random.split(jax.random.PRNGKey(0), 256)
    ep = play(oracle_policy, env, tasks, np.full(256, horizon, np.int32), keys, horizon)
    assert np.asarray(ep.success).all()
    np.testing.assert_array_equal(np.asarray(ep.first_success_turn), opt)
    assert not np.asarray(ep.error).any()
    # Progress is monotone along the oracle's run and reaches 1.0 exactly at the goal.
    prog = np.asarray(ep.progress)[:, 1:]
    active = np.asarray(ep.turn_active)
    for row in range(0, 256, 37):
        p = prog[row][active[row]]
        assert (np.diff(p) > 0).all() and p[-1] == 1.0 and (p[:-1] < 1.0).all()


@pytest.mark.parametrize("name", MY_ENVS)
def test_jit_vmap_1024_envs(name):
    env = env_with(name, show_budget=True, **NOISY_OPTIONS[name])
    n = 1024
    key = jax.random.PRNGKey(1)
    tasks = jax.vmap(env.sample_task)(jax.random.split(key, n))
    budget = jnp.full((n,), 7, jnp.int32)
    reset = jax.jit(jax.vmap(env.reset))
    states, obs = reset(jax.random.split(key, n), tasks, budget)
    again = reset(jax.random.split(key, n), tasks, budget)
    for x, y in zip(jax.tree.leaves((states, obs)), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert obs.tokens.shape == (n, env.max_obs_len) and obs.tokens.dtype == jnp.int32
    step = jax.jit(jax.vmap(env.step))
    first = None
    for t in range(3):
        k_a, k_s, key = jax.random.split(key, 3)
        actions = jax.random.randint(k_a, (n,), -1, env.num_actions)  # -1 = INVALID
        prev_states = states
        states, obs, reward, terminated, info = step(jax.random.split(k_s, n), states, actions, budget - t - 1)
        assert reward.shape == (n,) and reward.dtype == jnp.float32
        assert terminated.dtype == jnp.bool_ and info.error.shape == (n,)
        inv = np.asarray(actions) == INVALID
        np.testing.assert_array_equal(np.asarray(info.invalid), inv)
        assert np.asarray(info.error)[inv].all()
        np.testing.assert_array_equal(np.asarray(reward), np.asarray(info.success, np.float32))
        p = np.asarray(info.progress)
        assert ((p >= 0) & (p <= 1)).all()
        assert (np.asarray(obs.length) <= env.max_obs_len).all()
        if t == 0:  # determinism: the same key gives the same step, another key other slips/failures
            first = (states, obs, info)
            same = step(jax.random.split(k_s, n), prev_states, actions, budget - 1)
            other = step(jax.random.split(key, n), prev_states, actions, budget - 1)
            for x, y in zip(jax.tree.leaves(same[:2] + (same[4],)), jax.tree.leaves(first)):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
            assert not np.array_equal(np.asarray(other[4].error), np.asarray(info.error))
        for i in range(0, n, 97):
            o = batched(obs, i)
            assert_roundtrip(env, o)
            text = env.render_text(o)
            assert text.endswith(f"Turns left: {6 - t}.\n")
            if inv[i]:
                assert text.startswith("Invalid action. Valid actions are: ")


@functools.lru_cache(maxsize=None)
def _jitted(name):
    env = env_with(name, **NOISY_OPTIONS[name])
    width = 8

    def parse_and_step(key, tokens, length):
        task = env.sample_task(key)
        state, _ = env.reset(key, task)
        action = env.parse_action(tokens, length)
        new_state, obs, reward, terminated, info = env.step(key, state, action)
        same = jax.tree.map(lambda a, b: jnp.all(a == b), state, new_state)
        return action, obs, reward, terminated, info, jnp.all(jnp.stack(jax.tree.leaves(same)))

    return env, width, jax.jit(parse_and_step)


@pytest.mark.parametrize("name", MY_ENVS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_arbitrary_tokens_are_invalid_and_never_crash(name, data):
    env, width, fn = _jitted(name)
    vocab = len(tiny_tokenizer())
    seq = data.draw(st.lists(st.integers(-5, vocab + 5), min_size=0, max_size=width))
    length = data.draw(st.integers(-2, width + 3))
    tokens = jnp.asarray(seq + [0] * (width - len(seq)), jnp.int32)
    action, obs, reward, terminated, info, unchanged = fn(jax.random.PRNGKey(len(seq)), tokens, length)
    exact = [list(env.actions.tokens[a, : env.actions.lengths[a]]) for a in range(env.num_actions)]
    reply = [int(t) for t in np.asarray(tokens)[: max(length, 0)]] if 0 <= length <= width else None
    if reply in exact:  # an arbitrary sequence that happens to spell an action is that action
        assert int(action) == exact.index(reply)
        return
    assert int(action) == INVALID
    assert bool(info.invalid) and bool(info.error) and not bool(info.success)
    assert float(reward) == 0.0 and not bool(terminated) and bool(unchanged)
    assert env.render_text(obs).startswith("Invalid action.")


@pytest.mark.parametrize("name", MY_ENVS)
def test_every_action_string_parses_to_its_id(name):
    env = env_with(name, **NOISY_OPTIONS[name])
    tok = env.tokenizer
    parse = jax.jit(env.parse_action)
    for a in range(0, env.num_actions, max(1, env.num_actions // 13)):
        ids = tok.encode(env.action_strings[a], add_special_tokens=False)
        padded = jnp.asarray(ids + [7] * (12 - len(ids)), jnp.int32)  # junk after `length` is ignored
        assert int(parse(padded, len(ids))) == a
        assert int(parse(padded, len(ids) + 1)) == INVALID


def test_level_depends_only_on_the_task_seed():
    env = env_with("frozenlake", size=6, p_hole=0.3)
    reset = jax.jit(env.reset)
    task = {"seed": jnp.int32(42)}
    s1, o1 = reset(jax.random.PRNGKey(0), task)
    s2, o2 = reset(jax.random.PRNGKey(99), task)
    np.testing.assert_array_equal(np.asarray(s1.holes), np.asarray(s2.holes))
    np.testing.assert_array_equal(np.asarray(o1.tokens), np.asarray(o2.tokens))
    s3, _ = reset(jax.random.PRNGKey(0), {"seed": jnp.int32(43)})
    assert not np.array_equal(np.asarray(s1.holes), np.asarray(s3.holes))


def test_make_errors_list_valid_names_and_options():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match=r"valid: corridor, frozenlake, keypad, sokoban, toolchain"):
        make("mazes", tok)
    with pytest.raises(TypeError, match=r"Unknown option\(s\) \['lenght'\].*show_budget=False.*length=8, eps=0.0"):
        make("corridor", tok, lenght=4)
    with pytest.raises(ValueError, match="eps"):
        make("corridor", tok, eps=1.5)
    with pytest.raises(ValueError, match="size"):
        make("frozenlake", tok, size=1)
    with pytest.raises(ValueError, match="k \\(chain length\\)"):
        make("toolchain", tok, k=40)
    env = make("corridor", tok, show_budget=True)
    with pytest.raises(ValueError, match="show_budget=True needs turns_left"):
        env.reset(jax.random.PRNGKey(0), {"seed": jnp.int32(0)})


def test_show_budget_off_by_default_and_on_states_turns_left():
    off = env_with("corridor", length=4)
    on = env_with("corridor", length=4, show_budget=True)
    task = {"seed": jnp.int32(3)}
    _, o_off = jax.jit(off.reset)(jax.random.PRNGKey(0), task, jnp.int32(9))
    _, o_on = jax.jit(on.reset)(jax.random.PRNGKey(0), task, jnp.int32(9))
    assert "Turns left" not in off.render_text(o_off)
    assert on.render_text(o_on) == off.render_text(o_off) + "Turns left: 9.\n"
    assert on.max_obs_len > off.max_obs_len
