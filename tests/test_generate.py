"""`bmrl.generate`: each row equals sampling it alone from the full forward pass, reproducible per
key, stop tokens, a shared prefix equal to prepending it, one compile per shape, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bmrl import compiles
from bmrl.generate import generate
from bmrl.model import ModelConfig, init_model
from bmrl.sampling import SamplingConfig, sample

VOCAB = 97
CONFIG = ModelConfig.tiny(VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
WIDTH = 24
SAMPLING = SamplingConfig(temperature=0.8, top_k=20)
PROMPTS = [[5, 17, 3, 44, 9], [8, 2], [60, 61, 62, 63, 64, 65, 66]]
NEW = 6


@pytest.fixture(scope="module")
def model():
    return init_model(CONFIG, seed=5)


@pytest.fixture(scope="module")
def keys():
    return jax.random.split(jax.random.key(7), len(PROMPTS))


def _alone(model, prompt, key, cfg, steps):
    """Sample one row by itself: full forward over the growing sequence, `sample` with the row's key
    folded with the step index (what the rollout does)."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
    seq, tokens, logprobs = list(prompt), [], []
    for i in range(steps):
        padded = np.zeros((1, WIDTH), np.int32)
        padded[0, : len(seq)] = seq
        logits = forward(state, jnp.asarray(padded))[:, len(seq) - 1]
        token, logprob = sample(jax.random.fold_in(key, i)[None], logits, cfg)
        seq.append(int(token[0]))
        tokens.append(int(token[0]))
        logprobs.append(float(logprob[0]))
    return np.asarray(tokens), np.asarray(logprobs)


def test_each_row_equals_sampling_it_alone_and_same_key_same_output(model, keys):
    out = generate(model, PROMPTS, max_new_tokens=NEW, key=keys, sampling=SAMPLING)
    assert out.tokens.shape == (3, NEW) and out.logprobs.shape == (3, NEW)
    np.testing.assert_array_equal(out.lengths, NEW)
    assert not np.asarray(out.stopped).any()
    for b, prompt in enumerate(PROMPTS):
        tokens, logprobs = _alone(model, prompt, keys[b], SAMPLING, NEW)
        np.testing.assert_array_equal(out.tokens[b], tokens)
        np.testing.assert_allclose(out.logprobs[b], logprobs, atol=1e-5, rtol=0)
    again = generate(model, PROMPTS, max_new_tokens=NEW, key=keys, sampling=SAMPLING)
    np.testing.assert_array_equal(again.tokens, out.tokens)
    # Rows reordered with their keys: the same rows, reordered (nothing leaks between neighbours).
    order = [2, 0, 1]
    moved = generate(model, [PROMPTS[i] for i in order], max_new_tokens=NEW, key=keys[jnp.asarray(order)],
                     sampling=SAMPLING)
    np.testing.assert_array_equal(moved.tokens, np.asarray(out.tokens)[order])
    other = generate(model, PROMPTS, max_new_tokens=NEW, key=jax.random.key(8), sampling=SAMPLING)
    assert not np.array_equal(other.tokens, out.tokens)


def test_stop_tokens_end_rows_and_pad_after(model, keys):
    free = generate(model, PROMPTS, max_new_tokens=NEW, key=keys, sampling=SAMPLING)
    stop = int(free.tokens[0, 2])
    out = generate(model, PROMPTS, max_new_tokens=NEW, key=keys, sampling=SAMPLING, stop_tokens=(stop,), pad_id=1)
    tokens, free_tokens = np.asarray(out.tokens), np.asarray(free.tokens)
    for b in range(3):
        hits = np.flatnonzero(free_tokens[b] == stop)
        n = hits[0] + 1 if hits.size else NEW
        assert out.lengths[b] == n and bool(out.stopped[b]) == bool(hits.size)
        np.testing.assert_array_equal(tokens[b, :n], free_tokens[b, :n])
        np.testing.assert_array_equal(tokens[b, n:], 1)
        np.testing.assert_array_equal(np.asarray(out.logprobs)[b, n:], 0.0)
    assert out.lengths[0] <= 3


def test_shared_prefix_equals_prepending_it(model, keys):
    prefix = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    prompts = [[5, 17, 3], [8], []]  # an empty prompt continues the prefix
    joined = generate(model, [prefix + p for p in prompts], max_new_tokens=NEW, key=keys, sampling=SAMPLING)
    shared = generate(model, prompts, max_new_tokens=NEW, key=keys, sampling=SAMPLING, prefix=prefix)
    np.testing.assert_array_equal(shared.tokens, joined.tokens)
    np.testing.assert_allclose(shared.logprobs, joined.logprobs, atol=1e-5, rtol=0)
    blocked = generate(model, prompts, max_new_tokens=NEW, key=keys, sampling=SAMPLING, prefix=prefix, block_size=2)
    np.testing.assert_array_equal(blocked.tokens, joined.tokens)


def test_one_compile_per_shape(model):
    cfg = SamplingConfig(temperature=0.0)
    generate(model, [[1, 2, 3], [4, 5, 6]], max_new_tokens=4, key=jax.random.key(0), sampling=cfg)
    before = compiles.counts().get("generate", 0)
    arrays = jnp.asarray([[7, 8, 9], [10, 11, 0]], jnp.int32)
    out = generate(model, arrays, lengths=jnp.asarray([3, 2]), max_new_tokens=4, key=jax.random.key(1), sampling=cfg)
    generate(model, [[9, 9], [3, 1, 4]], max_new_tokens=4, key=jax.random.key(2), sampling=cfg)
    assert compiles.counts()["generate"] == before  # same (batch, width, steps): no new trace
    alone = generate(model, [[10, 11]], max_new_tokens=4, key=jax.random.key(3), sampling=cfg)
    np.testing.assert_array_equal(out.tokens[1], alone.tokens[0])  # greedy right padding is exact
    assert compiles.counts()["generate"] == before + 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompts=[[1], []]), "empty prompt has nothing to continue"),
        (dict(prompts=[[1, VOCAB]]), r"prompt ids \[97\] are outside the model's vocabulary"),
        (dict(stop_tokens=(-1,)), "stop token ids"),
        (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
        (dict(key=jax.random.split(jax.random.key(0), 3)), r"one per prompt \(\[2\]\)"),
        (dict(max_new_tokens=5000), "exceeds the model's max_position_embeddings"),
        (dict(key=7), r"key must be a PRNG key, e.g. jax.random.key\(seed\)"),
        (dict(prompts=np.zeros((2, 3), np.int32), lengths=[3, 4]), r"lengths must be in \[0, 3\]"),
        (dict(lengths=[1, 1]), "lengths is only for array prompts"),
    ],
)
def test_bad_input_is_refused_with_the_fix(model, kwargs, message):
    args = dict(prompts=[[1, 2], [3]], max_new_tokens=2, key=jax.random.key(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        generate(model, **args)
