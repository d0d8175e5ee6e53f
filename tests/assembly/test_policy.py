"""A policy loaded from a directory takes the config's dtypes (`bmrl.assembly.load_policy`)."""

import jax.numpy as jnp
import pytest

from bmrl import config as config_lib
from bmrl.assembly import init_policy, load_policy
from bmrl.model import save_pretrained


@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")])
def test_a_saved_policy_loads_with_the_configs_dtypes(dtypes, tmp_path, tiny_tokenizer):
    """model.param_dtype / model.dtype hold for a model directory as for a tiny decoder: a real model's config
    asking for bfloat16 compute computes in bfloat16 (they were once ignored for model.path, silently float32)."""
    param_dtype, dtype = dtypes
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    fresh, _ = init_policy(config_lib.build({"model": small}), tiny_tokenizer)
    save_pretrained(fresh, tiny_tokenizer, tmp_path / "policy")
    cfg = config_lib.build({"model": {"path": str(tmp_path / "policy"), "param_dtype": param_dtype, "dtype": dtype}})
    policy, tok = init_policy(cfg)
    assert (str(policy.config.param_dtype), str(policy.config.dtype)) == dtypes
    assert policy.embed_tokens.embedding[...].dtype == jnp.dtype(param_dtype)
    assert len(tok) == len(tiny_tokenizer)
    default, _ = load_policy(tmp_path / "policy")  # no model section: float32, as the files were saved
    assert (str(default.config.param_dtype), str(default.config.dtype)) == ("float32", "float32")
