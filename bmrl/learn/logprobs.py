"""Per-token log-probabilities and entropies of a causal LM, aligned with the tokens.

Alignment (the same as `Trajectory.logprobs`): the model's logits at position i predict token
i + 1, so for tokens: [B, L]

    out[:, i] = log p(tokens[:, i] | tokens[:, :i])   for i >= 1,   out[:, 0] = 0,

i.e. out[:, i] is computed from logits[:, i - 1]. Entropies use the same shift: ent[:, i] is the
entropy of the distribution that token i was drawn from (from logits[:, i - 1]), ent[:, 0] = 0.
Everything is computed in float32 with `log_softmax` for numerical stability.

`chunked_token_logprobs` computes the same from hidden states and the unembedding matrix a chunk
of positions at a time, so the full [B, L, V] logits never exist at once (large vocabularies);
each chunk is rematerialised in the backward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _shift_right(x: Array) -> Array:
    """[B, L-1, ...] predictions of tokens 1..L-1 -> [B, L, ...] with zeros at position 0."""
    pad = [(0, 0)] * x.ndim
    pad[1] = (1, 0)
    return jnp.pad(x, pad)


def _logprob_entropy(logits: Array, targets: Array) -> tuple[Array, Array]:
    """logits: [B, C, V] (any dtype), targets: [B, C] -> (log p(target), entropy), both [B, C]."""
    logp_all = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def token_logprobs(logits: Array, tokens: Array) -> Array:
    """log p(tokens[:, i] | tokens[:, :i]) from logits: [B, L, V], tokens: [B, L] -> [B, L] f32."""
    return token_logprobs_and_entropy(logits, tokens)[0]


def token_entropy(logits: Array) -> Array:
    """Entropy of the distribution each token was drawn from; logits: [B, L, V] -> [B, L] f32."""
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return _shift_right(-jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1))


def token_logprobs_and_entropy(logits: Array, tokens: Array) -> tuple[Array, Array]:
    """Both of the above from one log_softmax: ([B, L], [B, L]) float32, zero at position 0."""
    if logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"logits [B, L, V] and tokens [B, L] disagree: {logits.shape} vs {tokens.shape}."
        )
    logp, entropy = _logprob_entropy(logits[:, :-1], tokens[:, 1:])
    return _shift_right(logp), _shift_right(entropy)


def chunked_token_logprobs(
    hidden: Array, unembed: Array, tokens: Array, *, chunk_size: int = 128, softcap: float | None = None,
    temperature: float = 1.0,
) -> tuple[Array, Array]:
    """Log-probs and entropies from hidden states, `chunk_size` positions at a time.

    hidden: [B, L, D] (final-norm output), unembed: [D, V] (for tied embeddings pass
    `embedding.T`), tokens: [B, L] -> (logprobs [B, L], entropy [B, L]), float32, with the
    alignment of `token_logprobs`. Peak memory holds [B, chunk_size, V] logits instead of
    [B, L, V]; `jax.checkpoint` recomputes each chunk in the backward pass.
    """
    if hidden.ndim != 3 or unembed.ndim != 2 or hidden.shape[-1] != unembed.shape[0]:
        raise ValueError(
            f"need hidden [B, L, D] and unembed [D, V]; got {hidden.shape} and {unembed.shape} "
            "(for a tied embedding table [V, D] pass its transpose)."
        )
    if hidden.shape[:2] != tokens.shape:
        raise ValueError(
            f"hidden [B, L, D] and tokens [B, L] disagree: {hidden.shape} vs {tokens.shape}."
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    batch, length, dim = hidden.shape
    n = length - 1  # positions 0..L-2 predict tokens 1..L-1
    num_chunks = max(1, -(-n // chunk_size))
    padded = num_chunks * chunk_size
    h = jnp.pad(hidden[:, :-1], ((0, 0), (0, padded - n), (0, 0)))
    t = jnp.pad(tokens[:, 1:], ((0, 0), (0, padded - n)))
    h = h.reshape(batch, num_chunks, chunk_size, dim).swapaxes(0, 1)
    t = t.reshape(batch, num_chunks, chunk_size).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(xs: tuple[Array, Array]) -> tuple[Array, Array]:
        h_c, t_c = xs
        logits = jnp.einsum("bcd,dv->bcv", h_c, unembed, preferred_element_type=jnp.float32)
        if softcap is not None:  # the model's final-logit soft-capping (Gemma 2), then the temperature
            logits = jnp.tanh(logits / softcap) * softcap / temperature
        return _logprob_entropy(logits, t_c)

    logp, entropy = jax.lax.map(one_chunk, (h, t))  # [num_chunks, B, chunk]
    logp = logp.swapaxes(0, 1).reshape(batch, padded)[:, :n]
    entropy = entropy.swapaxes(0, 1).reshape(batch, padded)[:, :n]
    return _shift_right(logp), _shift_right(entropy)
