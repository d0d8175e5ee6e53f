"""Qwen2 / Qwen2.5: Llama's layout with q/k/v biases always on (o_proj never) and no `attention_bias` key.

head_dim is tied to hidden_size / num_attention_heads; small checkpoints tie the embeddings in their
config.json. Sliding-window attention is refused (the released models keep it off).
"""

from bmrl.model.families import Family

FAMILY = Family(
    model_type="qwen2",
    config_class="Qwen2Config",
    architecture="Qwen2ForCausalLM",
    attention_bias=True,
    o_proj_bias=False,
    head_dim_is_hidden_over_heads=True,
    unsupported=(("use_sliding_window", False, "sliding-window attention is not implemented"),),
)
