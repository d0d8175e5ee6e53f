"""Batched single-turn generation on the rollout's decode path: prompts in, tokens and log-probs out.

    out = generate(model, [[5, 7, 9], [3]], max_new_tokens=32, key=jax.random.key(0),
                   sampling=SamplingConfig(temperature=0.8, top_p=0.95), stop_tokens=(eos_id,))
    out.tokens[b, :out.lengths[b]], out.logprobs[b, :out.lengths[b]]

One compiled program per (model graph, batch, prompt width, prefix length, max_new_tokens, sampling,
stop tokens), kept in `bmrl.compiles` as "generate". Inside it: the shared prefix (system prompt,
instructions) is prefilled once at batch 1 and its cache, stored once, is read by every row (one
matrix product for all rows' queries, see `Decoder.extend(shared=)`); the prompts are
prefilled at their real lengths (right padding); then one `Decoder.extend` of a token per step in a
`lax.while_loop` that ends when every row has stopped. Attention reads only the filled cache (blocks).
The Gumbel noise of every step is drawn in one call before the loop, from each row's key folded
with the step index: the same tokens as `bmrl.sampling.sample` with those keys, a row's output
depends only on its own key and prompt, and the loop body carries no PRNG work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl.compiles import counted_jit, program
from bmrl.model.attention import BLOCK_SIZE
from bmrl.model.decoder import Decoder
from bmrl.sampling import SamplingConfig, gumbel_noise, sample_with_noise

NOISE_LIMIT = 1 << 26  # pre-draw all steps' noise when batch * steps * vocab fits (256 MiB); else per step


class Generation(NamedTuple):
    """tokens, logprobs: [batch, max_new_tokens] (pad_id / 0 after a row stops); lengths: [batch]
    generated tokens per row, its stop token included; stopped: [batch] bool, ended by a stop token.
    logprobs are the policy's, log_softmax(logits / temperature) before top-k/top-p filtering
    (`bmrl.sampling.policy_logprobs`), as the learner computes them."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    stopped: jax.Array


def generate(
    model: Decoder,
    prompts: Sequence[Sequence[int]] | jax.Array | np.ndarray,
    *,
    max_new_tokens: int,
    key: jax.Array,
    lengths: jax.Array | np.ndarray | None = None,
    sampling: SamplingConfig | None = None,
    stop_tokens: Sequence[int] = (),
    prefix: Sequence[int] = (),
    pad_id: int = 0,
    block_size: int = BLOCK_SIZE,
) -> Generation:
    """Sample up to `max_new_tokens` tokens after each prompt; see the module docstring.

    prompts: a list of token-id lists, or `[batch, width]` int right-padded with `lengths: [batch]`
    (default: all `width`). key: one PRNG key (split per row) or `[batch]` keys, one per row.
    sampling: temperature / top-k / top-p (default `SamplingConfig()`: temperature 1, no filter).
    prefix: token ids every row's context starts with, prefilled once for the batch.
    """
    sampling = sampling or SamplingConfig()
    prompts, lengths = _prompt_arrays(prompts, lengths, pad_id)
    batch, width = prompts.shape
    cfg = model.config
    stop_tokens, prefix = tuple(int(t) for t in stop_tokens), tuple(int(t) for t in prefix)
    _check(cfg.vocab_size, cfg.max_position_embeddings, prompts, lengths, prefix, stop_tokens, max_new_tokens, pad_id)
    keys = _row_keys(key, batch)
    graphdef, state = nnx.split(model)
    static = (graphdef, batch, width, len(prefix), max_new_tokens, sampling, stop_tokens, pad_id, block_size)
    run = program("generate", static, lambda: counted_jit(_make_generate(*static), name="generate"))
    prefix_arr = jnp.asarray(prefix or (pad_id,), jnp.int32)
    return run(state, jnp.asarray(prompts), jnp.asarray(lengths), prefix_arr, keys)


def _make_generate(graphdef, batch, width, n_prefix, max_new, sampling, stop_tokens, pad_id, block_size):
    """run(state, prompts [B, W], lengths [B], prefix [max(P, 1)], keys [B]) -> Generation."""
    stops = jnp.asarray(stop_tokens or (-1,), jnp.int32)

    def run(state, prompts, lengths, prefix, keys):
        model = nnx.merge(graphdef, state)
        vocab = model.config.vocab_size
        shared = None
        if n_prefix:  # once for the batch, stored once: every row attends to it (one matrix product)
            one = jnp.ones((1,), jnp.int32)
            shared = model.init_cache(1, n_prefix)
            prefix_logits, shared = model.extend(prefix[None], one * n_prefix, one * 0, shared, last_only=True,
                                                 block_size=block_size)
        cache = model.init_cache(batch, width + max_new)
        start = jnp.zeros((batch,), jnp.int32)
        logits, cache = model.extend(prompts, lengths, start, cache, last_only=True, block_size=block_size,
                                     shared=shared)
        logits = logits[:, 0]
        if n_prefix:  # an empty prompt continues the prefix
            logits = jnp.where(lengths[:, None] > 0, logits, prefix_logits[:, 0])

        step_keys = jax.vmap(lambda k: jax.vmap(lambda i: jax.random.fold_in(k, i))(jnp.arange(max_new)))(keys)
        predraw = not sampling.greedy and batch * max_new * vocab <= NOISE_LIMIT
        all_noise = jax.vmap(gumbel_noise, (1, None), 1)(step_keys, vocab) if predraw else None

        def noise_at(i):
            if sampling.greedy:
                return None
            if predraw:
                return jax.lax.dynamic_index_in_dim(all_noise, i, axis=1, keepdims=False)
            return gumbel_noise(jax.lax.dynamic_index_in_dim(step_keys, i, axis=1, keepdims=False), vocab)

        def pick(i, logits, done, out):
            tokens, logprobs, n_out = out
            token, logprob = sample_with_noise(noise_at(i), logits, sampling)
            token = jnp.where(done, pad_id, token)
            tokens = jax.lax.dynamic_update_index_in_dim(tokens, token, i, axis=1)
            logprobs = jax.lax.dynamic_update_index_in_dim(logprobs, jnp.where(done, 0.0, logprob), i, axis=1)
            live = ~done
            return token, live & jnp.isin(token, stops), done | jnp.isin(token, stops), (tokens, logprobs, n_out + live)

        out = (jnp.full((batch, max_new), pad_id, jnp.int32), jnp.zeros((batch, max_new), jnp.float32),
               jnp.zeros((batch,), jnp.int32))
        token, stopped, done, out = pick(0, logits, jnp.zeros((batch,), bool), out)
        ends = start + lengths  # where each row's next token goes

        def body(carry):
            i, token, stopped, done, ends, cache, out = carry
            live = ~done
            logits, cache = model.extend(token[:, None], live.astype(jnp.int32), ends, cache, block_size=block_size,
                                         shared=shared)
            token, new_stop, done, out = pick(i, logits[:, 0], done, out)
            return i + 1, token, stopped | new_stop, done, ends + live, cache, out

        def cond(carry):
            return (carry[0] < max_new) & ~jnp.all(carry[3])

        carry = (jnp.int32(1), token, stopped, done, ends, cache, out)
        _, _, stopped, _, _, _, (tokens, logprobs, n_out) = jax.lax.while_loop(cond, body, carry)
        return Generation(tokens, logprobs, n_out, stopped)

    return run


def _prompt_arrays(prompts, lengths, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists (right-padded to the longest) or a [batch, width] array -> (prompts, lengths)."""
    if isinstance(prompts, (jax.Array, np.ndarray)):
        arr = np.asarray(prompts)
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompts must be int [batch, width] (or a list of token lists), got {arr.dtype}{arr.shape}.")
        n = np.full(arr.shape[0], arr.shape[1]) if lengths is None else np.asarray(lengths)
        if n.shape != (arr.shape[0],):
            raise ValueError(f"lengths must be [batch] = [{arr.shape[0]}], got shape {n.shape}.")
        return arr.astype(np.int32), n.astype(np.int32)
    if lengths is not None:
        raise ValueError("lengths is only for array prompts; token lists carry their own lengths.")
    rows = [list(p) for p in prompts]
    n = np.asarray([len(r) for r in rows], np.int32)
    arr = np.full((len(rows), max(1, int(n.max(initial=0)))), pad_id, np.int32)
    for b, r in enumerate(rows):
        arr[b, : len(r)] = r
    return arr, n


def _check(vocab, max_positions, prompts, lengths, prefix, stop_tokens, max_new, pad_id) -> None:
    batch, width = prompts.shape
    problems = []
    if batch == 0:
        problems.append("no prompts: pass at least one")
    if max_new < 1:
        problems.append(f"max_new_tokens must be >= 1, got {max_new}")
    if np.any(lengths < 0) or np.any(lengths > width):
        problems.append(f"prompt lengths must be in [0, {width}] (the prompt width), got {lengths.tolist()}")
    elif not prefix and np.any(lengths == 0):
        problems.append("an empty prompt has nothing to continue: give it a token or pass a shared prefix")
    for name, ids in (("prompt", prompts[np.arange(width)[None] < lengths[:, None]]), ("prefix", prefix),
                      ("stop token", stop_tokens), ("pad_id", (pad_id,))):
        bad = [int(t) for t in np.asarray(ids, np.int64).ravel() if not 0 <= t < vocab]
        if bad:
            problems.append(f"{name} ids {bad[:5]} are outside the model's vocabulary [0, {vocab})")
    total = len(prefix) + width + max_new
    if total > max_positions:
        problems.append(f"prefix + prompt width + max_new_tokens = {total} exceeds the model's "
                        f"max_position_embeddings {max_positions}: shorten the prompts or max_new_tokens")
    if problems:
        raise ValueError("generate: " + "; ".join(problems) + ".")


def _row_keys(key: jax.Array, batch: int) -> jax.Array:
    """One typed PRNG key per row: a single key is split, [batch] keys (typed or raw [batch, 2]) kept."""
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.ndim == 0 or key.shape[-1] != 2:
            raise ValueError(f"key must be a PRNG key, e.g. jax.random.key(seed), got {key.dtype}{key.shape}.")
        key = jax.random.wrap_key_data(key.astype(jnp.uint32))
    if key.shape == ():
        return jax.random.split(key, batch)
    if key.shape != (batch,):
        raise ValueError(f"key must be one PRNG key or one per prompt ([{batch}]), got shape {key.shape}.")
    return key
