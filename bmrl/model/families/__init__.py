"""Model families as data: what Llama, Qwen2, ... change about the one decoder in `bmrl.model.decoder`.

Every module of this package defines `FAMILY = Family(...)`; the registry below finds them by
walking the package, so a family whose differences fit these fields (bias placement, tied
embeddings, rope types, shape rules, Hugging Face class, tensor and config-key names) is one new
file plus its parity test:
  1. `bmrl/model/families/<name>.py` with `FAMILY = Family(model_type=..., config_class=..., ...)`;
  2. its entry in `CASES` of `tests/model/families/test_parity.py` (logits vs transformers, both directions).
The decoder's optional arithmetic is switched on by fields here (q/k norms, (1 + w) norms, sandwich
norms, embedding scaling, the default sliding-window layer pattern); a family that needs arithmetic
none of them describes also needs a decoder feature.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

from bmrl.registry import Registry


@dataclasses.dataclass(frozen=True)
class TensorNames:
    """Hugging Face tensor-name prefixes of the decoder's modules (`{i}` is the layer index).

    Inside a layer the names are the decoder's own, which mirror HF's (`self_attn.q_proj`,
    `mlp.gate_proj`, `input_layernorm`, ...).
    """

    embed_tokens: str = "model.embed_tokens"
    norm: str = "model.norm"
    lm_head: str = "lm_head"
    layer: str = "model.layers.{i}"


@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face model family, as the fields where it differs from the others."""

    model_type: str  # config.json "model_type"
    config_class: str  # transformers config class, e.g. "LlamaConfig"
    architecture: str  # config.json "architectures", e.g. "LlamaForCausalLM"
    # q/k/v biases: True/False = fixed by the family (the config key is neither read nor written);
    # None = config.json's `attention_bias` decides (absent: False).
    attention_bias: bool | None = None
    o_proj_bias: bool = False  # `attention_bias` biases o_proj too
    tie_word_embeddings: bool = False  # default when the config does not say
    hidden_divisible_by_heads: bool = False  # transformers requires hidden_size % num_attention_heads == 0
    head_dim_is_hidden_over_heads: bool = False  # head_dim must equal hidden_size // num_attention_heads
    rope_types: tuple[str, ...] = ("default", "llama3", "linear")  # rope_scaling types the HF class accepts
    # Arithmetic switched on per family (see `bmrl.model.decoder`):
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys before RoPE (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + weight): Gemma's (1 + w), weights init 0
    sandwich_norms: bool = False  # norms before *and after* attention and MLP (Gemma 2/3)
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (Gemma)
    hidden_act: str = "silu"  # default MLP activation (config key `activation_key`)
    activation_key: str = "hidden_act"  # config.json key of the activation (Gemma: hidden_activation)
    # Layers with a sliding window when the config sets one and no `layer_types`: 0 = every layer
    # (Mistral); k = every layer but each k-th (Gemma 2: 2, Gemma 3: 6 global layers).
    sliding_pattern: int = 0
    rope_per_layer_type: bool = False  # rope_parameters keyed by layer type (Gemma 3: local theta)
    # Optional config.json keys the HF class has and `config_to_hf` writes (values from `ModelConfig`).
    config_keys: tuple[str, ...] = ()
    # config.json keys the decoder cannot honour: (key, the only value it runs, why).
    unsupported: tuple[tuple[str, Any, str], ...] = ()
    tensor_names: TensorNames = TensorNames()
    ignored_tensors: tuple[str, ...] = ("rotary_emb.inv_freq",)  # buffers old exports carry; skipped
    # Tokenizer tokens with ids past the embedding that text never produces (Gemma 3's image placeholder).
    tokens_past_vocab: tuple[str, ...] = ()

    def problems(self, cfg: Any) -> list[str]:
        """What `cfg` (a `ModelConfig` of this family) breaks of the family's rules, with the fix."""
        problems = []
        name, heads = self.model_type, cfg.num_attention_heads
        if self.hidden_divisible_by_heads and cfg.hidden_size % heads:
            problems.append(
                f"hidden_size={cfg.hidden_size} is not a multiple of num_attention_heads={heads} "
                f"(transformers' {self.config_class} requires it)"
            )
        if self.head_dim_is_hidden_over_heads and cfg.head_dim * heads != cfg.hidden_size:
            problems.append(
                f"{name} needs hidden_size == num_attention_heads * head_dim, got {cfg.hidden_size} != "
                f"{heads} * {cfg.head_dim}"
            )
        if self.attention_bias is not None and bool(cfg.attention_bias) != self.attention_bias:
            always = "always" if self.attention_bias else "never"
            problems.append(f"{name} {always} has q/k/v biases: set attention_bias={self.attention_bias} (or None)")
        return problems

    def default_layer_types(self, num_layers: int, sliding_window: int | None) -> tuple[str, ...]:
        """`layer_types` when config.json has none: full attention unless a window is set, then the
        family's pattern (`sliding_pattern`)."""
        def sliding(i: int) -> bool:
            return sliding_window is not None and (self.sliding_pattern == 0 or (i + 1) % self.sliding_pattern != 0)

        return tuple("sliding_attention" if sliding(i) else "full_attention" for i in range(num_layers))

    def unsupported_features(self, get: Any) -> list[str]:
        """The config keys (read with `get(key, default)`) set to values the decoder does not run."""
        def differs(value: Any, ok: Any) -> bool:
            return value != ok and not (value in (None, False) and ok in (None, False))

        return [f"{key}={get(key, ok)!r} ({why})" for key, ok, why in self.unsupported if differs(get(key, ok), ok)]


def _discover() -> Registry[Family]:
    """Every module of this package that defines `FAMILY`, by its `model_type` (two claiming one: an error)."""
    families: Registry[Family] = Registry("model family")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        family = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):
            families.add(family.model_type, family)
    return families


FAMILIES: Registry[Family] = _discover()
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(FAMILIES))


def get_family(model_type: str) -> Family | None:
    """The family of a config.json `model_type`, or None when bmrl has none."""
    return FAMILIES.get(model_type)


def supported() -> str:
    """The registered `model_type`s, for error messages ("llama, qwen2")."""
    return ", ".join(sorted(FAMILIES))
