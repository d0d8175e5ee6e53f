"""Qwen3 (dense): Llama's layout with an RMSNorm over head_dim on queries and keys before RoPE.

head_dim is independent of hidden_size / num_attention_heads (Qwen3-0.6B: 16 heads x 128 > 1024);
q/k/v biases only when config.json's `attention_bias` says so (then o_proj too, as in HF). The
optional sliding window (`use_sliding_window`, layers from `max_window_layers` on) is honoured
through the `layer_types` transformers derives; the released models keep it off.
"""

from bmrl.model.families import Family

FAMILY = Family(
    model_type="qwen3",
    config_class="Qwen3Config",
    architecture="Qwen3ForCausalLM",
    attention_bias=None,
    o_proj_bias=True,
    qk_norm=True,
    config_keys=("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"),
)
