"""The language-model policy of the episode engine: a Flax NNX decoder speaking a chat format.

Acting decodes a reply into the KV cache until a stop token or the per-turn limit and parses it into
an action id in tokens; observing prefills the reply's closing fragment and the next observation at the
row's own offset (the policy interface is described in `bmrl.rollout.policies`). The cache is never
copied: optional model calls run as loops that run once or not at all (`run_once`), and a compacted
batch reads and writes the cache in place through each row's `slot`.
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
from bmrl.rollout.tokens import assemble, drop_spans, fixed, parse_replies, take, write
from bmrl.rollout.types import TOKEN_STREAM, RolloutConfig, TurnSamples, per_turn_contexts, stream
from bmrl.sampling import gumbel_noise, policy_logprobs, sample_with_noise

NOISE_ELEMENTS = 1 << 22  # a turn's Gumbel noise is drawn in one call up to this many floats (16 MiB)


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
    window: Any = None  # Window of a windowed history (`RolloutConfig.history_turns`); None: append-only


@struct.dataclass
class Window:
    """The history of each row when turns see contexts of their own (`per_turn_contexts`): the buffer holds the
    prompt, then the last H turns (each its reply, as the chat template keeps it in the history, and the
    observation after it; every turn without a window), then the current reply. H = history_turns, Tm = max turns."""

    prompt_len: jax.Array  # int32[B]: tokens of the prompt (prefix and first observation), never dropped
    seg_len: jax.Array  # int32[B, H]: tokens of each turn in the window, oldest first (0 = not played yet; H = 0 without a window)
    reply_start: jax.Array  # int32[B]: where the current reply starts in the buffer
    samples: TurnSamples | None  # [B, Tm, L]: each played turn's context and reply, for the learner (None: not kept)


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
    copied the KV cache whole through the rollout's conditionals (nested ones, and ones inside the turn
    loop: two copies per turn, which made rollouts 1.1-1.3x slower on 2 idle CPU cores), while a loop's
    carry is updated in place (`tests/rollout/test_engine.py` and `tests/rollout/test_host.py` check the
    compiled programs for cache-sized copies)."""

    def body(c):
        return jnp.bool_(False), fn(c[1])

    return jax.lax.while_loop(lambda c: c[0], body, (jnp.asarray(pred, bool), carry))[1]


class _BoundModel:
    """A model policy inside one trace: the merged module and the static shapes."""

    def __init__(self, spec: ModelPolicy, model):
        self.model, self.fmt, self.cfg = model, spec.fmt, spec.cfg
        self.stop_ids = jnp.asarray(spec.fmt.stop_ids, jnp.int32)

    def _extend(self, *args, **kwargs):
        """`Decoder.extend` over the rollout's cache, attention in the configured blocks of keys."""
        return self.model.extend(*args, block_size=self.cfg.attention_block, **kwargs)

    def _obs_segments(self, obs, batch):
        f = self.fmt
        return [fixed(f.obs_open, batch), (obs.tokens, obs.length), fixed(f.obs_close, batch)]

    @jax.named_scope("start")
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
        _, shared = self._extend(prefix, one * P, one * 0, self.model.init_cache(1, self.cfg.max_len))
        cache = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape[1:]), shared)
        offsets = jnp.full((batch,), P, jnp.int32)
        logits, cache = self._prefill(obs_chunk, n_obs, offsets, cache)
        L, zeros = self.cfg.max_len, jnp.zeros((batch,), jnp.int32)
        tokens = write(jnp.full((batch, L), pad, jnp.int32), zeros, jnp.broadcast_to(prefix, (batch, P)), zeros + P)
        turn_ids = write(jnp.full((batch, L), -1, jnp.int32), offsets, jnp.zeros((1, width - P), jnp.int32), n_obs)
        f32 = jnp.zeros((batch, L), jnp.float32)
        return self._open_window(ModelState(
            cache=cache, next_logits=logits, cache_len=offsets + n_obs, n_tok=offsets + n_obs,
            tokens=write(tokens, offsets, obs_chunk, n_obs), loss_mask=f32, logprobs=f32, turn_of_token=turn_ids,
            tok_keys=stream(keys, TOKEN_STREAM), slot=jnp.arange(batch, dtype=jnp.int32),
        ))

    def _open_window(self, s: ModelState) -> ModelState:
        """`s` (the state before the first reply) with an empty history when turns see contexts of their own."""
        if not per_turn_contexts(self.cfg, self.fmt):
            return s
        batch, H = s.n_tok.shape[0], self.cfg.history_turns or 0
        zeros = jnp.zeros((batch,), jnp.int32)
        return s.replace(window=Window(prompt_len=s.n_tok, seg_len=jnp.zeros((batch, H), jnp.int32),
                                       reply_start=zeros,
                                       samples=TurnSamples.empty(batch, self.cfg.max_turns, self.cfg.max_len)
                                       if self.cfg.learning_samples else None))

    @staticmethod
    def _rows(s: ModelState) -> jax.Array | None:
        """The cache rows of a compacted batch; None (row b is cache row b) while the batch is whole."""
        return None if s.slot.shape[0] == s.cache[0][0].shape[0] else s.slot

    def take_rows(self, s: ModelState, keep: jax.Array) -> ModelState:
        """Rows `keep` of the batch (compaction: the live rows first, then a chunk of them): every per-row
        array is gathered, the KV cache is not (it stays in place, read and written through `slot`), so
        compaction copies no cache."""
        return take(s.replace(cache=None), keep).replace(cache=s.cache)

    def put_rows(self, s: ModelState, start: jax.Array, part: ModelState) -> ModelState:
        """Write a chunk's state `part` (rows start .. start + chunk - 1 of `s`, gathered by `take_rows`)
        back: its per-row arrays into those rows, its KV cache (the whole cache, updated in place) as is."""
        rows = jax.tree.map(lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, start, 0),
                            s.replace(cache=None), part.replace(cache=None))
        return rows.replace(cache=part.cache)

    @jax.named_scope("prefill")
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
                lg, cache = self._extend(chunk[:, :w], n, offsets, cache, last_only=True, cache_rows=rows)
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
        logits, cache = self._extend(context, lengths, zeros, cache, last_only=True)
        f32 = jnp.zeros((batch, L), jnp.float32)
        return self._open_window(ModelState(
            cache=cache, next_logits=logits[:, 0], cache_len=lengths, n_tok=lengths,
            tokens=write(jnp.full((batch, L), self.fmt.pad_id, jnp.int32), zeros, context, lengths),
            loss_mask=f32, logprobs=f32,
            turn_of_token=write(jnp.full((batch, L), -1, jnp.int32), zeros, turn_ids, lengths),
            tok_keys=stream(keys, TOKEN_STREAM), slot=jnp.arange(batch, dtype=jnp.int32),
        ))

    def strip(self, s: ModelState) -> ModelState:
        """The state without its KV cache and logits (what results need, for compaction)."""
        return s.replace(cache=None, next_logits=None)

    def _turn_noise(self, tok_keys: jax.Array, t, vocab: int) -> Callable[[jax.Array], jax.Array | None]:
        """`noise_of(i)`: the Gumbel noise `[B, V]` of token i of turn t (row key fold_in(fold_in(k, t), i),
        as `sample` draws it), None when greedy. The keys of the turn's R tokens are derived in one
        call, and so is the noise of all of them when it is small (B * R * V <= NOISE_ELEMENTS): on CPU
        each threefry call is a rolled loop of tiny ops, and three per token were half a small decode
        step's ops. Same values as drawing them token by token."""
        if self.cfg.sampling.greedy:
            return lambda i: None
        R = self.cfg.max_reply_tokens
        steps = jnp.arange(R, dtype=jnp.int32)
        keys = jax.vmap(lambda k: jax.vmap(lambda i: jax.random.fold_in(k, i))(steps))(stream(tok_keys, t))
        batch = keys.shape[0]
        if batch * R * vocab > NOISE_ELEMENTS:
            return lambda i: gumbel_noise(jax.lax.dynamic_index_in_dim(keys, i, 1, keepdims=False), vocab)
        flat = keys.reshape((batch * R,) + keys.shape[2:])  # typed [B * R] or raw [B * R, 2] keys
        noise = gumbel_noise(flat, vocab).reshape(batch, R, vocab)
        return lambda i: jax.lax.dynamic_index_in_dim(noise, i, 1, keepdims=False)

    @jax.named_scope("decode")
    def decode_reply(self, s: ModelState, t, decoding: jax.Array) -> ModelState:
        """Sample one reply per decoding row into the buffer, until a stop token or the per-turn limit
        (a reply that reaches it gets a stop token appended: not sampled, not trained on)."""
        R = self.cfg.max_reply_tokens

        def cond(d):
            s, decoding, i = d
            return jnp.any(decoding) & (i < R)

        noise_of = self._turn_noise(s.tok_keys, t, s.next_logits.shape[-1])

        def body(d):
            s, decoding, i = d
            with jax.named_scope("sample"):
                tok, lp = sample_with_noise(noise_of(i), s.next_logits, self.cfg.sampling)
            is_stop = jnp.isin(tok, self.stop_ids)
            forced = decoding & ~is_stop & (i == R - 1)
            tok = jnp.where(forced, self.stop_ids[0], tok)
            sampled = decoding & ~forced
            one = decoding.astype(jnp.int32)
            cont = decoding & ~is_stop & ~forced

            def feed(args):
                cache, _ = args
                lg, cache = self._extend(tok[:, None], cont.astype(jnp.int32), s.cache_len, cache,
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
            lg, cache = self._extend(reply, n, s.cache_len, cache, cache_rows=self._rows(s))
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

    @jax.named_scope("parse")
    def parse(self, s: ModelState, env: Env, reply_start: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The reply written since `reply_start`, without its stop token -> (action id, format_ok)."""
        return parse_replies(env, self.fmt, *self.reply(s, reply_start))

    def act(self, s: ModelState, env: Env, env_state, t, active):
        reply_start = s.n_tok
        s = self.decode_reply(s, t, active)
        act, format_ok = self.parse(s, env, reply_start)
        if s.window is not None:
            s = self._record_sample(s, t, active, reply_start)
        return s, act, format_ok

    def _record_sample(self, s: ModelState, t, active: jax.Array, reply_start: jax.Array) -> ModelState:
        """Note where the active rows' reply of turn t starts, and keep the turn as a learning sample (when the
        rollout keeps them): the buffer (the turn's own context and the reply just decoded), its loss on that
        reply alone."""
        w, L = s.window, self.cfg.max_len
        w = w.replace(reply_start=jnp.where(active, reply_start, w.reply_start))
        if w.samples is None:
            return s.replace(window=w)
        inside = jnp.arange(L)[None, :] < s.n_tok[:, None]
        mine = inside & (s.turn_of_token == t)  # the reply of turn t (its stop token included)

        def put(arr, value):
            keep = active.reshape(active.shape + (1,) * (value.ndim - 1))
            return arr.at[:, t].set(jnp.where(keep, value, arr[:, t]))

        x = w.samples
        samples = x.replace(tokens=put(x.tokens, s.tokens), length=put(x.length, s.n_tok),
                            loss_mask=put(x.loss_mask, jnp.where(mine, s.loss_mask, 0.0)),
                            logprobs=put(x.logprobs, jnp.where(mine, s.logprobs, 0.0)),
                            turn_of_token=put(x.turn_of_token, jnp.where(inside, s.turn_of_token, -1)))
        return s.replace(window=w.replace(samples=samples))

    def _turn_chunk(self, s: ModelState, env: Env, obs) -> tuple[jax.Array, jax.Array]:
        """[last reply token, reply_close, obs_open, OBS, obs_close] of each row -> ([B, W], lengths [B])."""
        batch, L = s.n_tok.shape[0], self.cfg.max_len
        last = s.tokens[jnp.arange(batch), jnp.clip(s.cache_len, 0, L - 1)][:, None]
        return assemble(
            [(last, jnp.ones((batch,), jnp.int32)), fixed(self.fmt.reply_close, batch)]
            + self._obs_segments(obs, batch), self.fmt.turn_chunk_len(env.max_obs_len), self.fmt.pad_id,
        )

    @jax.named_scope("observe")
    def observe(self, s: ModelState, env: Env, obs, t, nxt) -> tuple[ModelState, jax.Array]:
        """Prefill [last reply token, reply_close, obs_open, OBS, obs_close] for rows going on, if the
        chunk and a full reply still fit the buffer; returns the rows that fit."""
        if s.window is not None:
            return self._observe_windowed(s, env, obs, t, nxt)
        R, L = self.cfg.max_reply_tokens, self.cfg.max_len
        width = self.fmt.turn_chunk_len(env.max_obs_len)
        chunk, n = self._turn_chunk(s, env, obs)
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

    def _observe_windowed(self, s: ModelState, env: Env, obs, t, nxt) -> tuple[ModelState, jax.Array]:
        """`observe` when turns see contexts of their own: the turn's chunk follows its reply as always, the reply
        first cut to what the chat template keeps of it in the history (`Format.kept_from`; all of it unless the
        format rewrites history); when the window already holds H turns, the oldest leaves the buffer too. What
        follows a removed span moves up, and the rows re-prefill from the first removed position (the prompt's
        end, or the reply's start), the prompt's KV entries kept. Rows that remove nothing prefill the chunk
        alone, as without a window."""
        w, R, L, H = s.window, self.cfg.max_reply_tokens, self.cfg.max_len, self.cfg.history_turns
        width = self.fmt.turn_chunk_len(env.max_obs_len)
        chunk, n = self._turn_chunk(s, env, obs)
        zeros = jnp.zeros_like(n)
        drop = zeros if H is None else jnp.where(nxt, w.seg_len[:, 0], 0)  # the oldest turn, when the window is full
        cut = jax.vmap(self.fmt.kept_from)(*self.reply(s, w.reply_start)) if self.fmt.rewrites_history else zeros
        fits = s.cache_len - drop - cut + n + R <= L
        go = nxt & fits
        drop, cut, n = jnp.where(go, drop, 0), jnp.where(go, cut, 0), jnp.where(go, n, 0)
        stop = s.cache_len - drop - cut  # where the chunk goes: over the reply's stop token (not in the cache yet)
        spans = jnp.stack([w.prompt_len, w.reply_start], axis=1), jnp.stack([drop, cut], axis=1)

        def shift(buf, fill):
            return drop_spans(buf, *spans, fill)

        turn_ids = jnp.where(jnp.arange(width)[None, :] == 0, t, t + 1)
        tokens = write(shift(s.tokens, self.fmt.pad_id), stop, chunk, n)
        start = jnp.where(drop > 0, w.prompt_len, jnp.where(cut > 0, w.reply_start - drop, stop))
        span = min(L, (H or 1) * (R - 1 + width))  # the widest re-prefill: H turns (one without a window)
        idx = jnp.clip(start[:, None] + jnp.arange(span)[None, :], 0, L - 1)
        next_logits, cache = self._prefill(jnp.take_along_axis(tokens, idx, axis=1), stop + n - start, start,
                                           s.cache, tight=True, rows=self._rows(s), prev=s.next_logits)
        cache_len = stop + n
        seg_len = w.seg_len
        if H is not None:
            newest = s.cache_len - w.reply_start - cut + n  # the turn just played: its kept reply and the chunk after it
            seg_len = jnp.where(go[:, None], jnp.concatenate([w.seg_len[:, 1:], newest[:, None]], axis=1), w.seg_len)
        s = s.replace(
            cache=cache, next_logits=next_logits, tokens=tokens,
            turn_of_token=write(shift(s.turn_of_token, -1), stop, turn_ids, n),
            loss_mask=shift(s.loss_mask, 0.0), logprobs=shift(s.logprobs, 0.0),
            cache_len=jnp.where(go, cache_len, s.cache_len), n_tok=jnp.where(go, cache_len, s.n_tok),
            window=w.replace(seg_len=seg_len),
        )
        return s, fits | ~nxt

    def outputs(self, s: ModelState) -> dict[str, jax.Array]:
        L = self.cfg.max_len
        inside = jnp.arange(L)[None, :] < s.n_tok[:, None]
        out = dict(tokens=s.tokens, length=s.n_tok, loss_mask=s.loss_mask, logprobs=s.logprobs,
                   turn_of_token=jnp.where(inside, s.turn_of_token, -1))
        if s.window is not None and s.window.samples is not None:
            out["turn_samples"] = s.window.samples
        return out
