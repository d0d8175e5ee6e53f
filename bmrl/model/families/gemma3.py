"""Gemma 3 text (`gemma3_text`, Gemma3ForCausalLM: the 1B model, and the language model of the larger
ones): Gemma 2's layout (sqrt(hidden)-scaled embeddings, (1 + w) sandwich norms, GeGLU,
`query_pre_attn_scalar`) plus q/k RMSNorms, and five sliding-window layers per global one
(`layer_types`), the local layers with their own RoPE base (`rope_parameters["sliding_attention"]`,
10k) and any RoPE scaling on the global layers only. Soft-capping is off in the released models.
"""

import dataclasses

from bmrl.model.families.gemma2 import FAMILY as GEMMA2

FAMILY = dataclasses.replace(
    GEMMA2,
    model_type="gemma3_text",
    config_class="Gemma3TextConfig",
    architecture="Gemma3ForCausalLM",
    qk_norm=True,
    sliding_pattern=6,
    rope_per_layer_type=True,
    unsupported=(("use_bidirectional_attention", False, "bidirectional attention is not implemented"),),
    tokens_past_vocab=("<image_soft_token>",),  # id 262144 in Gemma 3's tokenizer: images only, past the text vocab
)
