"""Shared helpers of the environment tests: a tiny tokenizer trained once per process, checks."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.envs import make
from tests.tiny_tokenizer import shared_tokenizer

MY_ENVS = ("corridor", "frozenlake", "toolchain")
# Small, fast configurations with every kind of error switched on.
NOISY_OPTIONS = {
    "corridor": {"length": 6, "eps": 0.3},
    "frozenlake": {"size": 5, "p_hole": 0.25, "eps": 0.2},
    "toolchain": {"k": 3, "p_fail": 0.3},
}


def tiny_tokenizer():
    """The suite's tiny tokenizer (`tests.tiny_tokenizer`, trained once per test process)."""
    return shared_tokenizer()


@functools.lru_cache(maxsize=None)
def cached_env(name: str, **options):
    return make(name, tiny_tokenizer(), **options)


def env_with(name: str, **options):
    return cached_env(name, **dict(sorted(options.items())))


def assert_roundtrip(env, obs) -> None:
    """Observation tokens decode and re-encode to themselves; padding after `length` is pad."""
    tok = env.tokenizer
    tokens = np.asarray(obs.tokens)
    n = int(obs.length)
    assert 0 < n <= env.max_obs_len == tokens.shape[-1]
    ids = tokens[:n].tolist()
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids, tok.decode(ids)
    assert (tokens[n:] == env.fragments.pad).all()


def batched(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def seeds_task(n: int, offset: int = 0):
    return {"seed": jnp.arange(offset, offset + n, dtype=jnp.int32)}


def assert_oracle_matches_closed_form(env, prob, length: int, ts, n: int = 4000) -> None:
    """The oracle's Monte Carlo success rate within T (n episodes of `3 * length` turns) matches the
    closed form `prob(T)` for every T in `ts`: within 4 standard errors, plus two episodes of slack
    (near p = 1 the normal approximation of a count of ~1 fails)."""
    import math

    from bmrl.rollout import oracle_policy, play

    horizon = 3 * length
    keys = jax.random.split(jax.random.PRNGKey(length), n)
    ep = play(oracle_policy, env, seeds_task(n), np.full(n, horizon, np.int32), keys, horizon)
    first = np.asarray(ep.first_success_turn)
    for T in ts:
        p = prob(T)
        rate = np.mean((first >= 1) & (first <= T))
        se = math.sqrt(max(p * (1 - p), 1e-12) / n)
        assert abs(rate - p) <= 4 * se + 2 / n, (T, rate, p)
