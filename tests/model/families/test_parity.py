"""Logits parity with transformers' PyTorch model of every family in `bmrl.model.families`, both directions.

A new family's parity test is its entry in CASES (the fixture builds the torch model from the spec).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bmrl.generate import generate  # noqa: E402
from bmrl.model import FAMILIES, ModelConfig, from_pretrained, init_model, save_pretrained  # noqa: E402
from bmrl.sampling import SamplingConfig  # noqa: E402

TOL = 1e-4
VOCAB = 101
WINDOW = 6  # sliding window of the windowed cases: every test sequence is longer
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
CASES = {
    "llama_gqa_theta": ("llama", dict(num_attention_heads=4, num_key_value_heads=2,
                                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "llama_tied_bias_llama3": ("llama", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                             attention_bias=True, tie_word_embeddings=True,
                                             rope_parameters={**LLAMA3, "rope_theta": 10000.0})),
    "qwen2_gqa_tied": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen2_mha": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5,
                                rope_parameters={"rope_type": "default", "rope_theta": 20000.0})),
    # head_dim 16 with 4 heads over hidden 32: independent of hidden / heads, as in Qwen3-0.6B
    "qwen3_qk_norm_head_dim": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3_tied_window": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                                        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "mistral_window": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       sliding_window=WINDOW)),
    "gemma2_softcap": ("gemma2", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                      final_logit_softcapping=3.0, sliding_window=WINDOW)),
    "gemma3_local_rope_scaled": ("gemma3_text", dict(
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})),
}


def _torch_model(model_type, kwargs, seed=0):
    config_class = getattr(transformers, FAMILIES[model_type].config_class)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_class(**COMMON, **kwargs), attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():  # biases and norms too, so a dropped or swapped tensor shows
            p.normal_(0.0, 0.15)
    return model.eval()


def _torch_logits(model, tokens, mask=None):
    with torch.no_grad():
        kwargs = {} if mask is None else {"attention_mask": torch.tensor(np.asarray(mask), dtype=torch.long)}
        return model(torch.tensor(np.asarray(tokens), dtype=torch.long), **kwargs).logits.float().numpy()


def _tokens(shape, seed=0):
    return np.random.RandomState(seed).randint(0, VOCAB, shape).astype(np.int32)


def _jit_forward(model):
    """model(tokens, mask) behind jax.jit: one compile instead of op-by-op eager dispatch."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, m))
    return lambda tokens, mask: forward(state, jnp.asarray(tokens), jnp.asarray(mask))


def _max_diff(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    """(bmrl model loaded from a transformers checkpoint, its jitted forward, the torch model)."""
    model_type, kwargs = CASES[request.param]
    torch_model = _torch_model(model_type, kwargs)
    path = tmp_path_factory.mktemp(request.param)
    torch_model.save_pretrained(path)
    model, tokenizer = from_pretrained(path)
    assert tokenizer is None
    assert model.config.model_type == model_type
    return model, _jit_forward(model), torch_model


def test_logits_match_transformers(pair):
    _, forward, torch_model = pair
    tokens = _tokens((3, 20))  # past original_max_position_embeddings=16 of the llama3 case
    ref = _torch_logits(torch_model, tokens)
    assert np.abs(ref).max() > 0.1
    assert _max_diff(forward(tokens, np.ones((3, 20), bool)), ref) <= TOL


def test_right_padded_batch_matches_transformers(pair):
    _, forward, torch_model = pair
    lengths = [20, 13, 6]
    tokens = _tokens((3, 20), seed=1)
    mask = np.arange(20)[None, :] < np.array(lengths)[:, None]
    tokens = np.where(mask, tokens, 0)
    ref = _torch_logits(torch_model, tokens, mask)
    got = np.asarray(forward(tokens, mask))
    for b, n in enumerate(lengths):
        assert _max_diff(got[b, :n], ref[b, :n]) <= TOL


def test_cached_decode_matches_transformers(pair):
    """Prefill at per-sequence offsets, then single-token decode, against torch's full forward."""
    model, _, torch_model = pair
    graphdef, state = nnx.split(model)
    extend = jax.jit(lambda s, t, n, o, c: nnx.merge(graphdef, s).extend(t, n, o, c))
    tokens = _tokens((2, 14), seed=2)
    ref = _torch_logits(torch_model, tokens)
    prompt = np.array([9, 4])
    cache = model.init_cache(2, 16)
    logits, cache = extend(state, jnp.asarray(tokens[:, :9]), jnp.asarray(prompt), jnp.zeros(2, jnp.int32), cache)
    for b in range(2):
        assert _max_diff(logits[b, : prompt[b]], ref[b, : prompt[b]]) <= TOL
    offsets = prompt.copy()
    for _ in range(5):
        step = tokens[np.arange(2), offsets][:, None]
        logits, cache = extend(state, jnp.asarray(step), jnp.ones(2, jnp.int32), jnp.asarray(offsets), cache)
        assert _max_diff(logits[:, 0], ref[np.arange(2), offsets]) <= TOL
        offsets += 1


def test_greedy_generate_matches_transformers_past_the_window(pair):
    """bmrl.generate (a shared prefix, prompt prefill, cached decode in a while loop, blocks of 4 keys)
    picks transformers' greedy tokens for 14 steps, to position 19, past the window of 6."""
    model, _, torch_model = pair
    if model.config.sliding_window is None:
        pytest.skip("no window: tests/test_generate.py checks generate against the full forward")
    tokens = _tokens((2, 6), seed=7)
    out = generate(model, tokens[:, 2:], prefix=tokens[0, :2].tolist(), max_new_tokens=14, key=jax.random.key(0),
                   sampling=SamplingConfig(temperature=0.0), block_size=4)
    joined = np.concatenate([np.repeat(tokens[:1, :2], 2, axis=0), tokens[:, 2:]], axis=1)
    with torch.no_grad():
        ref = torch_model.generate(torch.tensor(joined, dtype=torch.long), max_new_tokens=14, min_new_tokens=14,
                                   do_sample=False, pad_token_id=0)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref[:, 6:].numpy())


@pytest.mark.parametrize("case", ["qwen2_gqa_tied", "gemma3_local_rope_scaled"])
def test_bfloat16_checkpoint_loads(tmp_path, case):
    model_type, kwargs = CASES[case]
    torch_model = _torch_model(model_type, kwargs, seed=1).to(torch.bfloat16)
    torch_model.save_pretrained(tmp_path)
    model, _ = from_pretrained(tmp_path)  # bf16 on disk, float32 in memory
    tokens = _tokens((3, 20), seed=3)
    # the same bf16-rounded weights, float32 compute (reloaded: Gemma's sqrt(hidden) buffer stays exact)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                                 attn_implementation="eager")
    ref = _torch_logits(reloaded.eval(), tokens)
    assert _max_diff(_jit_forward(model)(tokens, np.ones((3, 20), bool)), ref) <= TOL


EXPORTS = {  # (model_type, tied, extra config): every family, written by bmrl and read by transformers
    "llama": ("llama", False, dict(rope_scaling=LLAMA3, attention_bias=True)),
    "qwen2": ("qwen2", True, dict(attention_bias=True)),
    "qwen3": ("qwen3", False, dict(head_dim=16, sliding_window=WINDOW, layer_types=("full_attention",
                                                                                    "sliding_attention"))),
    "mistral": ("mistral", True, dict(sliding_window=WINDOW)),
    "gemma2": ("gemma2", True, dict(sliding_window=WINDOW, query_pre_attn_scalar=12.0, attn_logit_softcapping=2.0,
                                    final_logit_softcapping=3.0)),
    "gemma3_text": ("gemma3_text", False, dict(sliding_window=WINDOW, rope_local_theta=10000.0, head_dim=16,
                                               rope_scaling={"rope_type": "linear", "factor": 2.0})),
}


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_export_round_trip_through_transformers(tmp_path, name):
    model_type, tied, extra = EXPORTS[name]
    cfg = ModelConfig.tiny(VOCAB, model_type=model_type, hidden_size=32, num_key_value_heads=2,
                           tie_word_embeddings=tied, rope_theta=30000.0, **extra)
    model = init_model(cfg, seed=4)
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    nnx.update(model, jax.tree_util.tree_unflatten(
        treedef, [0.15 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]))
    save_pretrained(model, None, tmp_path, max_shard_bytes=None if tied else 30_000)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(torch_model).__name__ == FAMILIES[model_type].architecture
    tokens = _tokens((3, 20), seed=5)
    ref = _torch_logits(torch_model, tokens)
    assert np.abs(ref).max() > 0.1
    assert _max_diff(_jit_forward(model)(tokens, np.ones((3, 20), bool)), ref) <= TOL
    assert from_pretrained(tmp_path)[0].config == cfg  # and back: the same architecture


def test_every_family_has_a_parity_case():
    assert {model_type for model_type, _ in CASES.values()} == set(FAMILIES) == set(EXPORTS)
