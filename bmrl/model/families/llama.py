"""Llama (Llama 2 / 3 / 3.1 / 3.2, and look-alikes such as TinyLlama, SmolLM): the reference layout.

Biases are off unless config.json sets `attention_bias`, which then biases q/k/v *and* o_proj.
"""

from bmrl.model.families import Family

FAMILY = Family(
    model_type="llama",
    config_class="LlamaConfig",
    architecture="LlamaForCausalLM",
    attention_bias=None,
    o_proj_bias=True,
    hidden_divisible_by_heads=True,
    unsupported=(("mlp_bias", False, "MLP biases are not implemented"),),
)
