"""Token-buffer helpers of the compiled rollout: per-row writes, chunk assembly, reply parsing.

Everything is per row and data-dependent in offsets only (never in shapes), so one compiled
program serves every conversation length.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.envs.base import INVALID, Env
from bmrl.formats import Format


def assemble(segments: list[tuple[jax.Array, jax.Array]], width: int, pad: int) -> tuple[jax.Array, jax.Array]:
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


def write(buf: jax.Array, start: jax.Array, values: jax.Array, n: jax.Array) -> jax.Array:
    """buf[b, start[b] + j] = values[b, j] for j < n[b]; writes past the buffer are dropped."""
    values = jnp.broadcast_to(values, (buf.shape[0], values.shape[-1]))
    batch, width = values.shape
    j = jnp.arange(width)[None, :]
    idx = jnp.where(j < n[:, None], start[:, None] + j, buf.shape[1])
    return buf.at[jnp.arange(batch)[:, None], idx].set(values.astype(buf.dtype), mode="drop")


def drop_spans(buf: jax.Array, start: jax.Array, n: jax.Array, fill: Any) -> jax.Array:
    """Remove the spans buf[b, start[b, j] : start[b, j] + n[b, j]] from each row, shifting what follows left;
    `fill` enters at the end. buf: [B, L, ...]; start, n: [B, K], each row's spans in order and apart, `start` in
    the row's positions before any removal (n = 0: no span). One gather, whatever K."""
    pos = jnp.arange(buf.shape[1], dtype=jnp.int32)[None, :]
    src = pos
    for j in range(start.shape[1]):  # a kept position's source: past every earlier span it reaches
        src = jnp.where(src >= start[:, j : j + 1], src + n[:, j : j + 1], src)
    inside = src < buf.shape[1]
    src = src.reshape(src.shape + (1,) * (buf.ndim - 2))
    moved = jnp.take_along_axis(buf, jnp.minimum(src, buf.shape[1] - 1), axis=1)
    return jnp.where(inside.reshape(src.shape), moved, jnp.asarray(fill, buf.dtype))


def fixed(frag: np.ndarray, batch: int) -> tuple[jax.Array, jax.Array]:
    """A host fragment broadcast to every row, as an assemble segment."""
    toks = jnp.broadcast_to(jnp.asarray(frag, jnp.int32)[None, :], (batch, len(frag)))
    return toks, jnp.full((batch,), len(frag), jnp.int32)


def take(tree: Any, keep: jax.Array) -> Any:
    """Rows `keep: int[K]` of a pytree whose leaves lead with the batch axis."""
    return jax.tree.map(lambda x: x[keep], tree)


def select(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per-row select over pytrees whose leaves lead with the batch axis."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, new, old)


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
