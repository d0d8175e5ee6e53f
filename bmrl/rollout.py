"""The compiled multi-turn rollout: generation and environment steps in one `jax.jit`.

One `lax.while_loop` over turns. Each turn every active sequence decodes a reply into a fixed-size KV
cache until its stop token or the per-turn token limit, the reply is parsed into an action id in
tokens, the environment steps, and the next observation is prefilled at the sequence's own offset.
The turn cap of each sequence is data (`caps: int32[batch]`): BudgetMix, a fixed budget and an
evaluation grid over T all run through the same compiled program.

    active = ~done & (turn < caps) & ~overflow     # the per-sequence turn-cap mask

Sequences that finish stay in the batch behind that mask; the loop exits when none is active.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from bmrl.envs.base import INVALID, Env
from bmrl.formats import Format
from bmrl.sampling import SamplingConfig, sample


class RolloutError(ValueError):
    """A rollout configuration or input that cannot work (buffer too small, cap out of range...)."""


@struct.dataclass
class Trajectory:
    """A batch of multi-turn conversations. B = batch, L = context buffer, Tm = max turns."""

    tokens: jax.Array  # int32[B, L]: prompt, observations, replies; pad after `length`
    length: jax.Array  # int32[B]
    loss_mask: jax.Array  # float32[B, L]: 1 on tokens the policy sampled (stop token included)
    logprobs: jax.Array  # float32[B, L]: sampling-policy log-prob of each sampled token
    turn_of_token: jax.Array  # int32[B, L]: 0-based turn of each token; -1 prompt prefix/padding
    action: jax.Array  # int32[B, Tm]: parsed action id (INVALID = -1); -1 where inactive
    reward: jax.Array  # float32[B, Tm]
    error: jax.Array  # bool[B, Tm]
    invalid: jax.Array  # bool[B, Tm]: the reply did not parse to an action
    format_error: jax.Array  # bool[B, Tm]: the reply broke the reply format (no parsable answer)
    injected: jax.Array  # bool[B, Tm]: the action was replaced by a forced wrong one (error injection)
    oracle_action: jax.Array  # int32[B, Tm]: best action in the state before the turn
    progress: jax.Array  # float32[B, Tm + 1]: index 0 after reset, t + 1 after turn t
    turn_active: jax.Array  # bool[B, Tm]: the sequence acted at turn t
    caps: jax.Array  # int32[B]
    turns_used: jax.Array  # int32[B]
    success: jax.Array  # bool[B]
    first_success_turn: jax.Array  # int32[B]: 1-based; 0 = never
    terminated: jax.Array  # bool[B]: the environment ended the episode
    truncated: jax.Array  # bool[B]: stopped by its turn cap
    overflow: jax.Array  # bool[B]: stopped because the next turn would not fit the buffer

    @property
    def outcome_reward(self) -> jax.Array:
        """float32[B]: the summed per-turn reward of each sequence."""
        return self.reward.sum(axis=-1)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Static shapes of a rollout.

    max_turns: Tm, the largest cap the compiled loop supports (the per-turn arrays' width).
    max_reply_tokens: per-turn limit of sampled tokens, the stop token included; a reply that
      reaches it without a stop token gets one appended (not sampled, not trained on).
    max_len: L, the context buffer of each sequence (KV cache and token arrays).
    """

    max_turns: int
    max_reply_tokens: int
    max_len: int
    sampling: SamplingConfig = SamplingConfig()
    format_reward: float = 0.0  # added to a turn's reward when its reply breaks the format (< 0 penalises)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_reply_tokens", "max_len"):
            if getattr(self, name) < 1:
                raise RolloutError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}.")


@struct.dataclass
class Injection:
    """Controlled error injection: at turns where `turns[t]`, with probability `prob`, the parsed
    action is replaced by a uniformly random wrong one (not the oracle's). Data, not shapes."""

    prob: jax.Array  # float32[]
    turns: jax.Array  # bool[Tm]

    @classmethod
    def none(cls, max_turns: int) -> "Injection":
        return cls(prob=jnp.float32(0.0), turns=jnp.zeros((max_turns,), bool))

    @classmethod
    def at(cls, max_turns: int, turns, prob: float) -> "Injection":
        """Inject with probability `prob` at the 0-based turns listed in `turns`."""
        mask = np.zeros((max_turns,), bool)
        mask[list(turns)] = True
        return cls(prob=jnp.float32(prob), turns=jnp.asarray(mask))


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
    need = fmt.tokens_needed(min_cap, env.max_obs_len, cfg.max_reply_tokens)
    if need > cfg.max_len:
        raise RolloutError(
            f"max_len={cfg.max_len} cannot hold even the smallest budget: {min_cap} turns of {env.name} "
            f"need up to {need} tokens (prompt {fmt.first_chunk_len(env.max_obs_len)}, "
            f"{cfg.max_reply_tokens} per reply, {fmt.turn_chunk_len(env.max_obs_len) - 1} per "
            f"observation). Raise max_len to >= {need} or lower the budget."
        )


def check_caps(caps: Any, cfg: RolloutConfig) -> None:
    """Validate concrete caps on the host: integers in [1, max_turns]."""
    caps = np.asarray(caps)
    if caps.ndim != 1 or not np.issubdtype(caps.dtype, np.integer):
        raise RolloutError(f"caps must be a 1-D integer array [batch], got {caps.dtype}{list(caps.shape)}.")
    if caps.size and (caps.min() < 1 or caps.max() > cfg.max_turns):
        raise RolloutError(
            f"Every turn cap must be in [1, max_turns={cfg.max_turns}]; got caps from {caps.min()} "
            f"to {caps.max()}. Raise RolloutConfig.max_turns or lower the budget."
        )


def row_keys(key: jax.Array, batch: int) -> jax.Array:
    """One PRNG key per sequence: `key` split B ways, or `key` itself if it already holds B keys.

    Passing per-row keys makes a sequence's trajectory independent of the batch it runs in.
    """
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (1 if typed else 2):
        if key.shape[0] != batch:
            raise RolloutError(f"Got {key.shape[0]} per-row keys for a batch of {batch}.")
        return key
    return jax.random.split(key, batch)


def parse_replies(env: Env, fmt: Format, reply: jax.Array, reply_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """reply: int32[B, R] (stop token removed, padded), reply_len: [B] -> (action ids [B], format_ok [B]).

    The format extracts each reply's answer span; the environment matches it against its action
    table. An answer longer than every action, or a reply that breaks the format, is INVALID.
    """
    width = max(env.max_action_len, 1)
    answer, answer_len, format_ok = jax.vmap(fmt.extract_answer)(reply, reply_len)
    answer = answer[:, :width]
    if answer.shape[1] < width:
        answer = jnp.pad(answer, ((0, 0), (0, width - answer.shape[1])), constant_values=fmt.pad_id)
    act = jax.vmap(env.parse_action)(answer, jnp.minimum(answer_len, width))
    act = jnp.where((answer_len > env.max_action_len) | ~format_ok, INVALID, act)
    return act.astype(jnp.int32), format_ok


def _assemble(segments: list[tuple[jax.Array, jax.Array]], width: int, pad: int) -> tuple[jax.Array, jax.Array]:
    """Concatenate per-row variable-length segments into [B, width] (+ lengths [B]).

    segments: (tokens [B, n_i], lengths [B]) pairs; tokens past a row's length are ignored.
    """
    batch = segments[0][0].shape[0]
    out = jnp.full((batch, width), pad, jnp.int32)
    off = jnp.zeros((batch,), jnp.int32)
    rows = jnp.arange(batch)[:, None]
    for toks, n in segments:
        k = toks.shape[1]
        if k == 0:
            continue
        j = jnp.arange(k)[None, :]
        idx = jnp.where(j < n[:, None], off[:, None] + j, width)
        out = out.at[rows, idx].set(toks.astype(jnp.int32), mode="drop")
        off = off + n
    return out, off


def _write(buf: jax.Array, start: jax.Array, values: jax.Array, n: jax.Array) -> jax.Array:
    """buf[b, start[b] + j] = values[b, j] for j < n[b]; writes past the buffer are dropped."""
    values = jnp.broadcast_to(values, (buf.shape[0], values.shape[-1]))
    batch, width = values.shape
    j = jnp.arange(width)[None, :]
    idx = jnp.where(j < n[:, None], start[:, None] + j, buf.shape[1])
    return buf.at[jnp.arange(batch)[:, None], idx].set(values.astype(buf.dtype), mode="drop")


def _fixed(frag: np.ndarray, batch: int) -> tuple[jax.Array, jax.Array]:
    """A host fragment broadcast to every row, as an assemble segment."""
    toks = jnp.broadcast_to(jnp.asarray(frag, jnp.int32)[None, :], (batch, len(frag)))
    return toks, jnp.full((batch,), len(frag), jnp.int32)


def _select(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per-row select over pytrees whose leaves lead with the batch axis."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, new, old)


def make_rollout(graphdef: nnx.GraphDef, env: Env, fmt: Format, cfg: RolloutConfig):
    """Build the jitted rollout `run(params, tasks, caps, key, inject) -> Trajectory`.

    `params` is the state half of `nnx.split(policy)`; tasks are a pytree with leading axis B;
    `caps: int32[B]` the per-sequence turn caps (traced: any caps, one compile per batch shape).
    `run.trace_count()` tells how many times it was traced (compiled).
    """
    L, R, Tm = cfg.max_len, cfg.max_reply_tokens, cfg.max_turns
    stop_ids = jnp.asarray(fmt.stop_ids, jnp.int32)
    pad = fmt.pad_id
    first_width = fmt.first_chunk_len(env.max_obs_len)
    turn_width = fmt.turn_chunk_len(env.max_obs_len)
    traces = [0]

    def wrap_obs(obs, batch):
        return [_fixed(fmt.obs_open, batch), (obs.tokens, obs.length), _fixed(fmt.obs_close, batch)]

    def run(params, tasks, caps, key, inject):
        traces[0] += 1
        model = nnx.merge(graphdef, params)
        caps = jnp.clip(caps.astype(jnp.int32), 1, Tm)
        batch = caps.shape[0]
        keys = row_keys(key, batch)
        env_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
        tok_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
        rows = jnp.arange(batch)

        env_state, obs = jax.vmap(env.reset)(env_keys, tasks, caps)

        # Turn 0 prompt: prefix + first observation, prefilled from offset 0.
        chunk, n = _assemble([_fixed(fmt.prefix, batch)] + wrap_obs(obs, batch), first_width, pad)
        zeros = jnp.zeros((batch,), jnp.int32)
        tokens = _write(jnp.full((batch, L), pad, jnp.int32), zeros, chunk, n)
        turn_ids = jnp.where(jnp.arange(first_width)[None, :] < len(fmt.prefix), -1, 0)
        turn_of_token = _write(jnp.full((batch, L), -1, jnp.int32), zeros, turn_ids, n)
        cache = model.init_cache(batch, L)
        logits, cache = model.extend(chunk, n, zeros, cache, last_only=True)
        next_logits = logits[:, 0]

        f32 = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
        carry = dict(
            t=jnp.int32(0), cache=cache, next_logits=next_logits, cache_len=n, n_tok=n,
            tokens=tokens, loss_mask=f32(batch, L), logprobs=f32(batch, L), turn_of_token=turn_of_token,
            env_state=env_state, obs=obs, active=jnp.ones((batch,), bool),
            action=jnp.full((batch, Tm), INVALID, jnp.int32), reward=f32(batch, Tm),
            error=jnp.zeros((batch, Tm), bool), invalid=jnp.zeros((batch, Tm), bool),
            format_error=jnp.zeros((batch, Tm), bool), injected=jnp.zeros((batch, Tm), bool),
            oracle_action=jnp.full((batch, Tm), INVALID, jnp.int32), progress=f32(batch, Tm + 1),
            turn_active=jnp.zeros((batch, Tm), bool), turns_used=zeros, success=jnp.zeros((batch,), bool),
            first_success_turn=zeros, terminated=jnp.zeros((batch,), bool),
            overflow=jnp.zeros((batch,), bool),
        )

        def decode_reply(c):
            """Sample one reply per active row into the buffer; returns carry and reply start."""
            t = c["t"]

            def cond(d):
                return jnp.any(d["decoding"]) & (d["i"] < R)

            def body(d):
                i = d["i"]
                keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, t), i))(tok_keys)
                tok, lp = sample(keys, d["next_logits"], cfg.sampling)
                is_stop = jnp.isin(tok, stop_ids)
                forced = d["decoding"] & ~is_stop & (i == R - 1)
                tok = jnp.where(forced, stop_ids[0], tok)
                sampled = d["decoding"] & ~forced
                dec = d["decoding"]
                one = dec.astype(jnp.int32)
                pos = d["n_tok"][:, None]
                d["tokens"] = _write(d["tokens"], d["n_tok"], tok[:, None], one)
                d["loss_mask"] = _write(d["loss_mask"], d["n_tok"], sampled[:, None], one)
                d["logprobs"] = _write(d["logprobs"], d["n_tok"], jnp.where(sampled, lp, 0.0)[:, None], one)
                d["turn_of_token"] = _write(d["turn_of_token"], d["n_tok"], jnp.broadcast_to(t, pos.shape), one)
                d["n_tok"] = d["n_tok"] + one
                cont = dec & ~is_stop & ~forced

                def feed(args):
                    cache, _ = args
                    lg, cache = model.extend(tok[:, None], cont.astype(jnp.int32), d["cache_len"], cache)
                    return cache, lg[:, 0]

                d["cache"], d["next_logits"] = jax.lax.cond(
                    jnp.any(cont), feed, lambda a: a, (d["cache"], d["next_logits"])
                )
                d["cache_len"] = d["cache_len"] + cont.astype(jnp.int32)
                d["decoding"] = cont
                d["i"] = i + 1
                return d

            keys = ("cache", "next_logits", "cache_len", "n_tok", "tokens", "loss_mask", "logprobs", "turn_of_token")
            d = {k: c[k] for k in keys}
            d.update(decoding=c["active"], i=jnp.int32(0))
            d = jax.lax.while_loop(cond, body, d)
            return {**c, **{k: d[k] for k in keys}}

        def turn(c):
            t, active = c["t"], c["active"]
            reply_start = c["n_tok"]
            c = decode_reply(c)
            # Parse: the reply without its stop token -> its answer span -> an action id, in tokens.
            reply_len = c["n_tok"] - reply_start - 1
            idx = jnp.clip(reply_start[:, None] + jnp.arange(R)[None, :], 0, L - 1)
            reply = jnp.take_along_axis(c["tokens"], idx, axis=1)
            reply = jnp.where(jnp.arange(R)[None, :] < reply_len[:, None], reply, pad)
            act, format_ok = parse_replies(env, fmt, reply, reply_len)

            step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t + 1))(env_keys)
            # Error injection: a forced wrong action (never the oracle's) with probability inject.prob.
            inj_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0x5EED))(step_keys)
            oracle = jax.vmap(env.oracle_action)(c["env_state"]).astype(jnp.int32)
            coin = jax.vmap(lambda k: jax.random.uniform(k))(inj_keys)
            wrong = jax.vmap(lambda k: jax.random.randint(jax.random.fold_in(k, 1), (), 0, max(env.num_actions - 1, 1)))(inj_keys)
            wrong = jnp.where(wrong >= oracle, wrong + 1, wrong).astype(jnp.int32)
            injected = active & inject.turns[t] & (coin < inject.prob) & (env.num_actions > 1)
            act = jnp.where(injected, wrong, act)
            turns_left = caps - (t + 1)
            new_state, new_obs, reward, term, info = jax.vmap(env.step)(step_keys, c["env_state"], act, turns_left)
            c["env_state"] = _select(active, new_state, c["env_state"])
            c["obs"] = _select(active, new_obs, c["obs"])

            def record(name, value):
                c[name] = c[name].at[:, t].set(jnp.where(active, value, c[name][:, t]))

            record("action", act)
            record("reward", reward.astype(jnp.float32) + jnp.where(format_ok, 0.0, cfg.format_reward))
            record("format_error", ~format_ok)
            record("injected", injected)
            record("error", info.error)
            record("invalid", info.invalid)
            record("oracle_action", info.oracle_action.astype(jnp.int32))
            record("turn_active", active)
            c["progress"] = c["progress"].at[:, t + 1].set(
                jnp.where(active, info.progress.astype(jnp.float32), c["progress"][:, t])
            )
            won = active & info.success
            c["first_success_turn"] = jnp.where(won & ~c["success"], t + 1, c["first_success_turn"])
            c["success"] = c["success"] | won
            c["terminated"] = c["terminated"] | (active & term)
            c["turns_used"] = c["turns_used"] + active.astype(jnp.int32)

            # Next turn: who continues, and does the next observation + a full reply fit the buffer?
            nxt = active & ~term & ~won & (t + 1 < caps)
            chunk, n = _assemble(
                [(c["tokens"][rows, c["cache_len"]][:, None], jnp.ones((batch,), jnp.int32)),
                 _fixed(fmt.reply_close, batch)] + wrap_obs(c["obs"], batch),
                turn_width, pad,
            )
            fits = c["cache_len"] + n + R <= L
            c["overflow"] = c["overflow"] | (nxt & ~fits)
            nxt = nxt & fits
            n = jnp.where(nxt, n, 0)

            def prefill(args):
                cache, prev = args
                lg, cache = model.extend(chunk, n, c["cache_len"], cache, last_only=True)
                return cache, jnp.where(nxt[:, None], lg[:, 0], prev)

            c["cache"], c["next_logits"] = jax.lax.cond(
                jnp.any(nxt), prefill, lambda a: a, (c["cache"], c["next_logits"])
            )
            c["tokens"] = _write(c["tokens"], c["cache_len"], chunk, n)
            c["turn_of_token"] = _write(
                c["turn_of_token"], c["cache_len"],
                jnp.where(jnp.arange(turn_width)[None, :] == 0, t, t + 1), n,
            )
            c["cache_len"] = c["cache_len"] + n
            c["n_tok"] = jnp.where(nxt, c["cache_len"], c["n_tok"])
            c["active"] = nxt
            c["t"] = t + 1
            return c

        c = jax.lax.while_loop(lambda c: jnp.any(c["active"]) & (c["t"] < Tm), turn, carry)
        truncated = ~c["terminated"] & ~c["success"] & ~c["overflow"] & (c["turns_used"] >= caps)
        return Trajectory(
            tokens=c["tokens"], length=c["n_tok"], loss_mask=c["loss_mask"], logprobs=c["logprobs"],
            turn_of_token=jnp.where(jnp.arange(L)[None, :] < c["n_tok"][:, None], c["turn_of_token"], -1),
            action=c["action"], reward=c["reward"], error=c["error"], invalid=c["invalid"],
            format_error=c["format_error"], injected=c["injected"], oracle_action=c["oracle_action"], progress=c["progress"], turn_active=c["turn_active"],
            caps=caps, turns_used=c["turns_used"], success=c["success"],
            first_success_turn=c["first_success_turn"], terminated=c["terminated"] | c["success"],
            truncated=truncated, overflow=c["overflow"],
        )

    jitted = jax.jit(run)
    jitted_run = functools.wraps(run)(lambda *a: jitted(*a))
    jitted_run.trace_count = lambda: traces[0]
    jitted_run.lower = jitted.lower
    return jitted_run


@functools.lru_cache(maxsize=64)
def _cached_rollout(graphdef, env, fmt, cfg):
    return make_rollout(graphdef, env, fmt, cfg)


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
    """Run one batch of multi-turn episodes with per-sequence turn caps; returns a Trajectory.

    tasks: pytree of arrays with leading axis B (e.g. {"seed": int32[B]}); caps: int32[B].
    key: one PRNG key (split per sequence) or one key per sequence ([B] typed keys / [B, 2] raw).
    Concrete caps are validated here (each in [1, max_turns]); the buffer must hold the smallest.
    """
    fmt = fmt or default_format(env)
    if not isinstance(caps, jax.core.Tracer):
        check_caps(caps, cfg)
        min_cap = int(np.min(np.asarray(caps))) if np.size(caps) else 1
    else:
        min_cap = 1
    check_config(env, fmt, cfg, min_cap)
    graphdef, params = nnx.split(policy)
    run = _cached_rollout(graphdef, env, fmt, cfg)
    inject = inject if inject is not None else Injection.none(cfg.max_turns)
    return run(params, tasks, jnp.asarray(caps, jnp.int32), key, inject)
