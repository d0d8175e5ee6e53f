"""The decoder's configuration: one frozen dataclass, Hugging Face field names, checked on creation.

Field names follow `transformers`' LlamaConfig / Qwen2Config so a config.json maps onto it by name
(see `bmrl.model.hf`). The dataclass is hashable (it is static data of the NNX graph), so
`rope_scaling`, a dict, is hashed by its sorted items.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

from bmrl.model.families import get_family, supported

if TYPE_CHECKING:
    from bmrl.model.families import Family

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # SwiGLU, GeGLU (tanh GELU)
LAYER_TYPES = ("full_attention", "sliding_attention")
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class ConfigError(ValueError):
    """A model configuration that no decoder (or no Hugging Face model) can be built from."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder of one of the families in `bmrl.model.families`.

    `attention_bias=None` and `tie_word_embeddings=None` take the family's default (e.g. Qwen2
    always has q/k/v biases and no o_proj bias; Llama has none, and with `attention_bias=True`
    biases on q/k/v *and* o_proj, as in HF).
    `rope_scaling` is None, a Llama-3 dict (`rope_type: "llama3"`, factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings) or linear (`rope_type: "linear"`, factor).
    `param_dtype` is the storage dtype of the weights, `dtype` the compute dtype of activations and
    KV cache; logits are always float32.

    Attention per layer: `layer_types[i]` is "full_attention" or "sliding_attention" (a query sees
    the `sliding_window` latest positions, itself included); None takes the family's pattern
    (`Family.default_layer_types`: all full without a window). Sliding layers rotate with
    `rope_local_theta` (None: `rope_theta`) and unscaled frequencies when it is set (Gemma 3), with
    the global layers' otherwise. Scores are scaled by `query_pre_attn_scalar`**-0.5 (None:
    head_dim) and tanh soft-capped at `attn_logit_softcapping`; logits at `final_logit_softcapping`.
    `hidden_act=None` takes the family's (SwiGLU for Llama/Qwen/Mistral, GeGLU for Gemma).
    """

    model_type: str = "llama"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    max_position_embeddings: int = 2048
    hidden_act: str | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.head_dim is None and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        family = get_family(self.model_type)
        if self.attention_bias is None:
            object.__setattr__(self, "attention_bias", bool(family and family.attention_bias))
        if self.tie_word_embeddings is None:
            object.__setattr__(self, "tie_word_embeddings", bool(family and family.tie_word_embeddings))
        if self.hidden_act is None:
            object.__setattr__(self, "hidden_act", family.hidden_act if family else "silu")
        if self.layer_types is None and family is not None and self.num_hidden_layers > 0:
            object.__setattr__(self, "layer_types", family.default_layer_types(self.num_hidden_layers,
                                                                             self.sliding_window))
        elif self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            scaling.setdefault("rope_type", scaling.pop("type", "default"))  # legacy key name
            scaling.pop("rope_theta", None)  # transformers v5 nests theta here; ours is a field
            object.__setattr__(self, "rope_scaling", None if scaling["rope_type"] == "default" else scaling)
        for name in ("param_dtype", "dtype"):
            value = getattr(self, name)
            if not isinstance(value, str):  # accept jnp.float32 etc., store the name
                object.__setattr__(self, name, jnp.dtype(value).name)
        self.validate()

    def __hash__(self) -> int:
        items = tuple(
            tuple(sorted(v.items())) if isinstance(v, dict) else v
            for v in (getattr(self, f.name) for f in dataclasses.fields(self))
        )
        return hash(items)

    # ---------------------------------------------------------------- checks
    def validate(self) -> None:
        """Raise `ConfigError` naming every inconsistency (and what to change)."""
        problems = []
        if get_family(self.model_type) is None:
            problems.append(f"model_type={self.model_type!r} is not supported; supported: {supported()}")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)!r} must be a positive int")
        if problems:
            raise ConfigError("Invalid ModelConfig: " + "; ".join(problems) + ".")
        heads, kv_heads, head_dim = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        if heads % kv_heads:
            problems.append(
                f"num_attention_heads={heads} is not divisible by num_key_value_heads={kv_heads} "
                "(grouped-query attention shares each kv head among a whole number of query heads)"
            )
        if head_dim <= 0 or head_dim % 2:
            problems.append(f"head_dim={head_dim} must be a positive even number (rotary embeddings rotate pairs)")
        problems += self.family.problems(self)
        if self.rope_theta <= 0:
            problems.append(f"rope_theta={self.rope_theta} must be positive")
        if self.rms_norm_eps <= 0:
            problems.append(f"rms_norm_eps={self.rms_norm_eps} must be positive")
        problems += self._attention_problems()
        problems += _rope_scaling_problems(self.rope_scaling, self.family.rope_types)
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in SUPPORTED_DTYPES:
                problems.append(f"{name}={getattr(self, name)!r} must be one of {', '.join(SUPPORTED_DTYPES)}")
        if problems:
            raise ConfigError("Invalid ModelConfig: " + "; ".join(problems) + ".")

    def _attention_problems(self) -> list[str]:
        problems = []
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            problems.append(f"hidden_act={self.hidden_act!r} is not implemented; supported: "
                            f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            problems.append(f"sliding_window={self.sliding_window!r} must be a positive int or None")
        types = self.layer_types or ()
        if len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
            problems.append(f"layer_types={list(types)} must name {self.num_hidden_layers} layers, each one of "
                            f"{', '.join(LAYER_TYPES)}")
        elif "sliding_attention" in types and self.sliding_window is None:
            problems.append("layer_types has sliding_attention layers but sliding_window is None: set the window")
        for name in ("rope_local_theta", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                problems.append(f"{name}={value!r} must be positive or None")
        return problems

    # ---------------------------------------------------------------- helpers
    def window(self, layer: int) -> int | None:
        """The sliding window of layer `layer` (None: full attention)."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    @property
    def attention_scale(self) -> float:
        """The factor on q.k scores: query_pre_attn_scalar**-0.5 (Gemma), else head_dim**-0.5."""
        return (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim) ** -0.5

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling.get("rope_type", "default")

    @property
    def family(self) -> Family:
        """The `bmrl.model.families` spec of `model_type` (validated on creation)."""
        return get_family(self.model_type)

    @property
    def o_proj_bias(self) -> bool:
        """Whether o_proj has a bias: `attention_bias` in a family that biases o_proj too (Llama)."""
        return bool(self.attention_bias) and self.family.o_proj_bias

    @property
    def jnp_param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def tiny(
        cls,
        vocab_size: int = 512,
        *,
        model_type: str = "llama",
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        intermediate_size: int | None = None,
        max_position_embeddings: int = 4096,
        **overrides: Any,
    ) -> ModelConfig:
        """A small random-init config (tests, from-scratch training); `overrides` set any other field."""
        return cls(
            model_type=model_type,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size or 2 * hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            max_position_embeddings=max_position_embeddings,
            **overrides,
        )


def _rope_scaling_problems(rope_scaling: dict[str, Any] | None, family_types: tuple[str, ...]) -> list[str]:
    if rope_scaling is None:
        return []
    rope_type = rope_scaling["rope_type"]
    allowed = [t for t in SUPPORTED_ROPE_TYPES if t in family_types]
    if rope_type not in allowed:
        return [f"rope_scaling type {rope_type!r} is not supported; supported: {', '.join(allowed)}"]
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_ROPE_KEYS if k not in rope_scaling]
        if missing:
            return [f"llama3 rope_scaling lacks {', '.join(missing)}"]
        if rope_scaling["high_freq_factor"] <= rope_scaling["low_freq_factor"]:
            return ["llama3 rope_scaling needs high_freq_factor > low_freq_factor"]
    if rope_type == "linear" and not rope_scaling.get("factor", 0) > 0:
        return [f"linear rope_scaling needs a positive factor, got {rope_scaling.get('factor')!r}"]
    return []
