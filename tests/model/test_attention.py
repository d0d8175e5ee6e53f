"""Blocked attention over the KV cache: equal to full attention, one program for every context
length, and a decode step that neither copies nor transposes the cache."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bmrl import compiles
from bmrl.model import ModelConfig, init_model
from bmrl.model.attention import attend, attend_cache
from tests.model.test_decoder import (  # the cache tests' model: GQA, biases, llama3 rope
    CONFIG,
    TOL,
    VOCAB,
)


# Gemma 3's layout with a sliding window of 5 on layer 0 (its own RoPE base) and soft-capped scores:
# windowed blocks (the loop starting past blocks no query sees) and a shared prefix partly out of sight.
WINDOWED = ModelConfig.tiny(VOCAB, model_type="gemma3_text", hidden_size=32, num_attention_heads=4,
                            num_key_value_heads=2, sliding_window=5, rope_local_theta=100.0,
                            attn_logit_softcapping=2.0, layer_types=("sliding_attention", "full_attention"))


@pytest.fixture(scope="module")
def model():
    return init_model(CONFIG, seed=3)


@pytest.fixture(scope="module", params=["llama", "windowed"])
def any_model(request, model):
    """The cache tests' model, and a windowed one for the tests a window changes."""
    return model if request.param == "llama" else init_model(WINDOWED, seed=3)


def _tokens(shape, seed=0):
    return jax.device_put(_np_tokens(shape, seed))


def _i32(x):
    """int32 numpy (passed to a jitted function as it is: `jnp.asarray` would compile a program to stage it)."""
    return np.asarray(x, np.int32)


def _np_tokens(shape, seed=0):
    """The tokens of `_tokens`, in numpy: slices and gathers of them stay on the host (each eager jax op on
    a device array is a program of its own)."""
    return np.random.RandomState(seed).randint(0, VOCAB, shape).astype(np.int32)


# The attention functions behind jit: eagerly every op of them compiled a one-op program. The bound and the
# mask are data (one program for every bound); the block sizes static, as in the model.
_attend = jax.jit(attend)
_attend_cache = jax.jit(attend_cache, static_argnames="block_size")


def _blocked_loss(q, k, v, mask, block):
    out = attend(q, k, v, mask, softcap=2.0, query_block=block)
    return (out**2).sum(), out


_blocked_loss_grads = jax.jit(jax.value_and_grad(_blocked_loss, argnums=(0, 1, 2), has_aux=True), static_argnums=4)


def _extend(graphdef, block_size):
    return compiles.counted_jit(
        lambda s, t, n, o, c: nnx.merge(graphdef, s).extend(t, n, o, c, block_size=block_size),
        name=f"test_blocked_extend_{block_size}",
    )


@pytest.mark.parametrize("block_size", [1, 3, 8])
def test_attend_cache_equals_masked_softmax(block_size):
    """Blocks (dividing max_len or not, the last overlapping) give the one-shot masked softmax."""
    batch, chunk, heads, kv_heads, d, max_len = 3, 4, 4, 2, 8, 20
    rs = np.random.RandomState(block_size)
    q = rs.randn(batch, chunk, heads, d).astype(np.float32)
    k = rs.randn(batch, max_len, kv_heads, d).astype(np.float32)
    v = rs.randn(batch, max_len, kv_heads, d).astype(np.float32)
    positions = np.asarray([[0, 1, 2, 3], [9, 10, 11, 12], [15, 16, 17, 18]], np.int32)
    bound = 19
    mask = (np.arange(max_len)[None, None] <= positions[:, :, None]) & (np.arange(max_len) < bound)
    want = _attend(q, k, v, mask)
    k_cache, v_cache = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    got = _attend_cache(q, k_cache, v_cache, positions, np.int32(bound), block_size=block_size)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # A query with nothing below the bound gets zeros, not NaN.
    empty = _attend_cache(q, k_cache, v_cache, positions, np.int32(0), block_size=block_size)
    np.testing.assert_array_equal(empty, 0.0)


@pytest.mark.parametrize("query_block", [3, 5])
def test_attend_in_query_blocks_equals_all_at_once(query_block):
    """The full forward's query blocks (dividing the queries or not, the last overlapping) give the
    one-shot attention and its gradients, soft-capped too; a padding row (no visible key) included."""
    batch, seq, heads, kv_heads, d = 2, 10, 4, 2, 8
    rs = np.random.RandomState(query_block)
    q, k, v = (rs.randn(batch, seq, h, d).astype(np.float32) for h in (heads, kv_heads, kv_heads))
    mask = np.tril(np.ones((seq, seq), bool))[None] & (np.arange(seq) < np.asarray([10, 7])[:, None, None])
    (_, want), want_grads = _blocked_loss_grads(q, k, v, mask, 0)  # (one program for both parameters)
    (_, got), grads = _blocked_loss_grads(q, k, v, mask, query_block)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    for g, w in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, atol=10 * TOL, rtol=0)


def test_cache_rows_read_and_write_the_named_rows_only(model):
    """`extend(cache_rows=)`: a batch of 2 over a 4-row cache (rows 3 and 1, as a compacted rollout
    runs) gives the logits of those rows' caches taken out and extended alone, writes only its rows,
    and leaves the others bit for bit."""
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda s, t, n, o, c, r: nnx.merge(graphdef, s).extend(t, n, o, c, block_size=8, cache_rows=r))
    plain = jax.jit(lambda s, t, n, o, c: nnx.merge(graphdef, s).extend(t, n, o, c, block_size=8))
    cache = model.init_cache(4, 32)
    _, cache = plain(state, _tokens((4, 12)), _i32([12, 7, 3, 10]), np.zeros(4, np.int32), cache)
    rows = np.asarray([3, 1], np.int32)
    chunk, n, offsets = _tokens((2, 3), seed=1), _i32([3, 2]), _i32([10, 7])
    got, new = run(state, chunk, n, offsets, cache, _i32(rows))
    taken = jax.tree.map(lambda x: jax.device_put(np.asarray(x)[rows]), cache)  # (rows taken out on the host)
    want, want_cache = plain(state, chunk, n, offsets, taken)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    for mine, ref, old in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(want_cache),
                              jax.tree_util.tree_leaves(cache)):
        mine, old = np.asarray(mine), np.asarray(old)
        np.testing.assert_array_equal(mine[rows], ref)
        np.testing.assert_array_equal(mine[[0, 2]], old[[0, 2]])


def test_blocked_extend_equals_full_and_each_sequence_alone(any_model):
    model = any_model
    """Ragged prefill chunks, ragged per-row offsets, then decode: block sizes 4 and 5 (the latter
    not dividing max_len) give the logits and cache of whole-buffer attention and of each row alone."""
    graphdef, state = nnx.split(model)
    max_len, lens1, lens2 = 24, np.array([5, 11, 3]), np.array([4, 0, 6])
    tokens = _np_tokens((3, 20), seed=1)  # sliced on the host: only the model's programs compile
    results = {}
    for block_size in (0, 4, 5):
        extend = _extend(graphdef, block_size)
        cache = model.init_cache(3, max_len)
        out = [[] for _ in range(3)]
        l1, cache = extend(state, tokens[:, :11], _i32(lens1), np.zeros(3, np.int32), cache)
        chunk2 = np.stack([tokens[b, lens1[b] : lens1[b] + 6] for b in range(3)])
        l2, cache = extend(state, chunk2, _i32(lens2), _i32(lens1), cache)
        offsets = lens1 + lens2
        l1, l2 = np.asarray(l1), np.asarray(l2)
        for b in range(3):
            out[b] += [l1[b, : lens1[b]], l2[b, : lens2[b]]]
        for _ in range(3):
            step = tokens[np.arange(3), offsets][:, None]
            logits, cache = extend(state, step, np.ones(3, np.int32), _i32(offsets), cache)
            logits = np.asarray(logits)
            for b in range(3):
                out[b].append(logits[b])
            offsets = offsets + 1
        results[block_size] = ([np.concatenate(o) for o in out], jax.tree_util.tree_map(np.asarray, cache))
        assert extend.trace_count() == 3  # chunk widths 11, 6 and 1: one trace each, whatever the offsets
    for block_size in (4, 5):
        for got, want in zip(results[block_size][0], results[0][0], strict=True):
            np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        for got, want in zip(jax.tree_util.tree_leaves(results[block_size][1]), jax.tree_util.tree_leaves(results[0][1])):
            np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
    for b in range(3):
        n = lens1[b] + lens2[b] + 3
        padded = np.zeros((1, max_len), np.int32)
        padded[0, :n] = tokens[b, :n]  # the chunks and decode steps read it in order
        alone = np.asarray(forward(state, padded))[0, :n]
        np.testing.assert_allclose(results[4][0][b], alone, atol=TOL, rtol=0)


def test_one_program_serves_growing_contexts(model):
    """Decode at live contexts 1, 9, 30 and 63 of a 64-slot buffer: one trace, and each step's
    logits equal whole-buffer attention."""
    graphdef, state = nnx.split(model)
    blocked, full = _extend(graphdef, 8), _extend(graphdef, 0)
    prompt = _np_tokens((2, 64), seed=4)
    cache = model.init_cache(2, 64)
    _, cache = full(state, prompt, np.full(2, 63, np.int32), np.zeros(2, np.int32), cache)
    for offset in (0, 8, 29, 62):
        token, offsets = prompt[:, offset : offset + 1], _i32([offset, offset // 2])
        got, _ = blocked(state, token, np.ones(2, np.int32), offsets, cache)
        want, _ = full(state, token, np.ones(2, np.int32), offsets, cache)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    assert blocked.trace_count() == 1


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*\w+\[([\d,]*)\]\S*\s+([\w\-]+)\(")


def _cache_sized_copies(hlo: str, size: int) -> list[str]:
    """Instructions of the optimized HLO that copy or transpose at least `size` elements."""
    found = []
    for line in hlo.splitlines():
        match = _INSTR.match(line)
        if not match:
            continue
        name, dims, op = match.groups()
        elements = math.prod(int(d) for d in dims.split(",") if d)
        moves = op in ("copy", "transpose") or (op == "fusion" and ("copy" in name or "transpose" in name))
        if moves and elements >= size:
            found.append(line.strip()[:160])
    return found


@pytest.mark.parametrize("block_size", [64, 16])  # one pass over the 64-slot buffer; a loop of 4 blocks
def test_decode_step_neither_copies_nor_transposes_the_cache_and_donates_it(model, block_size):
    graphdef, state = nnx.split(model)
    step = jax.jit(lambda s, t, o, c: nnx.merge(graphdef, s).extend(t, jnp.ones(3, jnp.int32), o, c,
                                                                    block_size=block_size), donate_argnums=3)
    cache = model.init_cache(3, 64)
    args = (state, _tokens((3, 1)), _i32([0, 5, 63]), cache)
    hlo = step.lower(*args).compile().as_text()
    assert _cache_sized_copies(hlo, cache[0][0].size) == []
    # The checker does see a cache-sized transpose when the layout forces one.
    moved = jax.jit(lambda c: c.transpose(0, 2, 1, 3) * 2).lower(cache[0][0]).compile().as_text()
    assert _cache_sized_copies(moved, cache[0][0].size)
    _, new_cache = step(*args)
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(cache))  # donated: updated in place
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(new_cache))


def test_shared_prefix_cache_equals_the_prefix_in_every_row(any_model):
    model = any_model
    """`extend(shared=)`: a prefix prefilled once at batch 1 and read by every row gives the logits of
    each row holding the prefix in its own cache (offsets then count from the prefix's end). The rows
    joined to the prefix run at the blocked-extend test's shapes (3 rows of 11 into 24 slots, then one token,
    blocks of 4): its programs, loaded from the compile cache."""
    graphdef, state = nnx.split(model)
    extend = jax.jit(lambda s, t, n, o, c, sh: nnx.merge(graphdef, s).extend(t, n, o, c, block_size=4, shared=sh))
    plain = _extend(graphdef, 4)
    prefix, rows = _np_tokens((1, 7), seed=5), _np_tokens((3, 4), seed=6)
    lengths = np.asarray([4, 2, 3], np.int32)
    shared = model.init_cache(1, 7)
    _, shared = plain(state, prefix, _i32([7]), np.zeros(1, np.int32), shared)
    got, cache = extend(state, rows, lengths, np.zeros(3, np.int32), model.init_cache(3, 12), shared)
    step, _ = extend(state, rows[:, :1], np.ones(3, np.int32), lengths, cache, shared)
    joined = np.concatenate([np.repeat(prefix, 3, axis=0), rows], axis=1)
    lengths_joined = lengths + 7
    want, cache = plain(state, joined, lengths_joined, np.zeros(3, np.int32), model.init_cache(3, 24))
    want_step, _ = plain(state, rows[:, :1], np.ones(3, np.int32), lengths_joined, cache)
    got, want = np.asarray(got), np.asarray(want)
    for b in range(3):
        np.testing.assert_allclose(got[b, : lengths[b]], want[b, 7 : 7 + lengths[b]], atol=TOL, rtol=0)
    np.testing.assert_allclose(step, want_step, atol=TOL, rtol=0)
