"""Scripted, jittable policies `(key, env, state) -> action id` and a scanned episode runner.

Used by tests, benchmarks and as demonstrations for the base policy: the oracle, an eps-noisy oracle
(with probability eps a uniformly random WRONG action) and a uniformly random policy.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from bmrl.envs.base import Env

Policy = Callable[[jax.Array, Env, object], jnp.ndarray]


def oracle_policy(key: jax.Array, env: Env, state) -> jnp.ndarray:
    """The env's best action."""
    return env.oracle_action(state)


def random_policy(key: jax.Array, env: Env, state) -> jnp.ndarray:
    """A uniformly random action."""
    return jax.random.randint(key, (), 0, env.num_actions, dtype=jnp.int32)


def noisy_oracle_policy(key: jax.Array, env: Env, state, eps: float = 0.1) -> jnp.ndarray:
    """The oracle's action, except with probability `eps` a uniformly random different action."""
    k_flip, k_pick = jax.random.split(key)
    best = env.oracle_action(state)
    other = jax.random.randint(k_pick, (), 0, env.num_actions - 1, dtype=jnp.int32)
    wrong = other + (other >= best)  # skips `best`: uniform over the other num_actions - 1 actions
    return jnp.where(jax.random.bernoulli(k_flip, eps), wrong, best).astype(jnp.int32)


def make_noisy_oracle(eps: float) -> Policy:
    """`noisy_oracle_policy` with `eps` bound, as a `(key, env, state)` policy."""
    return lambda key, env, state: noisy_oracle_policy(key, env, state, eps)


POLICIES: dict[str, Policy] = {"oracle": oracle_policy, "random": random_policy, "noisy_oracle": noisy_oracle_policy}


def run_episode(env: Env, policy: Policy, key: jax.Array, task, num_turns: int) -> dict[str, jnp.ndarray]:
    """Play `num_turns` turns of `task` with `policy` in one `lax.scan` (turns after the end are masked).

    Returns per-turn `action, reward, error, invalid, oracle_action, progress, active` ([num_turns])
    and `success`, `first_success_turn` (1-based, 0 if never), `turns_used`. jit- and vmap-able.
    """
    k_reset, k_run = jax.random.split(key)
    state, _ = env.reset(k_reset, task, jnp.int32(num_turns))

    def turn(carry, inputs):
        state, done = carry
        t, k = inputs
        k_act, k_step = jax.random.split(k)
        action = policy(k_act, env, state)
        new_state, _, reward, terminated, info = env.step(k_step, state, action, num_turns - t)
        active = ~done
        state = jax.tree.map(lambda a, b: jnp.where(active, b, a), state, new_state)
        rec = {
            "action": action,
            "reward": jnp.where(active, reward, 0.0),
            "error": info.error & active,
            "invalid": info.invalid & active,
            "oracle_action": info.oracle_action,
            "progress": info.progress,
            "success": info.success & active,
            "active": active,
        }
        return (state, done | terminated), rec

    keys = jax.random.split(k_run, num_turns)
    _, recs = jax.lax.scan(turn, (state, jnp.bool_(False)), (jnp.arange(num_turns), keys))
    success = jnp.any(recs["success"])
    recs["first_success_turn"] = jnp.where(success, jnp.argmax(recs["success"]) + 1, 0).astype(jnp.int32)
    recs["turns_used"] = jnp.sum(recs["active"]).astype(jnp.int32)
    recs["success"] = success
    return recs
