"""The KV cache path (`Decoder.extend`) against the full forward pass, and padding invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bmrl.model import ConfigError, ModelConfig, init_model

VOCAB = 97
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}
# One config with most features on (GQA, q/k/v/o biases, theta != 1e4, llama3 scaling); both
# families' cached decode is also checked against transformers in test_model_parity.py.
CONFIG = ModelConfig.tiny(VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                          rope_theta=5e5, rope_scaling=LLAMA3)
TOL = 1e-5
WIDTH = 16  # every full forward is padded to this width: one compile, and right padding is exact


class Jitted:
    """The model's forward and extend behind jax.jit (split/merge at the boundary): eager NNX
    dispatches op by op and would make these tests slow."""

    def __init__(self, model):
        graphdef, state = nnx.split(model)
        self.graphdef, self.state = graphdef, state
        self.init_cache = model.init_cache
        self._forward = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, m))
        self._extend = jax.jit(
            lambda s, t, n, o, c, last: nnx.merge(graphdef, s).extend(t, n, o, c, last_only=last), static_argnums=5
        )

    def __call__(self, tokens, attention_mask=None):
        return self._forward(self.state, tokens, attention_mask)

    def alone(self, seq):
        """Logits of one sequence by itself (right-padded to WIDTH; causal, so padding can't leak)."""
        seq = np.asarray(seq)
        padded = np.zeros((1, WIDTH), np.int32)
        padded[0, : len(seq)] = seq
        return self(jnp.asarray(padded))[0, : len(seq)]

    def extend(self, tokens, lengths, offsets, cache, last_only=False):
        return self._extend(self.state, tokens, lengths, offsets, cache, last_only)


@pytest.fixture(scope="module")
def model():
    return Jitted(init_model(CONFIG, seed=3))


def _tokens(shape, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, VOCAB, shape), jnp.int32)


def _scale(x):
    return float(np.abs(np.asarray(x)).max())


def test_prefill_then_decode_equals_full_forward(model):
    tokens = _tokens((2, 12))
    full = model(tokens)
    cache = model.init_cache(2, 16)
    prefill = 5
    logits, cache = model.extend(tokens[:, :prefill], jnp.full(2, prefill), jnp.zeros(2, jnp.int32), cache)
    steps = [logits]
    for i in range(prefill, 12):
        logits, cache = model.extend(tokens[:, i : i + 1], jnp.ones(2, jnp.int32), jnp.full(2, i), cache)
        steps.append(logits)
    cached = jnp.concatenate(steps, axis=1)
    assert _scale(full) > 0.01
    np.testing.assert_allclose(cached, full, atol=TOL, rtol=0)


def test_per_sequence_offsets_match_each_sequence_alone(model):
    """Rows with different prompt lengths prefill together, then decode at their own offsets."""
    lengths = np.array([5, 9, 2])
    total = 12
    tokens = _tokens((3, total), seed=1)
    cache = model.init_cache(3, 16)
    first, cache = model.extend(tokens[:, :9], jnp.asarray(lengths), jnp.zeros(3, jnp.int32), cache)
    got = [[np.asarray(first[b, : lengths[b]])] for b in range(3)]
    offsets = lengths.copy()
    for _ in range(3):  # decode step i reads token offsets[b] of row b
        step_tokens = tokens[jnp.arange(3), jnp.asarray(offsets)][:, None]
        logits, cache = model.extend(step_tokens, jnp.ones(3, jnp.int32), jnp.asarray(offsets), cache)
        for b in range(3):
            got[b].append(np.asarray(logits[b]))
        offsets += 1
    for b in range(3):
        alone = model.alone(tokens[b, : offsets[b]])
        np.testing.assert_allclose(np.concatenate(got[b]), alone, atol=TOL, rtol=0)


def test_chunked_prefill_with_ragged_chunks(model):
    """Two prefill chunks of different lengths per row equal one forward pass over the concatenation."""
    tokens = _tokens((2, 10), seed=2)
    cache = model.init_cache(2, 12)
    len1, len2 = np.array([3, 6]), np.array([4, 2])
    chunk1 = tokens[:, :6]
    l1, cache = model.extend(chunk1, jnp.asarray(len1), jnp.zeros(2, jnp.int32), cache)
    chunk2 = jnp.stack([tokens[b, len1[b] : len1[b] + 4] for b in range(2)])
    l2, cache = model.extend(chunk2, jnp.asarray(len2), jnp.asarray(len1), cache)
    for b in range(2):
        seq = np.concatenate([np.asarray(tokens[b, : len1[b]]), np.asarray(chunk2[b, : len2[b]])])
        alone = model.alone(seq)
        got = np.concatenate([l1[b, : len1[b]], l2[b, : len2[b]]])
        np.testing.assert_allclose(got, alone, atol=TOL, rtol=0)


def test_padded_batch_gives_each_sequence_its_logits_alone(model):
    lengths = [7, 3, 5]
    seqs = [np.asarray(_tokens((n,), seed=10 + i)) for i, n in enumerate(lengths)]
    width = max(lengths)
    right = np.zeros((3, width), np.int32)
    left = np.zeros((3, width), np.int32)
    right_mask = np.zeros((3, width), bool)
    left_mask = np.zeros((3, width), bool)
    for b, s in enumerate(seqs):
        right[b, : len(s)], right_mask[b, : len(s)] = s, True
        left[b, width - len(s) :], left_mask[b, width - len(s) :] = s, True
    right_logits = model(jnp.asarray(right), jnp.asarray(right_mask))
    left_logits = model(jnp.asarray(left), jnp.asarray(left_mask))
    assert np.isfinite(np.asarray(right_logits)).all() and np.isfinite(np.asarray(left_logits)).all()
    for b, s in enumerate(seqs):
        alone = model(jnp.asarray(s)[None])[0]  # truly alone, unpadded
        np.testing.assert_allclose(right_logits[b, : len(s)], alone, atol=TOL, rtol=0)
        np.testing.assert_allclose(left_logits[b, width - len(s) :], alone, atol=TOL, rtol=0)


def test_writes_past_max_len_are_dropped_not_clamped(model):
    max_len = 8
    tokens = _tokens((2, 8), seed=4)
    cache = model.init_cache(2, max_len)
    _, cache = model.extend(tokens[:, :6], jnp.array([6, 6]), jnp.zeros(2, jnp.int32), cache)
    before = jax.tree_util.tree_map(np.asarray, cache)
    # Row 0 writes positions 6..9 (8, 9 out of range); row 1 starts past the end entirely.
    chunk = _tokens((2, 4), seed=5)
    _, after = model.extend(chunk, jnp.array([4, 4]), jnp.array([6, 9]), cache)
    # Reference: the same writes into a cache long enough to hold them.
    big = model.init_cache(2, 16)
    _, big = model.extend(tokens[:, :6], jnp.array([6, 6]), jnp.zeros(2, jnp.int32), big)
    _, big = model.extend(chunk, jnp.array([4, 0]), jnp.array([6, 9]), big)
    for (k0, v0), (k1, v1), (kb, vb) in zip(before, after, big, strict=True):
        for old, new, ref in ((k0, k1, kb), (v0, v1, vb)):
            new = np.asarray(new)
            # cache layout [batch, kv_heads, max_len, head_dim]
            np.testing.assert_array_equal(new[:, :, :6], old[:, :, :6])  # earlier positions untouched
            np.testing.assert_allclose(new[0, :, 6:8], np.asarray(ref)[0, :, 6:8], atol=TOL, rtol=0)
            np.testing.assert_array_equal(new[1], old[1])  # fully out-of-range row unchanged
            assert not np.allclose(new[0, :, 7], np.asarray(ref)[0, :, 9])  # position 9 not clamped onto 7


def test_zero_length_rows_change_nothing(model):
    cache = model.init_cache(2, 8)
    _, cache = model.extend(_tokens((2, 3)), jnp.array([3, 3]), jnp.zeros(2, jnp.int32), cache)
    _, after = model.extend(_tokens((2, 2), seed=7), jnp.array([2, 0]), jnp.array([3, 3]), cache)
    for (k0, v0), (k1, v1) in zip(cache, after, strict=True):
        np.testing.assert_array_equal(np.asarray(k1)[1], np.asarray(k0)[1])
        np.testing.assert_array_equal(np.asarray(v1)[1], np.asarray(v0)[1])
        assert not np.array_equal(np.asarray(k1)[0], np.asarray(k0)[0])


def test_last_only_picks_each_rows_last_real_token(model):
    tokens = _tokens((3, 6), seed=8)
    lengths = jnp.array([6, 2, 0])
    all_logits, _ = model.extend(tokens, lengths, jnp.zeros(3, jnp.int32), model.init_cache(3, 8))
    last, _ = model.extend(tokens, lengths, jnp.zeros(3, jnp.int32), model.init_cache(3, 8), last_only=True)
    assert last.shape == (3, 1, VOCAB)
    np.testing.assert_allclose(last[:, 0], all_logits[jnp.arange(3), jnp.array([5, 1, 0])], atol=TOL, rtol=0)


def test_greedy_decode_in_jitted_while_loop_matches_python_loop(model):
    """split/merge at the jit boundary, cache carried through lax.while_loop and donated."""
    graphdef, state = model.graphdef, model.state
    prompt = _tokens((2, 4), seed=9)
    steps, max_len = 4, 12

    @jax.jit
    def decode(state, prompt):
        m = nnx.merge(graphdef, state)
        cache = m.init_cache(2, max_len)
        logits, cache = m.extend(prompt, jnp.full(2, 4), jnp.zeros(2, jnp.int32), cache, last_only=True)
        out = jnp.zeros((2, steps), jnp.int32).at[:, 0].set(jnp.argmax(logits[:, 0], -1))

        def body(carry):
            i, out, cache = carry
            token = jax.lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1)
            logits, cache = m.extend(token, jnp.ones(2, jnp.int32), jnp.full(2, 3 + i), cache)
            return i + 1, out.at[:, i].set(jnp.argmax(logits[:, 0], -1)), cache

        return jax.lax.while_loop(lambda c: c[0] < steps, body, (1, out, cache))[1]

    seq = np.zeros((2, WIDTH), np.int32)
    seq[:, :4] = prompt
    for i in range(4, 4 + steps):
        seq[:, i] = np.asarray(jnp.argmax(model(jnp.asarray(seq))[:, i - 1], -1))
    np.testing.assert_array_equal(decode(state, prompt), seq[:, 4 : 4 + steps])

    step = jax.jit(lambda s, t, c: nnx.merge(graphdef, s).extend(t, jnp.ones(2, jnp.int32), jnp.zeros(2, jnp.int32), c),
                   donate_argnums=2)
    logits, cache = step(state, prompt[:, :1], model.init_cache(2, max_len))
    np.testing.assert_allclose(logits, model(prompt[:, :1]), atol=TOL, rtol=0)


def test_bfloat16_compute_is_close_to_float32():
    cfg = CONFIG
    f32 = init_model(cfg, seed=1)
    bf16 = init_model(cfg.replace(param_dtype="bfloat16", dtype="bfloat16"), seed=1)
    assert bf16.layers[0].self_attn.q_proj.kernel[...].dtype == jnp.bfloat16
    nnx.update(bf16, jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), nnx.state(f32, nnx.Param)))
    m32, m16 = Jitted(f32), Jitted(bf16)
    tokens = _tokens((2, 8))
    l32, l16 = m32(tokens), m16(tokens)
    assert l16.dtype == jnp.float32
    assert np.abs(np.asarray(l16) - np.asarray(l32)).max() < 0.05 * _scale(l32) + 0.02
    assert m16.init_cache(2, 8)[0][0].dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_attention_heads=4, num_key_value_heads=3), "not divisible by num_key_value_heads"),
        (dict(hidden_size=30, num_attention_heads=4), "not a multiple of num_attention_heads"),
        (dict(model_type="qwen2", head_dim=8), r"hidden_size == num_attention_heads \* head_dim"),
        (dict(model_type="qwen2", attention_bias=False), "q/k/v biases"),
        (dict(model_type="gpt2"), "'gpt2' is not supported; supported: "),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "supported: default, llama3, linear"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "lacks low_freq_factor"),
        (dict(head_dim=7), "even"),
        (dict(dtype="int8"), "dtype"),
    ],
)
def test_inconsistent_configs_raise(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.tiny(VOCAB, **changes)


def test_config_is_hashable_with_rope_scaling():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    a = ModelConfig.tiny(VOCAB, rope_scaling=scaling)
    b = ModelConfig.tiny(VOCAB, rope_scaling=dict(reversed(scaling.items())))
    assert a == b and hash(a) == hash(b)
    assert ModelConfig.tiny(VOCAB, rope_scaling={"type": "default"}).rope_scaling is None
