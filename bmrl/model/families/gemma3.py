"""Gemma 3 text (`gemma3_text`, Gemma3ForCausalLM: the 1B model, and the language model of the larger
ones): Gemma 2's layout (sqrt(hidden)-scaled embeddings, (1 + w) sandwich norms, GeGLU,
`query_pre_attn_scalar`) plus q/k RMSNorms, and five sliding-window layers per global one
(`layer_types`), the local layers with their own RoPE base (`rope_parameters["sliding_attention"]`,
10k) and any RoPE scaling on the global layers only. Soft-capping is off in the released models.
"""

from bmrl.model.families import Family

FAMILY = Family(
    model_type="gemma3_text",
    config_class="Gemma3TextConfig",
    architecture="Gemma3ForCausalLM",
    attention_bias=None,
    o_proj_bias=True,
    tie_word_embeddings=True,
    qk_norm=True,
    norm_offset=1.0,
    sandwich_norms=True,
    embed_scale=True,
    hidden_act="gelu_pytorch_tanh",
    activation_key="hidden_activation",
    sliding_pattern=6,
    rope_per_layer_type=True,
    rope_types=("default", "linear"),
    unsupported=(("use_bidirectional_attention", False, "bidirectional attention is not implemented"),),
    config_keys=("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                 "layer_types"),
)
