"""Next-token sampling: greedy, temperature, top-k and top-p, one PRNG key per sequence."""

from __future__ import annotations

import dataclasses
import os
import warnings

import jax
import jax.numpy as jnp


def unroll_threefry_on_cpu() -> bool:
    """Lower JAX's threefry hash on CPU unrolled, as on every other platform (same bits: the same 20
    rounds, not rolled into a 5-step loop). The rolled loop runs its rounds as ~25 tiny ops per step:
    every PRNG call in a rollout turn (token keys, Gumbel noise, environment and injection keys) was
    ~125 dispatched ops, half of a small batch's per-turn ops (`bench/profile_turn.py`). Returns
    whether the rule was installed (False if this JAX version lacks it, with a warning that names what
    is missing: then the rolled default stays, the same bits, slower)."""
    try:
        from jax.extend.random import threefry2x32_p
        from jax.interpreters import mlir

        rule = _unrolled_threefry_rule()
    except ImportError as err:
        warnings.warn(f"bmrl.sampling: threefry stays rolled on CPU: {err}", RuntimeWarning, stacklevel=2)
        return False
    mlir.register_lowering(threefry2x32_p, rule, platform="cpu", inline=False)
    return True


_PRIVATE_RULE = "jax._src.random.threefry2x32._threefry2x32_lowering_rule"


def _unrolled_threefry_rule():
    """JAX's unrolled lowering rule of `threefry2x32_p`, the rule every platform but CPU gets: a private
    JAX name (`_PRIVATE_RULE`), the only one bmrl reads outside `bmrl.distributed._coordination`.

    No public API hands the rule out or picks CPU's threefry lowering. Checked in jax 0.10.2 (installed)
    and 0.11.0 (its released source): `jax.extend.random` exports the primitive `threefry2x32_p`, the
    hash `threefry_2x32` that binds it and `threefry_prng_impl`, no lowering rule; `jax.interpreters.mlir`
    exports `register_lowering` and `lower_fun` but no rule; the one threefry lowering flag,
    `jax_threefry_gpu_kernel_lowering`, is GPU's. Raises ImportError naming the private name when a JAX
    release moves it (this function is then the only place to change)."""
    try:
        from jax._src.random import threefry2x32  # private: no public equivalent (docstring)

        return threefry2x32._threefry2x32_lowering_rule
    except (ImportError, AttributeError) as err:
        raise ImportError(
            f"jax {jax.__version__} has no {_PRIVATE_RULE} (jax 0.10.2 and 0.11.0 have it); "
            "update bmrl.sampling._unrolled_threefry_rule for this JAX release"
        ) from err


# BMRL_ROLLED_THREEFRY=1 keeps JAX's rolled CPU lowering: the same bits, and XLA compiles it 2-3x faster
# (a compacting rollout of the test suite's tiny model: 21 s -> 7-9 s), for compile-bound runs such as
# the test suite (tests/conftest.py sets it; tests/rollout/test_engine.py checks both lowerings draw the same bits).
UNROLLED_THREEFRY = os.environ.get("BMRL_ROLLED_THREEFRY", "") != "1" and unroll_threefry_on_cpu()


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def policy_logprobs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Log-probabilities of the policy being trained: log_softmax(logits / temperature).

    Greedy decoding reports the temperature-1 policy. Top-k/top-p only filter what is sampled;
    the recorded log-probabilities are those of the unfiltered policy, as the learner computes them.
    """
    t = 1.0 if cfg.greedy else cfg.temperature
    return jax.nn.log_softmax(logits.astype(jnp.float32) / t, axis=-1)


def _filter(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """logits: [vocab] -> logits with tokens outside top-k / top-p set to -inf."""
    neg = jnp.finfo(logits.dtype).min
    if cfg.top_k:
        kth = jax.lax.top_k(logits, cfg.top_k)[0][-1]
        logits = jnp.where(logits < kth, neg, logits)
    if cfg.top_p < 1.0:
        order = jnp.argsort(-logits)
        sorted_logits = logits[order]
        probs = jax.nn.softmax(sorted_logits)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        keep_sorted = (jnp.cumsum(probs) - probs) < cfg.top_p
        keep = jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)
        logits = jnp.where(keep, logits, neg)
    return logits


def gumbel_noise(keys: jax.Array, vocab: int) -> jax.Array:
    """keys: [batch] PRNG keys -> f32 [batch, vocab]: the noise `jax.random.categorical` adds per row."""
    return jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), jnp.float32))(keys)


def argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` as int32 (the first maximum; the first NaN if any), computed as a max
    and a min over indices: two plain reductions, which XLA's CPU backend vectorizes, where argmax's
    paired (value, index) reduction ran 2.3x slower (the largest single op of a small-batch decode step)."""
    top = x.max(axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where((x == top) | jnp.isnan(x), iota, x.shape[-1]), axis=-1)


def sample_with_noise(
    noise: jax.Array | None, logits: jax.Array, cfg: SamplingConfig
) -> tuple[jax.Array, jax.Array]:
    """`sample` with its Gumbel noise `[batch, vocab]` drawn beforehand (`gumbel_noise`; None when
    greedy): a caller can draw the noise of many steps in one call. Same tokens as `sample`."""
    logp = policy_logprobs(logits, cfg)
    if cfg.greedy:
        tokens = argmax(logits)
    else:
        filtered = logp if not (cfg.top_k or cfg.top_p < 1.0) else jax.vmap(lambda lg: _filter(lg, cfg))(logp)
        tokens = argmax(filtered + noise)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


def sample(keys: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """keys: [batch] PRNG keys, logits: [batch, vocab] -> (tokens int32[batch], logprobs f32[batch]).

    Each row uses only its own key, so a sequence's samples do not depend on its batch neighbours.
    Tokens are those of `jax.random.categorical(key, filtered log-probs)` (Gumbel-max).
    """
    noise = None if cfg.greedy else gumbel_noise(keys, logits.shape[-1])
    return sample_with_noise(noise, logits, cfg)
