"""Hugging Face directory import/export without torch: round trips, shards, bf16, and every bad input."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from bmrl.model import (
    FAMILIES,
    CheckpointError,
    ModelConfig,
    from_pretrained,
    init_model,
    save_pretrained,
    train_tiny_tokenizer,
)
from bmrl.model.hf import config_from_hf, load_config
from tests.model.hf_edit import edit_config, edit_tensors

TEXTS = ["move up", "move down", "push the box left", "You see a wall.", "<|end|> ok"] * 4


def _params(model):
    return {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _randomize(model, seed=0):
    """Nonzero everything (biases and norms too), so a swapped or dropped tensor shows."""
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree_util.tree_flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [(0.15 * jax.random.normal(k, x.shape)).astype(x.dtype) for k, x in zip(keys, leaves, strict=True)]
    nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return train_tiny_tokenizer(TEXTS, vocab_size=300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    cfg = ModelConfig.tiny(len(tokenizer), hidden_size=32, num_key_value_heads=2, attention_bias=True, rope_theta=5e5)
    model = _randomize(init_model(cfg, seed=0))
    path = tmp_path_factory.mktemp("ckpt")
    save_pretrained(model, tokenizer, path)
    return model, path


@pytest.fixture
def copy(saved, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(saved[1], dst)
    return dst


# ---------------------------------------------------------------- round trips
def test_save_then_load_restores_model_and_tokenizer(saved, tokenizer):
    model, path = saved
    loaded, tok = from_pretrained(path)
    assert loaded.config == model.config
    ref, got = _params(model), _params(loaded)
    assert ref.keys() == got.keys()
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=str(name))
    config = json.loads((path / "config.json").read_text())
    assert config["eos_token_id"] == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
    assert tok is not None and tok.encode("push the box left", add_special_tokens=False) == tokenizer.encode(
        "push the box left", add_special_tokens=False
    )


def test_sharded_checkpoint_loads(saved, tmp_path):
    model, _ = saved
    save_pretrained(model, None, tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (tmp_path / "model.safetensors").exists()
    loaded, tok = from_pretrained(tmp_path)
    assert tok is None
    for name, value in _params(model).items():
        np.testing.assert_array_equal(_params(loaded)[name], value)


def test_bfloat16_checkpoint_round_trip(saved, tmp_path):
    model, _ = saved
    bf16 = init_model(model.config.replace(param_dtype="bfloat16"), seed=0)
    nnx.update(bf16, jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    save_pretrained(bf16, None, tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="flax") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    as_bf16, _ = from_pretrained(tmp_path, param_dtype="bfloat16", dtype="bfloat16")
    as_f32, _ = from_pretrained(tmp_path)
    ref = _params(bf16)
    for name, value in _params(as_bf16).items():
        assert value.dtype == jnp.bfloat16
        np.testing.assert_array_equal(value, ref[name])
    for name, value in _params(as_f32).items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, ref[name].astype(np.float32))


def test_legacy_rope_fields_in_config_json(copy):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    cfg = json.loads((copy / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(rope_theta=123456.0, rope_scaling=scaling)
    (copy / "config.json").write_text(json.dumps(cfg))
    loaded = load_config(copy)
    assert loaded.rope_theta == 123456.0 and loaded.rope_scaling == scaling


# ---------------------------------------------------------------- bad inputs
def test_missing_directory_and_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        from_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        from_pretrained(tmp_path)


def test_unsupported_model_type_names_the_supported_ones(copy):
    edit_config(copy, model_type="gpt2")
    with pytest.raises(CheckpointError, match=rf"'gpt2' is not supported; supported: {', '.join(sorted(FAMILIES))}"):
        from_pretrained(copy)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_key_value_heads=3), "num_attention_heads=4 is not divisible by num_key_value_heads=3"),
        (dict(hidden_size=30), "hidden size \\(30\\) is not a multiple"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (
            dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                  "original_max_position_embeddings": 64}),
            "'yarn' is not supported; supported: default, llama3, linear",
        ),
    ],
)
def test_inconsistent_or_unsupported_config_json(copy, changes, message):
    edit_config(copy, **changes)
    with pytest.raises(CheckpointError, match=message):
        from_pretrained(copy)


def test_missing_unexpected_and_misshaped_tensors_are_listed(copy, tokenizer):
    vocab = len(tokenizer)

    def edit(t):
        del t["model.layers.1.mlp.up_proj.weight"]
        t["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)
        t["model.embed_tokens.weight"] = np.zeros((vocab + 1, 32), np.float32)

    edit_tensors(copy, edit)
    with pytest.raises(CheckpointError) as err:
        from_pretrained(copy)
    message = str(err.value)
    assert "missing tensors: model.layers.1.mlp.up_proj.weight (64, 32)" in message
    assert "unexpected tensors: model.layers.0.self_attn.q_norm.weight (16,)" in message
    assert f"model.embed_tokens.weight: checkpoint ({vocab + 1}, 32), config expects ({vocab}, 32)" in message


def test_config_mismatch_with_tensors(copy):
    edit_config(copy, num_hidden_layers=3)
    with pytest.raises(CheckpointError, match=r"missing tensors: model\.layers\.2\.self_attn\.q_proj\.weight"):
        from_pretrained(copy)


def test_no_weights_and_broken_index(copy):
    (copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        from_pretrained(copy)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors"):
        from_pretrained(copy)


def test_config_from_hf_rejects_unsupported_features():
    from transformers import LlamaConfig

    with pytest.raises(ValueError, match="mlp_bias"):
        config_from_hf(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, mlp_bias=True))


def test_gemma3_tokenizer_may_hold_its_image_token_past_the_vocabulary(tmp_path):
    """Gemma 3's tokenizer has `<image_soft_token>` at id 262144, one past the text vocabulary: loaded
    (text never produces it); any other token past the embedding is still refused."""
    tok = train_tiny_tokenizer(TEXTS, vocab_size=300)
    cfg = ModelConfig.tiny(len(tok), model_type="gemma3_text", hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1)
    tok.add_special_tokens({"additional_special_tokens": ["<image_soft_token>"]})
    save_pretrained(init_model(cfg, seed=0), tok, tmp_path)
    _, loaded = from_pretrained(tmp_path)
    assert len(loaded) == cfg.vocab_size + 1
    tok.add_special_tokens({"additional_special_tokens": ["<image_soft_token>", "<other>"]})
    save_pretrained(init_model(cfg, seed=0), tok, tmp_path)
    with pytest.raises(CheckpointError, match="more than config.json's vocab_size"):
        from_pretrained(tmp_path)
