"""The Python-driven rollout, as Python-loop RL stacks do it: the benchmark baseline and correctness oracle.

Not used by any run: `bench/rollout.py` measures the compiled engine against it, and the tests check
that both give token-identical greedy trajectories.

The same model and sampling as `bmrl.rollout`, but turns are driven from Python: each turn a jitted
`generate` re-prefills the whole context into a fresh KV cache and decodes one reply per sequence,
then the host parses the replies, steps the environments (jitted, vmapped) and appends the next
observation to each context. Same keys, same forced-stop rule, so greedy output is token-identical.
With a history window (`RolloutConfig.history_turns`) or a format that rewrites earlier replies
(`Format.history_cut`) each context is rebuilt from scratch from the prompt and the last H turns, each
reply as the history keeps it: the naive form of the engine's windowed loop.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl import compiles
from bmrl.envs.base import Env
from bmrl.formats import Format
from bmrl.rollout.engine import check_config, default_format
from bmrl.rollout.records import Records, Turn, goes_on, record_turn
from bmrl.rollout.tokens import parse_replies
from bmrl.rollout.types import RolloutConfig, Trajectory, TurnSamples, check_caps, per_turn_contexts, row_keys
from bmrl.sampling import sample


BUCKET = 64  # context widths are rounded up to a multiple of this: few compiles, honest prefill cost


def _make_generate(graphdef: nnx.GraphDef, fmt: Format, cfg: RolloutConfig):
    """generate(params, context [B,W], lengths [B], active [B], tok_keys [B], t) -> reply arrays.

    W is the context width of this call (a multiple of BUCKET); each new width compiles once, as a
    Python-driven stack that pads to length buckets would.
    """
    R = cfg.max_reply_tokens
    stop_ids = jnp.asarray(fmt.stop_ids, jnp.int32)

    @jax.jit
    def generate(params, context, lengths, active, tok_keys, t):
        model = nnx.merge(graphdef, params)
        batch = context.shape[0]
        cache = model.init_cache(batch, context.shape[1] + R)
        n = jnp.where(active, lengths, 0)
        logits, cache = model.extend(context, n, jnp.zeros((batch,), jnp.int32), cache, last_only=True,
                                     block_size=cfg.attention_block)
        next_logits = logits[:, 0]
        reply = jnp.full((batch, R), fmt.pad_id, jnp.int32)
        logp = jnp.zeros((batch, R), jnp.float32)
        sampled_mask = jnp.zeros((batch, R), bool)

        def body(i, s):
            cache, next_logits, pos, decoding, reply, logp, sampled_mask = s
            keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, t), i))(tok_keys)
            tok, lp = sample(keys, next_logits, cfg.sampling)
            is_stop = jnp.isin(tok, stop_ids)
            forced = decoding & ~is_stop & (i == R - 1)
            tok = jnp.where(forced, stop_ids[0], tok)
            sampled = decoding & ~forced
            reply = reply.at[:, i].set(jnp.where(decoding, tok, reply[:, i]))
            logp = logp.at[:, i].set(jnp.where(sampled, lp, 0.0))
            sampled_mask = sampled_mask.at[:, i].set(sampled)
            cont = decoding & ~is_stop & ~forced
            lg, cache = model.extend(tok[:, None], cont.astype(jnp.int32), pos, cache, block_size=cfg.attention_block)
            next_logits = jnp.where(cont[:, None], lg[:, 0], next_logits)
            return cache, next_logits, pos + cont, cont, reply, logp, sampled_mask

        s = (cache, next_logits, n, active, reply, logp, sampled_mask)
        _, _, _, _, reply, logp, sampled_mask = jax.lax.fori_loop(0, R, body, s)
        is_stop = jnp.isin(reply, stop_ids) & (jnp.cumsum(jnp.isin(reply, stop_ids), axis=1) == 1)
        reply_len = jnp.where(active, jnp.argmax(is_stop, axis=1) + 1, 0)
        return reply, reply_len, logp, sampled_mask

    return generate


def _jitted_env(env: Env, fmt: Format):
    return compiles.program("baseline_env", (env, fmt), lambda: (
        jax.jit(jax.vmap(env.reset)),
        jax.jit(jax.vmap(env.step)),
        jax.jit(functools.partial(parse_replies, env, fmt)),
    ))


def python_loop_rollout(
    policy: nnx.Module,
    env: Env,
    tasks: Any,
    caps: Any,
    key: jax.Array,
    cfg: RolloutConfig,
    fmt: Format | None = None,
) -> Trajectory:
    """Same contract as `bmrl.rollout.rollout`, driven turn by turn from Python."""
    fmt = fmt or default_format(env)
    caps = np.asarray(caps, np.int32)
    check_caps(caps, cfg)
    check_config(env, fmt, cfg, int(caps.min()) if caps.size else 1)
    L, R, Tm = cfg.max_len, cfg.max_reply_tokens, cfg.max_turns
    graphdef, params = nnx.split(policy)
    generate = _make_generate(graphdef, fmt, cfg)
    reset, step, parse = _jitted_env(env, fmt)
    batch = caps.shape[0]
    keys = row_keys(key, batch)
    env_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
    tok_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)

    env_state, obs = reset(env_keys, tasks, jnp.asarray(caps))
    progress0 = np.asarray(jax.vmap(env.progress)(env_state))
    obs_tokens, obs_len = np.asarray(obs.tokens), np.asarray(obs.length)
    # Each row's conversation as pieces of (tokens, turn ids, loss mask, log-probs): the prompt, then one
    # segment per turn (its reply and the observation after it). A context is the prompt and the last H
    # segments (all of them without a window).
    prompt = []
    for b in range(batch):
        first = list(fmt.prefix) + list(fmt.obs_open) + list(obs_tokens[b, : obs_len[b]]) + list(fmt.obs_close)
        n_obs = len(first) - len(fmt.prefix)
        prompt.append(_Piece(first, [-1] * len(fmt.prefix) + [0] * n_obs, [0.0] * len(first), [0.0] * len(first)))
    segments: list[list[_Piece]] = [[] for _ in range(batch)]
    H, per_turn = cfg.history_turns, per_turn_contexts(cfg, fmt)

    def context(b: int, segs: list[_Piece] | None = None, held: int | None = H) -> _Piece:
        """The prompt of row b and the last `held` of its segments (`segs`, default all; None: every one)."""
        segs = segments[b] if segs is None else segs
        return _Piece.join([prompt[b]] + (segs if held is None else segs[-held:]))

    rec = Records.empty(batch, Tm, progress0, np)
    samples = [[None] * Tm for _ in range(batch)]
    active = np.ones(batch, bool)
    t = 0
    while active.any() and t < Tm:
        ctx = [context(b).tokens for b in range(batch)]
        longest = max(len(ctx[b]) for b in range(batch))
        width = min(-(-longest // BUCKET) * BUCKET, L)
        context_arr = np.full((batch, width), fmt.pad_id, np.int32)
        lengths = np.zeros(batch, np.int32)
        for b in range(batch):
            context_arr[b, : len(ctx[b])] = ctx[b]
            lengths[b] = len(ctx[b])
        reply, reply_len, lp, sampled = map(np.asarray, generate(params, context_arr, lengths, active, tok_keys, t))
        content_len = np.maximum(reply_len - 1, 0)
        content = np.where(np.arange(R)[None, :] < content_len[:, None], reply, fmt.pad_id)
        act, format_ok = map(np.asarray, parse(jnp.asarray(content), jnp.asarray(content_len)))
        for b in np.flatnonzero(active):
            n = int(reply_len[b])
            segments[b].append(_Piece(list(reply[b, :n]), [t] * n, list(sampled[b, :n].astype(np.float32)),
                                      list(lp[b, :n])))
            if per_turn:  # the context the reply followed, and the reply
                samples[b][t] = _Piece.join([context(b, segments[b][:-1]).without_loss(), segments[b][-1]])

        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t + 1))(env_keys)
        new_state, new_obs, reward, term, info = step(step_keys, env_state, jnp.asarray(act), jnp.asarray(caps - (t + 1)))
        sel = jnp.asarray(active)
        env_state = jax.tree.map(lambda a, b: jnp.where(sel.reshape(sel.shape + (1,) * (a.ndim - 1)), a, b), new_state, env_state)
        term, info = np.asarray(term), jax.tree.map(np.asarray, info)
        played = Turn(action=act, reward=np.asarray(reward), format_ok=format_ok, error=info.error, invalid=info.invalid,
                      injected=np.zeros(batch, bool), oracle_action=info.oracle_action, progress=info.progress,
                      success=info.success, terminated=term, truncated=np.zeros(batch, bool))
        rec = record_turn(rec, t, active, played, cfg.format_reward)
        nxt = goes_on(t, active, played, caps)
        obs_tokens, obs_len = np.asarray(new_obs.tokens), np.asarray(new_obs.length)
        for b in np.flatnonzero(nxt):
            chunk = list(fmt.reply_close) + list(fmt.obs_open) + list(obs_tokens[b, : obs_len[b]]) + list(fmt.obs_close)
            n = int(reply_len[b]) - 1  # the reply without its stop token: what the history keeps of it
            kept = segments[b][-1].tail(int(fmt.kept_from(jnp.asarray(reply[b]), n)))
            if len(context(b, segments[b][:-1] + [kept]).tokens) + len(chunk) + R > L:  # the next context and a reply do not fit
                rec = rec.overflowed(np.arange(batch) == b)
                nxt[b] = False
                continue
            segments[b][-1] = _Piece.join([kept, _Piece(chunk, [t + 1] * len(chunk), [0.0] * len(chunk),
                                                        [0.0] * len(chunk))])
        active = nxt
        t += 1

    final = [context(b, held=None if H is None else H + 1) for b in range(batch)]  # the window and the last reply

    def padded(rows, fill, dtype):
        arr = np.full((len(rows), L), fill, dtype)
        for b, r in enumerate(rows):
            arr[b, : len(r)] = r
        return arr

    turn_samples = None
    if per_turn and cfg.learning_samples:
        empty = _Piece([], [], [], [])
        flat = [samples[b][k] or empty for b in range(batch) for k in range(Tm)]
        turn_samples = TurnSamples(
            tokens=jnp.asarray(padded([p.tokens for p in flat], fmt.pad_id, np.int32).reshape(batch, Tm, L)),
            length=jnp.asarray([len(p.tokens) for p in flat], jnp.int32).reshape(batch, Tm),
            loss_mask=jnp.asarray(padded([p.mask for p in flat], 0.0, np.float32).reshape(batch, Tm, L)),
            logprobs=jnp.asarray(padded([p.logps for p in flat], 0.0, np.float32).reshape(batch, Tm, L)),
            turn_of_token=jnp.asarray(padded([p.turn_ids for p in flat], -1, np.int32).reshape(batch, Tm, L)),
        )
    return Trajectory(
        tokens=jnp.asarray(padded([p.tokens for p in final], fmt.pad_id, np.int32)),
        length=jnp.asarray([len(p.tokens) for p in final], jnp.int32),
        loss_mask=jnp.asarray(padded([p.mask for p in final], 0.0, np.float32)),
        logprobs=jnp.asarray(padded([p.logps for p in final], 0.0, np.float32)),
        turn_of_token=jnp.asarray(padded([p.turn_ids for p in final], -1, np.int32)),
        **{k: jnp.asarray(v) for k, v in rec.fields(caps).items()}, turn_samples=turn_samples,
    )


@dataclasses.dataclass
class _Piece:
    """A run of a conversation's tokens with their turn ids, loss mask and sampling log-probs."""

    tokens: list
    turn_ids: list
    mask: list
    logps: list

    @staticmethod
    def join(pieces: list[_Piece]) -> _Piece:
        return _Piece(*(sum((getattr(p, f) for p in pieces), []) for f in ("tokens", "turn_ids", "mask", "logps")))

    def tail(self, start: int) -> _Piece:
        """The piece from its token `start` on."""
        return _Piece(self.tokens[start:], self.turn_ids[start:], self.mask[start:], self.logps[start:])

    def without_loss(self) -> _Piece:
        """The same tokens as context only: earlier replies are not trained on in a later turn's sample."""
        return _Piece(self.tokens, self.turn_ids, [0.0] * len(self.mask), [0.0] * len(self.logps))
