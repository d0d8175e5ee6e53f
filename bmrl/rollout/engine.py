"""The episode engine: one compiled `lax.while_loop` over turns, for every kind of policy.

Each turn the policy acts for every active row (a model decodes a reply into its KV cache and
parses it; a scripted policy reads the environment state), errors may be injected, the environment
steps, the turn is recorded, and the policy observes the next observation. The turn cap of each
row is data (`caps: int32[B]`): BudgetMix, a fixed budget and an evaluation grid over T all run
through the same compiled program.

    active = ~done & (turn < caps) & ~overflow     # the per-sequence turn-cap mask

Training rollouts, evaluation, demonstrations, probe states and injected errors all play episodes
here; nothing else in bmrl loops over turns (`bmrl.rollout.baseline` is the Python-driven loop kept
as the benchmark baseline and correctness oracle).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from bmrl import compiles
from bmrl.envs.base import Env
from bmrl.formats import Format
from bmrl.rollout.model_policy import ModelPolicy
from bmrl.rollout.policies import ScriptedPolicy, as_policy
from bmrl.rollout.records import Records, Turn, goes_on, record_turn
from bmrl.rollout.tokens import select, take
from bmrl.rollout.types import (
    ENV_STREAM,
    INJECT_STREAM,
    Injection,
    RolloutConfig,
    RolloutError,
    Trajectory,
    check_caps,
    held_turns,
    row_keys,
    stream,
)


@struct.dataclass
class Seen:
    """The observation each row saw before each turn (when recorded). B = batch, Tm = max turns."""

    tokens: jax.Array  # int32[B, Tm, O] (O = 0 unless observations are recorded)
    length: jax.Array  # int32[B, Tm]

    @classmethod
    def empty(cls, batch: int, max_turns: int, width: int) -> "Seen":
        return cls(tokens=jnp.zeros((batch, max_turns, width), jnp.int32), length=jnp.zeros((batch, max_turns), jnp.int32))


@struct.dataclass
class Carry:
    """The loop state: turn counter, environment and policy state, per-row flags and records."""

    t: jax.Array  # int32[]
    row: jax.Array  # int32[B]: the row's index in the caller's batch (compaction reorders rows)
    caps: jax.Array  # int32[B]
    env_keys: jax.Array  # [B] environment keys of the rows
    env_state: Any
    obs: Any  # the observation the rows see before turn t
    policy_state: Any
    active: jax.Array  # bool[B]
    records: Records  # the per-turn and per-episode records (`bmrl.rollout.records`)
    seen: Seen


def inject_errors(env: Env, inject: Injection, step_keys, env_state, action, active, t):
    """Replace actions by a uniformly random wrong one (never the oracle's) where injection fires.
    Returns (action, injected)."""
    inj_keys = stream(step_keys, INJECT_STREAM)
    oracle = jax.vmap(env.oracle_action)(env_state).astype(jnp.int32)
    coin = jax.vmap(jax.random.uniform)(inj_keys)
    wrong = jax.vmap(lambda k: jax.random.randint(jax.random.fold_in(k, 1), (), 0, max(env.num_actions - 1, 1)))(inj_keys)
    wrong = jnp.where(wrong >= oracle, wrong + 1, wrong).astype(jnp.int32)
    injected = active & inject.turns[t] & (coin < inject.prob) & (env.num_actions > 1)
    return jnp.where(injected, wrong, action), injected


def _record_obs(seen: Seen, t, obs, active) -> Seen:
    if seen.tokens.shape[-1] == 0:
        return seen
    return seen.replace(
        tokens=seen.tokens.at[:, t].set(jnp.where(active[:, None], obs.tokens, 0)),
        length=seen.length.at[:, t].set(jnp.where(active, obs.length, 0)),
    )


def make_episode(policy: Any, env: Env, cfg: RolloutConfig, record_obs: bool = False, name: str = "episode"):
    """Build the jitted `run(params, tasks, caps, key, inject) -> Trajectory` of an engine policy.

    `params` is the policy's data (a model's `nnx.split` state; `()` for scripted functions); tasks
    are a pytree with leading axis B; `caps: int32[B]` the per-row turn caps (traced: any caps, one
    compile per batch shape). `record_obs` also returns the observation before every turn.
    `run.trace_count()` tells how many times it was traced (compiled).
    """
    Tm = cfg.max_turns

    @jax.named_scope("turn")
    def turn(c: Carry, bound, inject) -> Carry:
        t, active = c.t, c.active
        seen = _record_obs(c.seen, t, c.obs, active)
        pstate, action, format_ok = bound.act(c.policy_state, env, c.env_state, t, active)
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t + 1))(c.env_keys)
        action, injected = inject_errors(env, inject, step_keys, c.env_state, action, active, t)
        with jax.named_scope("env_step"):
            new_state, new_obs, reward, term, info = jax.vmap(env.step)(step_keys, c.env_state, action, c.caps - (t + 1))
        played = Turn(action=action, reward=reward.astype(jnp.float32), format_ok=format_ok, error=info.error,
                      invalid=info.invalid, injected=injected, oracle_action=info.oracle_action.astype(jnp.int32),
                      progress=info.progress.astype(jnp.float32), success=info.success, terminated=term,
                      truncated=jnp.zeros_like(term))
        with jax.named_scope("record"):
            records = record_turn(c.records, t, active, played, cfg.format_reward)
        nxt = goes_on(t, active, played, c.caps)
        if hasattr(bound, "after_step"):  # policies that remember the last step (e.g. RepairingOracle)
            pstate = bound.after_step(pstate, action, info, active)
        obs = select(active, new_obs, c.obs)
        pstate, fits = bound.observe(pstate, env, obs, t, nxt)
        return c.replace(
            t=t + 1, env_state=select(active, new_state, c.env_state), obs=obs, policy_state=pstate,
            active=nxt & fits, records=records.overflowed(nxt & ~fits), seen=seen,
        )

    def run(params, tasks, caps, key, inject):
        bound = policy.bind(params)
        caps = jnp.clip(caps.astype(jnp.int32), 1, Tm)
        batch = caps.shape[0]
        keys = row_keys(key, batch)
        env_keys = stream(keys, ENV_STREAM)
        env_state, obs = jax.vmap(env.reset)(env_keys, tasks, caps)
        carry = Carry(
            t=jnp.int32(0), row=jnp.arange(batch, dtype=jnp.int32), caps=caps, env_keys=env_keys,
            env_state=env_state, obs=obs, policy_state=bound.start(env, obs, keys),
            active=jnp.ones((batch,), bool), records=Records.empty(batch, Tm, jax.vmap(env.progress)(env_state)),
            seen=Seen.empty(batch, Tm, env.max_obs_len if record_obs else 0),
        )
        chunk = cfg.compact_chunk(batch) if getattr(policy, "compactable", False) else batch
        c = play_compacting(carry, lambda c: turn(c, bound, inject), chunk, Tm, getattr(bound, "strip", None),
                            getattr(bound, "take_rows", take), getattr(bound, "put_rows", None))
        return Trajectory(**bound.outputs(c.policy_state), **c.records.fields(caps),
                          observations=(c.seen.tokens, c.seen.length) if record_obs else None)

    run.__name__ = run.__qualname__ = name  # XLA names the program after it: jit(rollout), jit(eval_rollout)
    return compiles.counted_jit(run, name=name)


def play_compacting(carry: Carry, turn, chunk: int, max_turns: int, strip=None, take_rows=take,
                    put_rows=None) -> Carry:
    """Run `turn` until no row is active or `max_turns`, over the live rows only, in chunks of `chunk` rows.

    With `chunk` below the batch, turns run on the whole batch while every chunk would hold a live
    row; after that each turn first packs the live rows first (a stable permutation of every per-row
    array; `take_rows(state, perm)` permutes a policy state, a model's KV cache staying in place),
    then plays the turn on chunk after chunk of `chunk` rows while a chunk holds a live row: the
    live-row count is data, so two copies of the turn in one program (whole batch, one chunk) serve
    every count, whatever the batch (a copy per batch size before: 34 s to compile at 64 rows), and
    a finished row stops costing once the live rows fit a chunk fewer. `put_rows(state, start, part)`
    writes a chunk's policy state back. Results are gathered back into the caller's order
    (`Carry.row`). With `chunk` >= the batch it is the plain loop. `strip` drops what the results do
    not need from a policy state (a model's KV cache) before that.
    """
    batch = carry.active.shape[0]

    def cond(c: Carry) -> jax.Array:
        return jnp.any(c.active) & (c.t < max_turns)

    if chunk >= batch:
        return jax.lax.while_loop(cond, turn, carry)

    def part_of(c: Carry, start) -> Carry:
        rows = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk), c.replace(t=None, policy_state=None))
        return rows.replace(t=c.t, policy_state=take_rows(c.policy_state, start + jnp.arange(chunk)))

    def put(c: Carry, start, part: Carry) -> Carry:
        rows = jax.tree.map(lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, start, 0),
                            c.replace(t=None, policy_state=None), part.replace(t=None, policy_state=None))
        return rows.replace(t=c.t, policy_state=put_rows(c.policy_state, start, part.policy_state))

    def live_turn(c: Carry) -> Carry:
        with jax.named_scope("compact"):
            perm = jnp.argsort(~c.active, stable=True)  # live rows first, in their order
            c = take(c.replace(t=None, policy_state=None), perm).replace(
                t=c.t, policy_state=take_rows(c.policy_state, perm))
        chunks = (jnp.sum(c.active) + chunk - 1) // chunk
        c = jax.lax.fori_loop(0, chunks, lambda j, c: put(c, j * chunk, turn(part_of(c, j * chunk))), c)
        return c.replace(t=c.t + 1)

    def whole(c: Carry) -> jax.Array:  # every chunk holds a live row: the whole batch at once is cheaper
        return cond(c) & (jnp.sum(c.active) > batch - chunk)

    work = jax.lax.while_loop(cond, live_turn, jax.lax.while_loop(whole, turn, carry))
    results = work.replace(t=None, policy_state=strip(work.policy_state) if strip else work.policy_state)
    return take(results, jnp.argsort(work.row)).replace(t=work.t)  # back to the caller's order


def episode_program(policy: Any, env: Env, cfg: RolloutConfig, record_obs: bool = False, name: str | None = None):
    """The cached compiled episode of `policy` on `env` (one program per static configuration and name:
    "rollout" for a model's training rollouts, "eval_rollout" for the evaluator's, "episode" for
    scripted policies)."""
    name = name or ("rollout" if isinstance(policy, ModelPolicy) else "episode")
    return compiles.program(name, (policy, env, cfg, record_obs), lambda: make_episode(policy, env, cfg, record_obs, name))


def default_format(env: Env) -> Format:
    """The format of `env`'s tokenizer: its chat template's if it has one (real instruct models), else
    the plain built-in one (tiny from-scratch models). Cached per env, so repeated rollouts reuse one
    compiled program."""
    from bmrl.chat import env_format

    return env_format(env)


def check_config(env: Env, fmt: Format, cfg: RolloutConfig, min_cap: int) -> None:
    """Refuse, with the numbers, a configuration that cannot run even the smallest budget."""
    need_reply = fmt.min_reply_tokens(env.max_action_len)
    if cfg.max_reply_tokens < need_reply:
        raise RolloutError(
            f"max_reply_tokens={cfg.max_reply_tokens} cannot hold the longest action of {env.name} "
            f"({env.max_action_len} tokens) in the {fmt.reply_format!r} reply format with its stop token; "
            f"set max_reply_tokens >= {need_reply}."
        )
    held = held_turns(min_cap, cfg.history_turns)
    need = fmt.tokens_needed(held, env.max_obs_len, cfg.max_reply_tokens)
    if need > cfg.max_len:
        window = "" if held == min_cap else f" (a history window of {cfg.history_turns}: {held} turns at once)"
        raise RolloutError(
            f"max_len={cfg.max_len} cannot hold even the smallest budget: {min_cap} turns of {env.name}{window} "
            f"need up to {need} tokens (prompt {fmt.first_chunk_len(env.max_obs_len)}, "
            f"{cfg.max_reply_tokens} per reply, {fmt.turn_chunk_len(env.max_obs_len) - 1} per "
            f"observation). Raise max_len to >= {need} or lower the budget."
        )


def make_rollout(graphdef: nnx.GraphDef, env: Env, fmt: Format, cfg: RolloutConfig):
    """The cached compiled rollout of a model: `run(params, tasks, caps, key, inject) -> Trajectory`."""
    return episode_program(ModelPolicy(graphdef, fmt, cfg), env, cfg)


def _min_cap(caps: Any, cfg: RolloutConfig) -> int:
    if isinstance(caps, jax.core.Tracer):
        return 1
    check_caps(caps, cfg)
    return int(np.min(np.asarray(caps))) if np.size(caps) else 1


def rollout(
    policy: nnx.Module,
    env: Env,
    tasks: Any,
    caps: Any,
    key: jax.Array,
    cfg: RolloutConfig,
    fmt: Format | None = None,
    inject: Injection | None = None,
) -> Trajectory:
    """Run one batch of multi-turn episodes of a model with per-sequence turn caps.

    tasks: pytree of arrays with leading axis B (e.g. {"seed": int32[B]}); caps: int32[B].
    key: one PRNG key (split per sequence) or one key per sequence ([B] typed keys / [B, 2] raw).
    Concrete caps are validated here (each in [1, max_turns]); the buffer must hold the smallest.
    """
    fmt = fmt or default_format(env)
    check_config(env, fmt, cfg, _min_cap(caps, cfg))
    graphdef, params = nnx.split(policy)
    run = make_rollout(graphdef, env, fmt, cfg)
    inject = inject if inject is not None else Injection.none(cfg.max_turns)
    return run(params, tasks, jnp.asarray(caps, jnp.int32), key, inject)


def play(
    policy: Any,
    env: Env,
    tasks: Any,
    caps: Any,
    key: jax.Array,
    max_turns: int,
    *,
    params: Any = (),
    inject: Injection | None = None,
    record_obs: bool = False,
) -> Trajectory:
    """Play a batch of episodes with a scripted policy: a `(key, env, state) -> action` function, or an
    engine policy (e.g. `ReplayPolicy`) with its `params`. Same keys, caps and injection as `rollout`;
    the Trajectory's token arrays are empty ([B, 0])."""
    if isinstance(policy, nnx.Module):
        raise TypeError("play runs scripted policies; use bmrl.rollout.rollout for a model.")
    if not hasattr(policy, "bind"):
        policy, params = as_policy(policy, None, None)
    cfg = RolloutConfig(max_turns=int(max_turns), max_reply_tokens=1, max_len=1)
    _min_cap(caps, cfg)
    run = episode_program(policy, env, cfg, record_obs)
    inject = inject if inject is not None else Injection.none(cfg.max_turns)
    return run(params, tasks, jnp.asarray(caps, jnp.int32), key, inject)


__all__ = ["Carry", "ScriptedPolicy", "Seen", "check_config", "default_format", "episode_program",
           "inject_errors", "make_episode", "make_rollout", "play", "rollout"]
