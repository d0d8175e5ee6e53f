"""Gemma 2: embeddings scaled by sqrt(hidden), (1 + w) RMSNorms before and after attention and MLP,
GeGLU (tanh GELU), scores scaled by `query_pre_attn_scalar`**-0.5, attention-logit and final-logit
tanh soft-capping, and a sliding window on every other layer (0, 2, 4, ...: `layer_types`)."""

from bmrl.model.families import Family

FAMILY = Family(
    model_type="gemma2",
    config_class="Gemma2Config",
    architecture="Gemma2ForCausalLM",
    attention_bias=None,
    o_proj_bias=True,
    tie_word_embeddings=True,
    hidden_divisible_by_heads=True,  # Gemma2Config / Gemma3TextConfig require it (head_dim is free)
    norm_offset=1.0,
    sandwich_norms=True,
    embed_scale=True,
    hidden_act="gelu_pytorch_tanh",
    activation_key="hidden_activation",
    sliding_pattern=2,
    rope_types=("default", "linear"),
    unsupported=(("use_bidirectional_attention", None, "bidirectional attention is not implemented"),),
    config_keys=("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                 "layer_types"),
)
