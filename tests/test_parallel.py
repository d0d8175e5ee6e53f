"""Mesh construction and partition rules by parameter name."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from bmrl.model import ModelConfig, init_model
from bmrl.parallel import (
    DEFAULT_RULES,
    MeshConfig,
    ShardingRuleError,
    _path_str,
    make_mesh,
    matching_rule,
    param_shardings,
    spec_for,
    state_shardings,
)


class FakeMesh:
    shape = {"data": 2, "fsdp": 2, "tensor": 4}


def test_rules_by_name_and_divisibility():
    mesh = FakeMesh()
    assert spec_for("layers/3/self_attn/q_proj/kernel", (64, 64), mesh) == P("fsdp", "tensor")
    assert spec_for("layers/3/mlp/down_proj/kernel", (128, 64), mesh) == P("tensor", "fsdp")
    assert spec_for("embed_tokens/embedding", (384, 64), mesh) == P("tensor", "fsdp")
    assert spec_for("layers/0/self_attn/k_proj/bias", (32,), mesh) == P("tensor")
    assert spec_for("norm/weight", (64,), mesh) == P()
    assert spec_for("layers/1/input_layernorm/weight", (64,), mesh) == P()
    assert spec_for("layers/1/self_attn/o_proj/bias", (64,), mesh) == P()
    # A dim the axis does not divide stays replicated along it.
    assert spec_for("layers/0/self_attn/q_proj/kernel", (64, 30), mesh) == P("fsdp")  # trailing None dropped


def test_state_paths_match_rules():
    """nnx State leaves end in `.value`; the rules must still see `.../kernel`."""
    model = init_model(ModelConfig.tiny(vocab_size=64, hidden_size=32), 0)
    _, state = nnx.split(model)
    mesh = make_mesh(MeshConfig(data=1), devices=jax.devices()[:1])
    specs = {jax.tree_util.keystr(p): s.spec for p, s in jax.tree_util.tree_flatten_with_path(param_shardings(state, mesh))[0]}
    q = next(v for k, v in specs.items() if "q_proj" in k and "kernel" in k)
    assert q == P("fsdp", "tensor")


def test_mesh_sizes():
    devices = jax.devices()
    mesh = make_mesh(MeshConfig(data=-1), devices=devices)
    assert mesh.shape["data"] == len(devices) and mesh.axis_names == ("data", "fsdp", "tensor")
    with pytest.raises(ValueError, match="needs 3 devices"):
        make_mesh(MeshConfig(data=3, fsdp=1, tensor=1), devices=devices[:1])
    with pytest.raises(ValueError, match="At most one mesh axis may be -1"):
        make_mesh(MeshConfig(data=-1, fsdp=-1), devices=devices)
    assert np.asarray(mesh.devices).size == len(devices)


# Every kind of parameter the decoder has and the layout meant for it (None: replicated).
INTENDED = {
    "embed_tokens/embedding": P("tensor", "fsdp"),
    "lm_head/kernel": P("fsdp", "tensor"),
    "q_proj/kernel": P("fsdp", "tensor"), "k_proj/kernel": P("fsdp", "tensor"), "v_proj/kernel": P("fsdp", "tensor"),
    "gate_proj/kernel": P("fsdp", "tensor"), "up_proj/kernel": P("fsdp", "tensor"),
    "o_proj/kernel": P("tensor", "fsdp"), "down_proj/kernel": P("tensor", "fsdp"),
    "q_proj/bias": P("tensor"), "k_proj/bias": P("tensor"), "v_proj/bias": P("tensor"), "o_proj/bias": P(),
    "input_layernorm/weight": P(), "post_attention_layernorm/weight": P(), "norm/weight": P(),
    "pre_feedforward_layernorm/weight": P(), "post_feedforward_layernorm/weight": P(),  # Gemma's sandwich norms
    "q_norm/weight": P(), "k_norm/weight": P(),  # Qwen3 / Gemma 3 per-head q/k norms
}


@pytest.mark.parametrize("arch", [
    dict(model_type="llama", tie_word_embeddings=False, attention_bias=True),  # o_proj bias too
    dict(model_type="qwen2", tie_word_embeddings=True),  # q/k/v biases, tied head
    dict(model_type="gemma3_text", tie_word_embeddings=True, attention_bias=True),  # sandwich and q/k norms
])
def test_every_parameter_has_its_intended_rule(arch):
    """No parameter falls through: each matches the rule meant for its kind (there is no catch-all),
    and every parameter kind of the decoder is listed in INTENDED."""
    model = init_model(ModelConfig.tiny(vocab_size=64, hidden_size=32, **arch), 0)
    _, state = nnx.split(model)
    paths = [_path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    seen = set()
    for path in paths:
        kind = next((k for k in INTENDED if path == k or path.endswith("/" + k)), None)
        assert kind is not None, f"{path}: a parameter kind the test does not know; add it to INTENDED"
        assert matching_rule(path)[1] == INTENDED[kind], path
        seen.add(kind)
    assert ("lm_head/kernel" in seen) == (not arch["tie_word_embeddings"])
    assert all(p != ".*" for p, _ in DEFAULT_RULES)  # no catch-all default
    one = make_mesh(MeshConfig(data=1), devices=jax.devices()[:1])
    param_shardings(state, one)  # strict: would raise for an unmatched parameter


def test_unmatched_parameter_is_an_error_naming_it():
    mesh = make_mesh(MeshConfig(data=1), devices=jax.devices()[:1])
    state = {"layers": {"0": {"router": {"kernel": np.zeros((4, 4))}}}, "norm": {"weight": np.ones(4)}}
    with pytest.raises(ShardingRuleError, match="layers/0/router/kernel.*DEFAULT_RULES"):
        param_shardings(state, mesh)


def test_optimizer_state_follows_its_parameters():
    """adam moments (and a float32 master copy) take their parameter's layout; counters are replicated."""
    from bmrl.learn import make_optimizer
    from bmrl.learn.step import init_opt_state

    model = init_model(ModelConfig.tiny(vocab_size=64, hidden_size=32), 0)
    _, params = nnx.split(model)
    mesh = make_mesh(MeshConfig(data=1), devices=jax.devices()[:1])
    opt = init_opt_state(make_optimizer(1e-3, total_steps=4, master_f32=True), params)
    sh = state_shardings(opt, mesh)
    flat = jax.tree_util.tree_flatten_with_path(sh)[0]
    q = [(_path_str(p), s.spec) for p, s in flat if _path_str(p).endswith("q_proj/kernel")]
    assert len(q) == 3 * model.config.num_hidden_layers  # float32 master, adam mu and nu
    assert all(spec == P("fsdp", "tensor") for _, spec in q), q
    scalars = [s.spec for (p, s), x in zip(flat, jax.tree.leaves(opt)) if np.ndim(x) == 0]
    assert scalars and all(spec == P() for spec in scalars)
