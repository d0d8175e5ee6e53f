"""Grouped-query attention: over a chunk's own keys (full forward) and over a head-major KV cache.

The full forward (the learner's) takes queries `QUERY_BLOCK` at a time, each block's step recomputed
in the backward pass, so training keeps no `[batch, heads, seq, seq]` scores: the softmax of each
query is the same as all at once, only its live memory is one block's.

The cache of one layer is a pair of `[batch, kv_heads, max_len, head_dim]` arrays (head-major: the
score and value contractions take their operands as stored, so a decode step neither copies nor
transposes the cache). Attention over the cache runs in fixed-size blocks of keys with a running
(online) softmax, the loop bounded by `bound`, the longest live row, a traced value: cost follows the
filled context, not the buffer, and one compiled program serves every context length.

Per-layer options: `scale` (the factor on q.k, head_dim**-0.5 unless the family says otherwise),
`softcap` (scores -> softcap * tanh(scores / softcap), Gemma 2) and `window` (a sliding window: a
query at position p sees keys at positions > p - window; older keys stay in the cache, masked, and
the cache loop starts at the first block any query can see).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BLOCK_SIZE = 64  # keys per attention block (static; fastest measured on CPU); 0 = the whole buffer at once
QUERY_BLOCK = 128  # queries per step of the full forward's attention (static); 0 = all at once
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: a fully masked row stays NaN-free


def _scaled(scores: jax.Array, scale: float, softcap: float | None) -> jax.Array:
    """float32 q.k scores times `scale`, then tanh soft-capped at `softcap` (None: not capped)."""
    scores = scores * scale
    return scores if softcap is None else jnp.tanh(scores / softcap) * softcap


def attend(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None = None,
    softcap: float | None = None, query_block: int = QUERY_BLOCK,
) -> jax.Array:
    """Grouped-query attention over a chunk's own keys (the full forward pass).

    q: [batch, seq, heads, head_dim]; k, v: [batch, keys, kv_heads, head_dim];
    mask: [batch, seq, keys] bool (True = may attend; a sliding window is part of it).
    Returns [batch, seq, heads * head_dim]. `scale` defaults to head_dim**-0.5.

    More than `query_block` queries (static; 0 = all at once) are taken `query_block` at a time in a
    loop whose step is recomputed in the backward pass: the scores `[batch, heads, query_block, keys]`
    of one block are live, never `[batch, heads, seq, keys]`, and the backward pass keeps q, k and v,
    not the probabilities. Each query's softmax is the same (over all its keys at once).
    """
    batch, seq, heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    if query_block <= 0 or seq <= query_block:
        return _attend_rows(q, k, v, mask, scale, softcap)
    blocks = -(-seq // query_block)
    rest = seq - (blocks - 1) * query_block  # the last block starts at seq - query_block (overlapping)

    @jax.checkpoint
    def step(i):  # slices, not a blocked copy of q and mask: the backward pass keeps only i
        first = jnp.minimum(i * query_block, seq - query_block)
        rows = lambda x: jax.lax.dynamic_slice_in_dim(x, first, query_block, axis=1)  # noqa: E731
        return _attend_rows(rows(q), k, v, rows(mask), scale, softcap)

    out = jax.lax.map(step, jnp.arange(blocks))  # [blocks, batch, query_block, heads * head_dim]
    whole = jnp.moveaxis(out[:-1], 0, 1).reshape(batch, (blocks - 1) * query_block, heads * head_dim)
    return jnp.concatenate([whole, out[-1][:, query_block - rest:]], axis=1)


def _attend_rows(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float, softcap: float | None
) -> jax.Array:
    """`attend` of queries `q: [batch, rows, heads, d]` with `mask: [batch, rows, keys]`, all at once."""
    batch, rows, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(batch, rows, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], _scaled(scores, scale, softcap), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgst,btkd->bskgd", probs, v)
    return out.reshape(batch, rows, heads * head_dim)


def write_cache(
    cache: jax.Array, new: jax.Array, write_index: jax.Array, cache_rows: jax.Array | None = None
) -> jax.Array:
    """Scatter `new: [batch, chunk, kv_heads, head_dim]` into `cache: [cache_rows, kv_heads, max_len, head_dim]`
    at positions `write_index: [batch, chunk]`; indices outside [0, max_len) are dropped, never clamped.
    `cache_rows: int32[batch]` names each batch row's cache row (default: row b is cache row b)."""
    rows = jnp.arange(cache.shape[0]) if cache_rows is None else cache_rows
    return cache.at[rows[:, None], :, write_index].set(new.astype(cache.dtype), mode="drop")


def _cache_block(cache: jax.Array, first: jax.Array, size: int, cache_rows: jax.Array | None) -> jax.Array:
    """Keys (or values) first .. first + size - 1 of every batch row: [batch, kv_heads, size, head_dim].
    With `cache_rows`, row b reads cache row cache_rows[b] (one gather of contiguous per-row slices)."""
    if cache_rows is None:
        return jax.lax.dynamic_slice_in_dim(cache, first, size, axis=2)
    _, kv_heads, _, head_dim = cache.shape

    def one(row):
        return jax.lax.dynamic_slice(cache, (row, 0, first, 0), (1, kv_heads, size, head_dim))[0]

    return jax.vmap(one)(cache_rows)


def _group_queries(q: jax.Array, kv_heads: int) -> jax.Array:
    """[batch, chunk, heads, d] -> [batch, kv_heads, group * chunk, d] (row g * chunk + c)."""
    batch, chunk, heads, head_dim = q.shape
    group = heads // kv_heads
    q = q.reshape(batch, chunk, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    return q.reshape(batch, kv_heads, group * chunk, head_dim)


def _ungroup(out: jax.Array, chunk: int) -> jax.Array:
    """[batch, kv_heads, group * chunk, d] -> [batch, chunk, heads * d] (head index kv * group + g)."""
    batch, kv_heads, rows, head_dim = out.shape
    out = out.reshape(batch, kv_heads, rows // chunk, chunk, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, chunk, rows // chunk * kv_heads * head_dim)


def attend_cache(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    positions: jax.Array,
    bound: jax.Array,
    block_size: int = BLOCK_SIZE,
    shared: tuple[jax.Array, jax.Array] | None = None,
    cache_rows: jax.Array | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    window: int | None = None,
) -> jax.Array:
    """Queries attend to cache keys at positions <= their own and < `bound` (and, with a sliding
    `window`, > their own - window: the shared prefix too).

    q: [batch, chunk, heads, head_dim]; k_cache, v_cache: [batch, kv_heads, max_len, head_dim];
    positions: [batch, chunk] int (each query's cache position); bound: scalar int, the end of the
    longest live row (keys at or past it are never read). Returns [batch, chunk, heads * head_dim]
    in v's dtype. `block_size` keys per loop step (static); 0, or a buffer shorter than two blocks,
    attends over the whole buffer in one step. A query with no key to attend to gets zeros.
    shared: keys/values `[1, kv_heads, prefix, head_dim]` of a prefix every row starts with, seen
    by every query before its own cache: one matrix product for all rows' queries (not one per row).
    cache_rows: int32[batch], the cache row each batch row reads (a compacted batch over a cache that
    stays in place: finished rows leave the batch without copying the cache); default row b.
    """
    batch, chunk, heads, head_dim = q.shape
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    qg = _group_queries(q, kv_heads)
    qpos = jnp.tile(positions.astype(jnp.int32), (1, group))[:, None, :, None]  # [batch, 1, rows, 1]
    # One pass when the buffer holds less than two blocks: a loop step costs more than the extra keys.
    size = max_len if block_size <= 0 or max_len < 2 * block_size else block_size
    bound = jnp.clip(jnp.asarray(bound, jnp.int32), 0, max_len)

    def keys_from(carry, first, start, size: int):
        """Fold keys first .. first + size - 1 (those >= start) into the running softmax."""
        m, l, acc = carry
        k, v = _cache_block(k_cache, first, size, cache_rows), _cache_block(v_cache, first, size, cache_rows)
        key_pos = first + jnp.arange(size, dtype=jnp.int32)
        valid = (key_pos >= start) & (key_pos < bound) & (key_pos <= qpos)  # [batch, 1, rows, size]
        if window is not None:
            valid &= key_pos > qpos - window
        s = jnp.einsum("bkqd,bktd->bkqt", qg, k, preferred_element_type=jnp.float32)
        s = jnp.where(valid, _scaled(s, scale, softcap), _MASKED)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(valid, jnp.exp(s - m_new[..., None]), 0.0)
        decay = jnp.exp(m - m_new)
        pv = jnp.einsum("bkqt,bktd->bkqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l * decay + p.sum(axis=-1), acc * decay[..., None] + pv

    def block(j, carry):
        start = j * size
        return keys_from(carry, jnp.minimum(start, max_len - size), start, size)  # the last may overlap

    rows = group * chunk
    if shared is None:
        init = (
            jnp.full((batch, kv_heads, rows), _MASKED, jnp.float32),
            jnp.zeros((batch, kv_heads, rows), jnp.float32),
            jnp.zeros((batch, kv_heads, rows, head_dim), jnp.float32),
        )
    else:
        prefix_pos = None if window is None else qpos[:, 0, :, 0] + shared[0].shape[2]  # [batch, rows]
        init = _attend_shared(qg, *shared, scale, softcap, window, prefix_pos)
    if size == max_len:
        _, l, acc = block(0, init)
    else:
        # A window hides every block before the oldest key the earliest query sees.
        first = 0 if window is None else jnp.maximum(jnp.min(positions) - window + 1, 0) // size
        _, l, acc = jax.lax.fori_loop(first, (bound + size - 1) // size, block, init)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    return _ungroup(out.astype(v_cache.dtype), chunk)


def _attend_shared(
    qg: jax.Array, k: jax.Array, v: jax.Array, scale: float, softcap: float | None = None,
    window: int | None = None, positions: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Softmax state (max, sum, weighted values) of queries `[batch, kv_heads, rows, d]` over shared
    keys/values `[1, kv_heads, prefix, d]`, all visible (with a `window`, those > the query's
    absolute position `positions: [batch, rows]` - window): the start of the running softmax."""
    batch, kv_heads, rows, head_dim = qg.shape
    q = qg.transpose(1, 0, 2, 3).reshape(kv_heads, batch * rows, head_dim)
    s = _scaled(jnp.einsum("kqd,ktd->kqt", q, k[0], preferred_element_type=jnp.float32), scale, softcap)
    if window is None:
        m = s.max(axis=-1)
        p = jnp.exp(s - m[..., None])
    else:
        valid = jnp.arange(k.shape[2])[None, None, :] > positions.reshape(1, batch * rows, 1) - window
        s = jnp.where(valid, s, _MASKED)
        m = s.max(axis=-1)
        p = jnp.where(valid, jnp.exp(s - m[..., None]), 0.0)
    acc = jnp.einsum("kqt,ktd->kqd", p.astype(v.dtype), v[0], preferred_element_type=jnp.float32)

    def per_row(x):
        return x.reshape(kv_heads, batch, rows, *x.shape[2:]).swapaxes(0, 1)

    return per_row(m), per_row(p.sum(axis=-1)), per_row(acc)
