"""The policy model: one decoder in Flax NNX for the families in `families/` (Llama, Qwen2, Qwen3, Mistral,
Gemma 2, Gemma 3 text), its KV cache, HF checkpoints, tokenizers."""

from bmrl.model.config import ConfigError, ModelConfig
from bmrl.model.decoder import Decoder, KVCache, init_model, num_params
from bmrl.model.families import FAMILIES, SUPPORTED_MODEL_TYPES, Family, get_family
from bmrl.model.hf import CheckpointError, config_from_hf, config_to_hf, from_pretrained, save_pretrained
from bmrl.model.tokenizer import (
    BOS,
    END_OF_TURN,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    load_tokenizer,
    save_tokenizer,
    train_tiny_tokenizer,
)

__all__ = [
    "BOS",
    "END_OF_TURN",
    "EOS",
    "PAD",
    "SPECIAL_TOKENS",
    "SUPPORTED_MODEL_TYPES",
    "CheckpointError",
    "ConfigError",
    "Decoder",
    "FAMILIES",
    "Family",
    "KVCache",
    "ModelConfig",
    "config_from_hf",
    "config_to_hf",
    "from_pretrained",
    "get_family",
    "init_model",
    "load_tokenizer",
    "num_params",
    "save_pretrained",
    "save_tokenizer",
    "train_tiny_tokenizer",
]
