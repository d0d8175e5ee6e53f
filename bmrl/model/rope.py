"""Rotary position embeddings (RoPE), with the Llama-3 and linear frequency scalings.

Frequencies are a trace-time numpy constant derived from the config; positions are data, so
per-sequence offsets never change a shape.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.model.config import ModelConfig


@functools.lru_cache(maxsize=64)
def inverse_frequencies(cfg: ModelConfig, local: bool = False) -> np.ndarray:
    """`[head_dim // 2]` float32 inverse frequencies, as transformers computes them.

    `local=True`: those of a sliding-window layer, which has its own base (`rope_local_theta`,
    unscaled) when the config sets one (Gemma 3), else the global layers' own.
    """
    dim = cfg.head_dim
    separate = local and cfg.rope_local_theta is not None
    theta = cfg.rope_local_theta if separate else cfg.rope_theta
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
    if separate:
        return inv_freq
    if cfg.rope_type == "llama3":
        inv_freq = _llama3_scaling(inv_freq, cfg.rope_scaling)
    elif cfg.rope_type == "linear":
        inv_freq = (inv_freq / np.float32(cfg.rope_scaling["factor"])).astype(np.float32)
    return inv_freq


def _llama3_scaling(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    """Llama-3.1 scaling: long wavelengths divided by `factor`, short kept, a smooth ramp between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate `x: [batch, seq, heads, head_dim]` by `positions: [batch, seq]` (HF half-split layout)."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [batch, seq, head_dim/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)
