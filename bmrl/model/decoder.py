"""The decoder of every family in `bmrl.model.families` (Llama, Qwen2/3, Mistral, Gemma 2/3) in
Flax NNX, with a fixed-size KV cache.

The family's spec switches the optional pieces on: q/k RMSNorms, (1 + w) norms, sandwich norms
around attention and MLP, sqrt(hidden)-scaled embeddings, GeGLU; the config sets per-layer sliding
windows (with their own RoPE base), the score scale and tanh soft-capping of scores and logits.

Parameter paths mirror Hugging Face names (`embed_tokens`, `layers/<i>/self_attn/q_proj`,
`mlp/gate_proj`, `input_layernorm`, `norm`, `lm_head`) so partition rules and checkpoint import work
by name. Layers are a plain list (no scan): a per-layer cache, a tuple of arrays, is updated in place
under donation, where a stacked cache carried through a scan was copied every decode step.

Two entry points:
- `model(tokens, attention_mask, positions)`: full causal forward (training, scoring).
- `model.extend(tokens, lengths, offsets, cache)`: append a chunk per sequence to the KV cache at
  per-sequence offsets (prefill with chunk > 1, decode with chunk = 1); static shapes throughout.
  Attention reads the head-major cache in blocks up to the longest live row (`bmrl.model.attention`),
  so a step costs what is filled, not the buffer; `shared=` reads a prefix common to all rows once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from bmrl.model.attention import BLOCK_SIZE, attend, attend_cache, write_cache
from bmrl.model.config import ModelConfig
from bmrl.model.rope import apply_rope, inverse_frequencies

# A tuple over layers of (keys, values), each [batch, kv_heads, max_len, head_dim] (head-major: the
# attention contractions read it as stored, so a decode step neither copies nor transposes it).
KVCache = tuple[tuple[jax.Array, jax.Array], ...]


def _init(key: jax.Array, shape, dtype=None, out_sharding=None) -> jax.Array:
    """`nnx.initializers.normal(stddev=0.02)`, the draw fenced from the scaling: inside `init_model`'s one
    program XLA would fuse the two, and the values would no longer be the eager ones bit for bit."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64) if dtype is None else dtype  # jax's default float dtype
    x = jax.lax.optimization_barrier(jax.random.normal(key, shape, dtype, out_sharding=out_sharding))
    return x * jnp.array(0.02, dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square norm computed in float32, as in HF (`weight` mirrors its name); the family's
    `norm_offset` 1 scales by (1 + weight), Gemma's, with weights initialised to 0."""

    def __init__(self, dim: int, eps: float, cfg: ModelConfig):
        self.offset = cfg.family.norm_offset
        self.weight = nnx.Param(jnp.full((dim,), 1.0 - self.offset, cfg.jnp_param_dtype))
        self.eps = eps
        self.dtype = cfg.jnp_dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        weight = self.weight[...].astype(jnp.float32)
        return ((weight + self.offset if self.offset else weight) * x32).astype(self.dtype)


def _linear(cfg: ModelConfig, d_in: int, d_out: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=bias,
        dtype=cfg.jnp_dtype,
        param_dtype=cfg.jnp_param_dtype,
        kernel_init=_init,
        rngs=rngs,
    )


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int = 0):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = _linear(cfg, d, cfg.num_attention_heads * hd, cfg.attention_bias, rngs)
        self.k_proj = _linear(cfg, d, cfg.num_key_value_heads * hd, cfg.attention_bias, rngs)
        self.v_proj = _linear(cfg, d, cfg.num_key_value_heads * hd, cfg.attention_bias, rngs)
        self.o_proj = _linear(cfg, cfg.num_attention_heads * hd, d, cfg.o_proj_bias, rngs)
        if cfg.family.qk_norm:  # per head, over head_dim, before RoPE
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, cfg)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, cfg)
        self.config = cfg
        self.window = cfg.window(layer)  # static: None = full attention

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: jax.Array | None,
        cache: tuple[jax.Array, jax.Array] | None = None,
        write_index: jax.Array | None = None,
        bound: jax.Array | None = None,
        block_size: int = BLOCK_SIZE,
        shared: tuple[jax.Array, jax.Array] | None = None,
        cache_rows: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x: [batch, seq, hidden]; positions: [batch, seq] (RoPE); mask: [batch, seq, seq] (no cache).

        Without a cache the keys are this chunk's own, under `mask`. With one, the chunk's
        keys/values are first scattered into it at `write_index: [batch, seq]` (out-of-range indices
        are dropped), then each query attends to the `shared` prefix (if any) and to the cache
        positions <= its own and < `bound`, in blocks of `block_size` keys (see `attend_cache`);
        `cache_rows: int32[batch]` maps batch rows to cache rows (default: the same row).
        """
        cfg = self.config
        batch, seq, _ = x.shape
        inv_freq = inverse_frequencies(cfg, local=self.window is not None)
        q = self.q_proj(x).reshape(batch, seq, cfg.num_attention_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, seq, cfg.num_key_value_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(batch, seq, cfg.num_key_value_heads, cfg.head_dim)
        if cfg.family.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        scale, softcap = cfg.attention_scale, cfg.attn_logit_softcapping
        if cache is None:
            return self.o_proj(attend(q, k, v, mask, scale, softcap)), None
        cache = (write_cache(cache[0], k, write_index, cache_rows), write_cache(cache[1], v, write_index, cache_rows))
        cache_positions = positions if shared is None else positions - shared[0].shape[2]
        out = attend_cache(q, *cache, cache_positions, bound, block_size, shared, cache_rows, scale, softcap,
                           self.window)
        return self.o_proj(out), cache


class MLP(nnx.Module):
    """SwiGLU, down(silu(gate(x)) * up(x)), or GeGLU with the tanh GELU (`hidden_act`)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.gate_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
        self.up_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
        self.down_proj = _linear(cfg, cfg.intermediate_size, cfg.hidden_size, False, rngs)
        self.gelu = cfg.hidden_act == "gelu_pytorch_tanh"

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = self.gate_proj(x)
        gate = jax.nn.gelu(gate, approximate=True) if self.gelu else jax.nn.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm residual block. `post_attention_layernorm` is the MLP's input norm (HF's Llama
    naming); with sandwich norms (Gemma) it normalises the attention output instead, and
    `pre_feedforward_layernorm` / `post_feedforward_layernorm` wrap the MLP."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int = 0):
        self.self_attn = Attention(cfg, rngs, layer)
        self.mlp = MLP(cfg, rngs)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
        self.sandwich = cfg.family.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: jax.Array | None,
        cache: tuple[jax.Array, jax.Array] | None = None,
        write_index: jax.Array | None = None,
        bound: jax.Array | None = None,
        block_size: int = BLOCK_SIZE,
        shared: tuple[jax.Array, jax.Array] | None = None,
        cache_rows: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Attention then the MLP, each residual (arguments as in `Attention`)."""
        attn = self.self_attn(self.input_layernorm(x), positions, mask, cache, write_index, bound, block_size, shared,
                              cache_rows)
        h, cache = attn
        if self.sandwich:
            x = x + self.post_attention_layernorm(h)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))), cache
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, cache


class Decoder(nnx.Module):
    """Decoder-only causal LM. `Decoder(cfg, rngs=nnx.Rngs(seed))`; see the module docstring."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = nnx.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=cfg.jnp_dtype,
            param_dtype=cfg.jnp_param_dtype,
            embedding_init=_init,
            rngs=rngs,
        )
        self.layers = nnx.List([DecoderLayer(cfg, rngs, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
        self.lm_head = None if cfg.tie_word_embeddings else _linear(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs)

    # ------------------------------------------------------------ full forward
    def __call__(
        self,
        tokens: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """tokens: [batch, seq] int -> logits [batch, seq, vocab] float32.

        `attention_mask: [batch, seq]` (1 = real token) hides padding keys; without `positions`, a
        token's position is the number of real tokens before it, so left or right padding gives
        each sequence the logits it has alone. Logits at padding are finite but meaningless.
        """
        return self.logits(self.hidden_states(tokens, attention_mask, positions))

    def hidden_states(
        self,
        tokens: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """The final-norm hidden states `[batch, seq, hidden]` (for callers that chunk the lm_head)."""
        batch, seq = tokens.shape
        if attention_mask is None:
            attention_mask = jnp.ones((batch, seq), bool)
        attention_mask = attention_mask.astype(bool)
        if positions is None:
            positions = jnp.maximum(jnp.cumsum(attention_mask, axis=1, dtype=jnp.int32) - 1, 0)
        causal = jnp.tril(jnp.ones((seq, seq), bool))
        mask = causal[None] & attention_mask[:, None, :]
        masks = {None: mask}
        for window in {self.config.window(i) for i in range(len(self.layers))} - {None}:
            distance = positions[:, :, None] - positions[:, None, :]
            masks[window] = mask & (distance < window)  # a query sees the `window` latest positions
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x, _ = layer(x, positions, masks[self.config.window(i)])
        return self.norm(x)

    def embed(self, tokens: jax.Array) -> jax.Array:
        """Token embeddings `[batch, seq, hidden]`, times sqrt(hidden) in the compute dtype (Gemma)."""
        x = self.embed_tokens(tokens)
        if self.config.family.embed_scale:
            x = x * jnp.asarray(self.config.hidden_size**0.5, x.dtype)
        return x

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Project final-norm hidden states `[..., hidden]` to float32 logits `[..., vocab]`
        (tanh soft-capped at `final_logit_softcapping` when the config sets it)."""
        if self.lm_head is None:
            out = self.embed_tokens.attend(hidden)
        else:
            out = self.lm_head(hidden)
        return softcap_logits(out.astype(jnp.float32), self.config.final_logit_softcapping)

    # ------------------------------------------------------------ KV cache
    def init_cache(self, batch: int, max_len: int, dtype: jnp.dtype | None = None) -> KVCache:
        """Zeroed cache: per layer (keys, values), each [batch, kv_heads, max_len, head_dim]."""
        cfg = self.config
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        dtype = dtype or cfg.jnp_dtype
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_hidden_layers))

    def extend(
        self,
        tokens: jax.Array,
        lengths: jax.Array,
        offsets: jax.Array,
        cache: KVCache,
        *,
        last_only: bool = False,
        block_size: int = BLOCK_SIZE,
        shared: KVCache | None = None,
        cache_rows: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Append a chunk per sequence to the cache and return its logits.

        tokens: [batch, chunk]; lengths, offsets: [batch] int. Row b writes its first `lengths[b]`
        tokens at cache positions offsets[b] .. offsets[b] + lengths[b] - 1 (positions at or past
        max_len are dropped, never clamped; rows with length 0 change nothing). Token i of row b has
        RoPE position offsets[b] + i and attends to cache positions <= that position.
        Returns (logits [batch, chunk, vocab] float32, cache); with `last_only=True` logits are
        [batch, 1, vocab], at each row's last real token (index lengths[b] - 1, or 0 when empty).
        Attention reads the cache in blocks of `block_size` keys (static; 0 = the whole buffer) up to
        the longest live row, max(offsets + lengths): cost follows the filled context, and one
        program serves every context length. Logits at padding (i >= lengths[b]) are meaningless.
        shared: the cache `[1, kv_heads, prefix, head_dim]` of a prefix every row starts with (built
        by `extend` at batch 1); then `cache` and `offsets` count from the end of the prefix (RoPE
        position prefix + offsets[b] + i), and every row attends to the prefix, stored once.
        cache_rows: int32[batch], the cache row of each batch row (a batch that is a subset of the cache's
        rows, as the compacting rollout runs: the cache stays in place); default row b.
        """
        chunk = tokens.shape[1]
        max_len = cache[0][0].shape[2]
        steps = jnp.arange(chunk, dtype=jnp.int32)
        offsets, lengths = offsets.astype(jnp.int32), lengths.astype(jnp.int32)
        positions = offsets[:, None] + steps  # [batch, chunk]
        writes = (steps < lengths[:, None]) & (positions >= 0) & (positions < max_len)
        write_index = jnp.where(writes, positions, max_len)  # max_len = out of range -> dropped
        bound = jnp.max(jnp.where(lengths > 0, offsets + lengths, 0))
        rope_positions = positions if shared is None else positions + shared[0][0].shape[2]
        x = self.embed(tokens)
        new_cache = []
        for i, (layer, layer_cache) in enumerate(zip(self.layers, cache, strict=True)):
            layer_shared = None if shared is None else shared[i]
            x, layer_cache = layer(x, rope_positions, None, layer_cache, write_index, bound, block_size, layer_shared,
                                   cache_rows)
            new_cache.append(layer_cache)
        if last_only:
            last = jnp.clip(lengths - 1, 0, chunk - 1)
            x = jnp.take_along_axis(x, last[:, None, None], axis=1)
        return self.logits(self.norm(x)), tuple(new_cache)


def softcap_logits(logits: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(logits / cap) (Gemma 2's final-logit soft-capping); unchanged when `cap` is None."""
    return logits if cap is None else jnp.tanh(logits / cap) * cap


def init_model(cfg: ModelConfig, seed: int = 0) -> Decoder:
    """A randomly initialised decoder (HF-style init: normal(0.02) weights, unit norms, zero biases).

    Built in one jitted program per config (bitwise the eager init's values: the same draws from the same
    keys); eager, every draw, scale and fill compiled a one-op program of its own."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed))))
    try:
        hash(cfg)
    except TypeError:  # a config holding a dict (rope_scaling): a program of its own
        state = jax.jit(functools.partial(_state_of, cfg))(jax.random.key(seed))
    else:
        state = _init_state(cfg, jax.random.key(seed))
    return nnx.merge(graphdef, state)


def _state_of(cfg: ModelConfig, key: jax.Array) -> nnx.State:
    return nnx.state(Decoder(cfg, rngs=nnx.Rngs(key)))


_init_state = jax.jit(_state_of, static_argnums=0)


def num_params(model: Decoder) -> int:
    """Number of parameters (tied embeddings counted once)."""
    return sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
