"""Mesh construction and partition rules by parameter name."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from bmrl.model import ModelConfig, init_model
from bmrl.parallel import MeshConfig, make_mesh, param_shardings, spec_for


class FakeMesh:
    shape = {"data": 2, "fsdp": 2, "tensor": 4}


def test_rules_by_name_and_divisibility():
    mesh = FakeMesh()
    assert spec_for("layers/3/self_attn/q_proj/kernel", (64, 64), mesh) == P("fsdp", "tensor")
    assert spec_for("layers/3/mlp/down_proj/kernel", (128, 64), mesh) == P("tensor", "fsdp")
    assert spec_for("embed_tokens/embedding", (384, 64), mesh) == P("tensor", "fsdp")
    assert spec_for("layers/0/self_attn/k_proj/bias", (32,), mesh) == P("tensor")
    assert spec_for("norm/weight", (64,), mesh) in (P(), P(None))
    # A dim the axis does not divide stays replicated along it.
    assert spec_for("layers/0/self_attn/q_proj/kernel", (64, 30), mesh) == P("fsdp", None)


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
