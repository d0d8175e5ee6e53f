"""Policies behind one interface, called by the episode engine once per turn.

A policy is a static, hashable description (it keys the compiled program) plus `params`, a pytree
of data passed into the compiled episode. `policy.bind(params)` inside the trace gives an object with

    start(env, obs, keys) -> state            # before turn 0: e.g. prefill the prompt + first observation
    act(state, env, env_state, t, active) -> (state, action int32[B], format_ok bool[B])
    observe(state, obs, t, nxt) -> (state, fits bool[B])   # the next observation, for rows going on
    outputs(state) -> dict of token arrays    # tokens, length, loss_mask, logprobs, turn_of_token
    after_step(state, action, info, active) -> state   # optional: sees the step's action and StepInfo

- `ModelPolicy` (`bmrl.rollout.model_policy`): a language model. Acting = decode a reply into the KV
  cache until a stop token or the per-turn limit, then parse it into an action id in tokens;
  observing = prefill the reply's closing fragment and the next observation at the row's own offset.
- `ScriptedPolicy`: a jittable `(key, env, state) -> action id` function of the environment state
  (the oracle, the eps-noisy oracle, a random policy): no tokens, no cache.
- `ReplayPolicy`: replays given actions until a per-row turn, then (optionally) asks a scripted
  policy: demonstrations laid out in tokens, and probe states for decision accuracy.

Keys: the engine hands every policy the row keys; the model samples from `fold_in(row, TOKEN_STREAM)`
(token i of turn t: `fold_in(fold_in(., t), i)`), scripted policies from `fold_in(row, SCRIPT_STREAM)`
(turn t: `fold_in(., t)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from bmrl.envs.base import Env
from bmrl.formats import Format
from bmrl.rollout.model_policy import ModelPolicy
from bmrl.rollout.types import SCRIPT_STREAM, RolloutConfig, stream

# ---- scripted action functions: (key, env, state) -> action id ----------------------------------


def oracle_policy(key: jax.Array, env: Env, state) -> jnp.ndarray:
    """The env's best action."""
    return env.oracle_action(state)


def random_policy(key: jax.Array, env: Env, state) -> jnp.ndarray:
    """A uniformly random action."""
    return jax.random.randint(key, (), 0, env.num_actions, dtype=jnp.int32)


def noisy_pick(key: jax.Array, best, num_actions: int, eps) -> jnp.ndarray:
    """`best`, except with probability `eps` a uniformly random other action id in [0, num_actions):
    the eps-noisy oracle's draw, shared by JAX envs (`noisy_oracle_policy`) and Python envs
    (`bmrl.rollout.host.NoisyOracleScript`), so the same key makes the same choice on both paths."""
    k_flip, k_pick = jax.random.split(key)
    other = jax.random.randint(k_pick, (), 0, num_actions - 1, dtype=jnp.int32)
    wrong = other + (other >= best)  # skips `best`: uniform over the other num_actions - 1 actions
    return jnp.where(jax.random.bernoulli(k_flip, eps), wrong, best).astype(jnp.int32)


def noisy_oracle_policy(key: jax.Array, env: Env, state, eps: float = 0.1) -> jnp.ndarray:
    """The oracle's action, except with probability `eps` a uniformly random different action."""
    return noisy_pick(key, env.oracle_action(state), env.num_actions, eps)


@dataclasses.dataclass(frozen=True)
class NoisyOracle:
    """`noisy_oracle_policy` with `eps` bound; hashable by value, so equal policies share a program."""

    eps: float

    def __call__(self, key: jax.Array, env: Env, state) -> jnp.ndarray:
        return noisy_oracle_policy(key, env, state, self.eps)


def make_noisy_oracle(eps: float) -> NoisyOracle:
    """The eps-noisy oracle as a `(key, env, state)` policy."""
    return NoisyOracle(float(eps))


@dataclasses.dataclass(frozen=True)
class NoisyOracleData:
    """The eps-noisy oracle with `eps` as data (`params` = float32[]): one program for every eps."""

    def bind(self, params) -> "_BoundScripted":
        return _BoundScripted(lambda key, env, state: noisy_oracle_policy(key, env, state, params))


@dataclasses.dataclass(frozen=True)
class RepairingOracle:
    """The eps-noisy oracle that may repair: in a clean state (the previous turn had no error) it
    errs with probability `eps`; in the state right after an error (its own, injected, or one the
    environment reported: `after_step` sees the engine's step) it takes the oracle's action with
    probability `repair`, else a uniformly random wrong one. `repair = 1 - eps` (the default) is
    the memoryless noisy oracle, action for action the same as `NoisyOracle(eps)` under the same keys.
    Pass it to `play`/`evaluate` as is: the engine runs it as `RepairingOracleData` with (eps, repair)
    as data, so every (eps, repair) shares one compiled program."""

    eps: float
    repair: float | None = None

    def __post_init__(self):
        repair = 1.0 - self.eps if self.repair is None else self.repair
        for name, v in (("eps", self.eps), ("repair", repair)):
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"noisy_oracle: {name} must be a probability in [0, 1], got {v!r}.")
        object.__setattr__(self, "eps", float(self.eps))
        object.__setattr__(self, "repair", float(repair))

    def engine_policy(self) -> tuple["RepairingOracleData", Any]:
        return RepairingOracleData(), (jnp.float32(self.eps), jnp.float32(self.repair))


@dataclasses.dataclass(frozen=True)
class RepairingOracleData:
    """`RepairingOracle` with `params` = (eps, repair) float32[] as data."""

    def bind(self, params) -> "_BoundRepairing":
        return _BoundRepairing(*params)


POLICIES: dict[str, Callable] = {"oracle": oracle_policy, "random": random_policy, "noisy_oracle": noisy_oracle_policy}


# ---- scripted and replayed policies -------------------------------------------------------------


def _no_tokens(batch: int) -> dict[str, jax.Array]:
    empty = lambda dtype: jnp.zeros((batch, 0), dtype)  # noqa: E731
    return dict(tokens=empty(jnp.int32), length=jnp.zeros((batch,), jnp.int32), loss_mask=empty(jnp.float32),
                logprobs=empty(jnp.float32), turn_of_token=empty(jnp.int32))


@dataclasses.dataclass(frozen=True)
class ScriptedPolicy:
    """A jittable `fn(key, env, state) -> action id`, called per row with `fold_in(script_key, t)`."""

    fn: Callable

    def bind(self, params) -> "_BoundScripted":
        return _BoundScripted(self.fn)


class _BoundScripted:
    def __init__(self, fn: Callable):
        self.fn = fn

    def start(self, env: Env, obs, keys):
        return stream(keys, SCRIPT_STREAM)

    def act(self, keys, env: Env, env_state, t, active):
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(keys)
        act = jax.vmap(lambda k, s: jnp.asarray(self.fn(k, env, s), jnp.int32))(step_keys, env_state)
        return keys, act, jnp.ones(act.shape, bool)

    def observe(self, keys, env: Env, obs, t, nxt):
        return keys, jnp.ones(nxt.shape, bool)

    def outputs(self, keys) -> dict[str, jax.Array]:
        return _no_tokens(keys.shape[0])


class _BoundRepairing(_BoundScripted):
    """State: (script keys [B], last_error bool[B]); `after_step` is the engine's hook after env.step."""

    def __init__(self, eps: float, repair: float):
        self.eps, self.repair = eps, repair

    def start(self, env: Env, obs, keys):
        return stream(keys, SCRIPT_STREAM), jnp.zeros(keys.shape[:1], bool)

    def act(self, state, env: Env, env_state, t, active):
        keys, last_error = state
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(keys)
        p_wrong = jnp.where(last_error, 1.0 - self.repair, self.eps)
        act = jax.vmap(lambda k, s, p: noisy_oracle_policy(k, env, s, p))(step_keys, env_state, p_wrong)
        return state, act, jnp.ones(act.shape, bool)

    def after_step(self, state, action, info, active):
        """Remember, per active row, whether this turn was an error (as `Episodes.errors("any")`)."""
        keys, last_error = state
        err = info.error | info.invalid | (action != info.oracle_action)
        return keys, jnp.where(active, err, last_error)

    def outputs(self, state) -> dict[str, jax.Array]:
        return _no_tokens(state[0].shape[0])


@struct.dataclass
class Replay:
    """ReplayPolicy data: `actions[b, t]` is played while `t < until[b]`; from turn `until[b]` on the
    policy's `then` function acts with the key `then_keys[b]` (the same key every such turn)."""

    actions: jax.Array  # int32[B, Tm]
    until: jax.Array  # int32[B]
    then_keys: jax.Array  # [B] PRNG keys


@dataclasses.dataclass(frozen=True)
class ReplayPolicy:
    """Replay actions (`params` is a `Replay`), then hand over to the scripted `then` (or keep
    replaying when `then` is None)."""

    then: Callable | None = None

    def bind(self, params: Replay) -> "_BoundReplay":
        return _BoundReplay(self.then, params)


class _BoundReplay(_BoundScripted):
    def __init__(self, then: Callable | None, replay: Replay):
        self.then, self.replay = then, replay

    def act(self, keys, env: Env, env_state, t, active):
        act = self.replay.actions[:, t]
        if self.then is not None:
            own = jax.vmap(lambda k, s: jnp.asarray(self.then(k, env, s), jnp.int32))(self.replay.then_keys, env_state)
            act = jnp.where(t < self.replay.until, act, own)
        return keys, act.astype(jnp.int32), jnp.ones(act.shape, bool)


def as_policy(policy: Any, fmt: Format | None, cfg: RolloutConfig):
    """(engine policy, params) of an `nnx.Module` (with its format) or a scripted function."""
    if isinstance(policy, nnx.Module):
        graphdef, params = nnx.split(policy)
        return ModelPolicy(graphdef, fmt, cfg), params
    if isinstance(policy, (ModelPolicy, ScriptedPolicy, ReplayPolicy)):
        raise TypeError("pass the module or the scripted function itself; engine policies are built from them.")
    if isinstance(policy, RepairingOracle):
        return policy.engine_policy()
    if callable(policy):
        return ScriptedPolicy(policy), ()
    raise TypeError(
        f"policy must be an nnx.Module or a scripted policy (key, env, state) -> action, got {type(policy).__name__}."
    )
