"""Mistral (7B v0.1 - v0.3, Mistral-Nemo style head_dim): Llama's layout, no biases, and an optional
sliding window (`sliding_window`, on every layer when set; v0.2+ set it null)."""

from bmrl.model.families import Family

FAMILY = Family(
    model_type="mistral",
    config_class="MistralConfig",
    architecture="MistralForCausalLM",
    attention_bias=False,
    config_keys=("sliding_window",),
)
