"""Policies behind one interface, called by the episode engine once per turn.

A policy is a static, hashable description (it keys the compiled program) plus `params`, a pytree
of data passed into the compiled episode. `policy.bind(params)` inside the trace gives an object with

    start(env, obs, keys) -> state            # before turn 0: e.g. prefill the prompt + first observation
    act(state, env, env_state, t, active) -> (state, action int32[B], format_ok bool[B])
    observe(state, obs, t, nxt) -> (state, fits bool[B])   # the next observation, for rows going on
    outputs(state) -> dict of token arrays    # tokens, length, loss_mask, logprobs, turn_of_token
    after_step(state, action, info, active) -> state   # optional: sees the step's action and StepInfo

- `ModelPolicy`: a language model. Acting = decode a reply into the KV cache until a stop token or
  the per-turn limit, then parse it into an action id in tokens; observing = prefill the reply's
  closing fragment and the next observation at the row's own offset.
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
from bmrl.rollout.tokens import assemble, fixed, parse_replies, write
from bmrl.rollout.types import SCRIPT_STREAM, TOKEN_STREAM, RolloutConfig, stream
from bmrl.sampling import policy_logprobs, sample

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


# ---- the language-model policy -----------------------------------------------------------------


@struct.dataclass
class ModelState:
    """Per-row state of a model policy inside the episode. B = batch, L = buffer, V = vocab."""

    cache: Any  # the decoder's per-layer KV cache
    next_logits: jax.Array  # float32[B, V]: logits of the next token to sample
    cache_len: jax.Array  # int32[B]: tokens in the cache
    n_tok: jax.Array  # int32[B]: tokens in the buffer (the last sampled token is not yet in the cache)
    tokens: jax.Array  # int32[B, L]
    loss_mask: jax.Array  # float32[B, L]
    logprobs: jax.Array  # float32[B, L]
    turn_of_token: jax.Array  # int32[B, L]
    tok_keys: jax.Array  # [B] sampling keys
    slot: jax.Array  # int32[B]: the row's row in `cache` (the cache stays in place when the batch compacts)


@dataclasses.dataclass(frozen=True)
class ModelPolicy:
    """A Flax NNX decoder (its graph; the weights are `params`) speaking the format `fmt`."""

    graphdef: nnx.GraphDef
    fmt: Format
    cfg: RolloutConfig
    compactable = True  # finished rows can leave the batch (`take_rows`; the KV cache stays in place)

    def bind(self, params) -> "_BoundModel":
        return _BoundModel(self, nnx.merge(self.graphdef, params))


def run_once(pred: jax.Array, fn: Callable, carry: Any) -> Any:
    """`fn(carry)` if `pred` else `carry`, as a loop that runs once or not at all. Not `lax.cond`: XLA
    copies a KV cache passed through a conditional's branches whole, on every call (in the rollout:
    two copies of the cache per turn, which made rollouts 1.1-1.3x slower on 2 idle CPU cores), while
    a loop's carry is updated in place (`tests/test_rollout.py` checks the compiled rollout for
    cache-sized copies)."""

    def body(c):
        return jnp.bool_(False), fn(c[1])

    return jax.lax.while_loop(lambda c: c[0], body, (jnp.asarray(pred, bool), carry))[1]


class _BoundModel:
    """A model policy inside one trace: the merged module and the static shapes."""

    def __init__(self, spec: ModelPolicy, model):
        self.model, self.fmt, self.cfg = model, spec.fmt, spec.cfg
        self.stop_ids = jnp.asarray(spec.fmt.stop_ids, jnp.int32)

    def _obs_segments(self, obs, batch):
        f = self.fmt
        return [fixed(f.obs_open, batch), (obs.tokens, obs.length), fixed(f.obs_close, batch)]

    def start(self, env: Env, obs, keys) -> ModelState:
        """Turn 0 prompt: the format's prefix (the same for every row: prefilled once and shared) and
        each row's first observation, prefilled at its real length."""
        batch, P, pad = keys.shape[0], len(self.fmt.prefix), self.fmt.pad_id
        width = self.fmt.first_chunk_len(env.max_obs_len)
        obs_chunk, n_obs = assemble(self._obs_segments(obs, batch), width - P, pad)
        if P == 0:
            return self.start_from_context(obs_chunk, n_obs, keys, jnp.zeros((1, width), jnp.int32))
        prefix = jnp.asarray(self.fmt.prefix, jnp.int32)[None, :]
        one = jnp.ones((1,), jnp.int32)
        _, shared = self.model.extend(prefix, one * P, one * 0, self.model.init_cache(1, self.cfg.max_len))
        cache = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape[1:]), shared)
        offsets = jnp.full((batch,), P, jnp.int32)
        logits, cache = self._prefill(obs_chunk, n_obs, offsets, cache)
        L, zeros = self.cfg.max_len, jnp.zeros((batch,), jnp.int32)
        tokens = write(jnp.full((batch, L), pad, jnp.int32), zeros, jnp.broadcast_to(prefix, (batch, P)), zeros + P)
        turn_ids = write(jnp.full((batch, L), -1, jnp.int32), offsets, jnp.zeros((1, width - P), jnp.int32), n_obs)
        f32 = jnp.zeros((batch, L), jnp.float32)
        return ModelState(
            cache=cache, next_logits=logits, cache_len=offsets + n_obs, n_tok=offsets + n_obs,
            tokens=write(tokens, offsets, obs_chunk, n_obs), loss_mask=f32, logprobs=f32, turn_of_token=turn_ids,
            tok_keys=stream(keys, TOKEN_STREAM), slot=jnp.arange(batch, dtype=jnp.int32),
        )

    @staticmethod
    def _rows(s: ModelState) -> jax.Array | None:
        """The cache rows of a compacted batch; None (row b is cache row b) while the batch is whole."""
        return None if s.slot.shape[0] == s.cache[0][0].shape[0] else s.slot

    def take_rows(self, s: ModelState, keep: jax.Array) -> ModelState:
        """Rows `keep` of the batch (compaction): every per-row array is gathered, the KV cache is not
        (it stays in place, read and written through `slot`), so a compaction step copies no cache."""
        kept = jax.tree.map(lambda x: x[keep], s.replace(cache=None))
        return kept.replace(cache=s.cache)

    def _prefill(self, chunk: jax.Array, n: jax.Array, offsets: jax.Array, cache, tight: bool = False,
                 rows: jax.Array | None = None, prev: jax.Array | None = None):
        """Prefill `chunk: [B, W]` (row b: its first n[b] tokens) at `offsets`. With `tight`, at the
        smaller of two static widths (W rounded up to half, or W) that holds the longest row, so the
        cost follows the real lengths (each width is one more trace of the model: two keep compiles
        cheap). `rows`: the cache row of each batch row. With `prev: [B, V]`, rows with n = 0 keep
        those logits and a chunk with no token runs no model. Returns (logits of each row's last
        token [B, V], cache).
        The width is chosen by `run_once`, not by `lax.cond`/`switch` (see there)."""
        W = chunk.shape[1]
        half = -(-W // 16) * 8  # ceil(W / 2) rounded up to a multiple of 8
        widths = [half, W] if tight and half < W else [W]
        longest = jnp.max(n)
        logits = jnp.zeros((chunk.shape[0], self.model.config.vocab_size), jnp.float32) if prev is None else prev

        def at(w):
            def go(carry):
                cache, prev_logits = carry
                lg, cache = self.model.extend(chunk[:, :w], n, offsets, cache, last_only=True, cache_rows=rows)
                return cache, jnp.where((n > 0)[:, None], lg[:, 0], prev_logits)
            return go

        if len(widths) == 1:
            runs = [jnp.bool_(True) if prev is None else longest > 0]
        else:  # the narrow chunk when it holds every row, else the whole one
            runs = [(longest > 0) & (longest <= half), longest > half]
        carry = (cache, logits)
        for w, run in zip(widths, runs):
            carry = run_once(run, at(w), carry)
        cache, logits = carry
        return logits, cache

    def start_from_context(self, context: jax.Array, lengths: jax.Array, keys, turn_ids=None) -> ModelState:
        """Prefill any context `[B, W]` (+ lengths [B]) from offset 0: the state before a reply."""
        batch, L = keys.shape[0], self.cfg.max_len
        zeros = jnp.zeros((batch,), jnp.int32)
        turn_ids = jnp.zeros((1, context.shape[1]), jnp.int32) if turn_ids is None else turn_ids
        cache = self.model.init_cache(batch, L)
        logits, cache = self.model.extend(context, lengths, zeros, cache, last_only=True)
        f32 = jnp.zeros((batch, L), jnp.float32)
        return ModelState(
            cache=cache, next_logits=logits[:, 0], cache_len=lengths, n_tok=lengths,
            tokens=write(jnp.full((batch, L), self.fmt.pad_id, jnp.int32), zeros, context, lengths),
            loss_mask=f32, logprobs=f32,
            turn_of_token=write(jnp.full((batch, L), -1, jnp.int32), zeros, turn_ids, lengths),
            tok_keys=stream(keys, TOKEN_STREAM), slot=jnp.arange(batch, dtype=jnp.int32),
        )

    def strip(self, s: ModelState) -> ModelState:
        """The state without its KV cache and logits (what results need, for compaction)."""
        return s.replace(cache=None, next_logits=None)

    def decode_reply(self, s: ModelState, t, decoding: jax.Array) -> ModelState:
        """Sample one reply per decoding row into the buffer, until a stop token or the per-turn limit
        (a reply that reaches it gets a stop token appended: not sampled, not trained on)."""
        R, model = self.cfg.max_reply_tokens, self.model

        def cond(d):
            s, decoding, i = d
            return jnp.any(decoding) & (i < R)

        def body(d):
            s, decoding, i = d
            keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, t), i))(s.tok_keys)
            tok, lp = sample(keys, s.next_logits, self.cfg.sampling)
            is_stop = jnp.isin(tok, self.stop_ids)
            forced = decoding & ~is_stop & (i == R - 1)
            tok = jnp.where(forced, self.stop_ids[0], tok)
            sampled = decoding & ~forced
            one = decoding.astype(jnp.int32)
            cont = decoding & ~is_stop & ~forced

            def feed(args):
                cache, _ = args
                lg, cache = model.extend(tok[:, None], cont.astype(jnp.int32), s.cache_len, cache,
                                         cache_rows=self._rows(s))
                return cache, lg[:, 0]

            cache, next_logits = run_once(jnp.any(cont), feed, (s.cache, s.next_logits))
            s = s.replace(
                tokens=write(s.tokens, s.n_tok, tok[:, None], one),
                loss_mask=write(s.loss_mask, s.n_tok, sampled[:, None], one),
                logprobs=write(s.logprobs, s.n_tok, jnp.where(sampled, lp, 0.0)[:, None], one),
                turn_of_token=write(s.turn_of_token, s.n_tok, jnp.broadcast_to(t, (tok.shape[0], 1)), one),
                n_tok=s.n_tok + one, cache=cache, next_logits=next_logits,
                cache_len=s.cache_len + cont.astype(jnp.int32),
            )
            return s, cont, i + 1

        s, _, _ = jax.lax.while_loop(cond, body, (s, decoding, jnp.int32(0)))
        return s

    def force_reply(self, s: ModelState, reply: jax.Array, reply_len: jax.Array, t, forcing: jax.Array) -> ModelState:
        """Teacher forcing: write the given reply (`reply: int32[B, W]`, its first `reply_len[b]`
        tokens, stop excluded) and the first stop id into the buffer of each forcing row, as
        `decode_reply` would have had the model sampled them: the same buffer, loss mask (1 on the
        reply and its stop), turn ids and cache (the reply in it, the stop not yet); logprobs are the
        sampling distribution's log-probs of the forced tokens. Needs reply_len + 1 <= max_reply_tokens."""
        batch, W = reply.shape
        n = jnp.where(forcing, reply_len, 0).astype(jnp.int32)
        stop = jnp.full((batch, 1), self.stop_ids[0], jnp.int32)
        full = jnp.concatenate([reply.astype(jnp.int32), stop], axis=1)  # [B, W + 1]
        full = jnp.where(jnp.arange(W + 1)[None, :] == n[:, None], self.stop_ids[0], full)  # stop after the reply

        def feed(carry):
            cache, _ = carry
            lg, cache = self.model.extend(reply, n, s.cache_len, cache, cache_rows=self._rows(s))
            return cache, lg

        no_logits = jnp.zeros((batch, W, s.next_logits.shape[-1]), jnp.float32)
        cache, lg = run_once(jnp.any(n > 0), feed, (s.cache, no_logits))
        logits = jnp.concatenate([s.next_logits[:, None, :], lg], axis=1)  # [B, W + 1, V]: before each token
        logp = policy_logprobs(logits, self.cfg.sampling)
        lp = jnp.take_along_axis(logp, full[..., None], axis=-1)[..., 0]
        count = jnp.where(forcing, n + 1, 0)
        last = jnp.take_along_axis(logits, n[:, None, None], axis=1)[:, 0]
        return s.replace(
            tokens=write(s.tokens, s.n_tok, full, count),
            loss_mask=write(s.loss_mask, s.n_tok, jnp.ones_like(lp), count),
            logprobs=write(s.logprobs, s.n_tok, lp, count),
            turn_of_token=write(s.turn_of_token, s.n_tok, jnp.broadcast_to(t, full.shape), count),
            n_tok=s.n_tok + count, cache=cache, cache_len=s.cache_len + n,
            next_logits=jnp.where(forcing[:, None], last, s.next_logits),
        )

    def reply(self, s: ModelState, reply_start: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The reply written since `reply_start`, without its stop token -> (tokens [B, R] padded, length [B])."""
        R, L = self.cfg.max_reply_tokens, self.cfg.max_len
        reply_len = s.n_tok - reply_start - 1
        idx = jnp.clip(reply_start[:, None] + jnp.arange(R)[None, :], 0, L - 1)
        reply = jnp.take_along_axis(s.tokens, idx, axis=1)
        return jnp.where(jnp.arange(R)[None, :] < reply_len[:, None], reply, self.fmt.pad_id), reply_len

    def parse(self, s: ModelState, env: Env, reply_start: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The reply written since `reply_start`, without its stop token -> (action id, format_ok)."""
        return parse_replies(env, self.fmt, *self.reply(s, reply_start))

    def act(self, s: ModelState, env: Env, env_state, t, active):
        reply_start = s.n_tok
        s = self.decode_reply(s, t, active)
        act, format_ok = self.parse(s, env, reply_start)
        return s, act, format_ok

    def observe(self, s: ModelState, env: Env, obs, t, nxt) -> tuple[ModelState, jax.Array]:
        """Prefill [last reply token, reply_close, obs_open, OBS, obs_close] for rows going on, if the
        chunk and a full reply still fit the buffer; returns the rows that fit."""
        batch, R, L = nxt.shape[0], self.cfg.max_reply_tokens, self.cfg.max_len
        width = self.fmt.turn_chunk_len(env.max_obs_len)
        last = s.tokens[jnp.arange(batch), jnp.clip(s.cache_len, 0, L - 1)][:, None]
        chunk, n = assemble(
            [(last, jnp.ones((batch,), jnp.int32)), fixed(self.fmt.reply_close, batch)]
            + self._obs_segments(obs, batch), width, self.fmt.pad_id,
        )
        fits = s.cache_len + n + R <= L
        go = nxt & fits
        n = jnp.where(go, n, 0)

        next_logits, cache = self._prefill(chunk, n, s.cache_len, s.cache, tight=True, rows=self._rows(s),
                                           prev=s.next_logits)
        turn_ids = jnp.where(jnp.arange(width)[None, :] == 0, t, t + 1)
        cache_len = s.cache_len + n
        s = s.replace(
            cache=cache, next_logits=next_logits,
            tokens=write(s.tokens, s.cache_len, chunk, n),
            turn_of_token=write(s.turn_of_token, s.cache_len, turn_ids, n),
            cache_len=cache_len, n_tok=jnp.where(go, cache_len, s.n_tok),
        )
        return s, fits | ~nxt

    def outputs(self, s: ModelState) -> dict[str, jax.Array]:
        L = self.cfg.max_len
        inside = jnp.arange(L)[None, :] < s.n_tok[:, None]
        return dict(tokens=s.tokens, length=s.n_tok, loss_mask=s.loss_mask, logprobs=s.logprobs,
                    turn_of_token=jnp.where(inside, s.turn_of_token, -1))


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
