"""Policy-gradient losses over policy tokens: pure functions in a registry selected by name.

Every loss has the signature

    fn(logp_new, logp_old, advantages, loss_mask, *, logp_ref=None, entropy=None, **options)
        -> (loss: [], metrics: dict[str, []])

with all per-token inputs [B, L] aligned as in `bmrl.learn.logprobs` (position i holds the
log-prob of token i). Only tokens with loss_mask = 1 (the tokens the policy sampled) count;
whatever the other positions hold (even inf or nan in logp_new) changes neither loss nor
gradient. `logp_old` is the sampling policy's (treated as a constant); `logp_ref` a frozen
reference policy's, for the KL penalty; `entropy` the current policy's per-token entropy.

    loss = pg_loss + kl_coef * kl - entropy_coef * entropy

Aggregation over tokens ("token_mean" or "seq_mean", see `aggregate`) applies to every term.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from bmrl.registry import Registry

Array = jax.Array
LossFn = Callable[..., tuple[Array, dict[str, Array]]]


AGGREGATIONS = ("token_mean", "seq_mean")  # how per-token losses are reduced (aggregate); config validation reads it


def aggregate(values: Array, mask: Array, how: str = "token_mean") -> Array:
    """Reduce per-token `values` [B, L] over the tokens where `mask` [B, L] is 1.

    - "token_mean": sum over all masked tokens / number of masked tokens in the batch (every
      token weighs the same; long sequences weigh more).
    - "seq_mean": mean over each sequence's masked tokens, then mean over the sequences with at
      least one masked token (every sequence weighs the same).
    An all-zero mask gives 0.
    """
    mask = mask.astype(jnp.float32)
    values = jnp.where(mask > 0, values, 0.0)
    if how == "token_mean":
        return (values * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    if how == "seq_mean":
        count = mask.sum(axis=1)
        per_seq = (values * mask).sum(axis=1) / jnp.maximum(count, 1.0)
        has = (count > 0).astype(jnp.float32)
        return (per_seq * has).sum() / jnp.maximum(has.sum(), 1.0)
    raise ValueError(f"unknown aggregation {how!r}; valid: 'token_mean', 'seq_mean'.")


def _k3(log_ratio: Array) -> Array:
    """k3 estimator of KL(p || q) from log(q/p) at samples of p: exp(x) - x - 1 >= 0."""
    return jnp.exp(log_ratio) - log_ratio - 1.0


def ppo_loss(
    logp_new: Array,
    logp_old: Array,
    advantages: Array,
    loss_mask: Array,
    *,
    logp_ref: Array | None = None,
    entropy: Array | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    aggregation: str = "token_mean",
    clip: bool = True,
) -> tuple[Array, dict[str, Array]]:
    """PPO clipped surrogate: per token max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)).

    r = exp(logp_new - stop_gradient(logp_old)); eps_low = clip_eps, eps_high = clip_eps_high
    (defaults to clip_eps; a larger one is the "clip-higher" variant). When logp_old equals
    logp_new the gradient is that of REINFORCE with a baseline, -A * grad logp_new. `clip=False`
    gives the unclipped importance-weighted surrogate (the "pg" loss).

    Metrics: pg_loss, kl (k3 to the reference; 0 without one), entropy (0 without one),
    clip_fraction (tokens where the clipped term is the active one), approx_kl (k3 estimate of
    KL(old || new), token mean), ratio_mean, ratio_max, num_tokens (masked tokens), loss.
    """
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    static_eps = all(isinstance(e, (int, float)) for e in (eps_low, eps_high))
    if clip and static_eps and (eps_low < 0 or eps_high < 0):
        raise ValueError(f"clip eps must be >= 0, got low={eps_low}, high={eps_high}.")
    mask = loss_mask.astype(jnp.float32)
    on = mask > 0
    adv = jnp.where(on, advantages.astype(jnp.float32), 0.0)
    log_ratio = jnp.where(on, logp_new - jax.lax.stop_gradient(logp_old), 0.0)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    if clip:
        clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
        per_token = jnp.maximum(unclipped, clipped)
        clip_active = (clipped > unclipped) & on
    else:
        per_token = unclipped
        clip_active = jnp.zeros_like(on)
    pg = aggregate(per_token, mask, aggregation)
    loss = pg

    kl = jnp.zeros((), jnp.float32)
    if logp_ref is not None:
        kl = aggregate(_k3(jnp.where(on, logp_ref - logp_new, 0.0)), mask, aggregation)
        loss = loss + kl_coef * kl
    ent = jnp.zeros((), jnp.float32)
    if entropy is not None:
        ent = aggregate(jnp.where(on, entropy, 0.0), mask, aggregation)
        loss = loss - entropy_coef * ent

    sg = jax.lax.stop_gradient
    n = jnp.maximum(mask.sum(), 1.0)
    metrics = {
        "loss": sg(loss),
        "pg_loss": sg(pg),
        "kl": sg(kl),
        "entropy": sg(ent),
        "clip_fraction": clip_active.astype(jnp.float32).sum() / n,
        "approx_kl": sg(aggregate(_k3(log_ratio), mask, "token_mean")),
        "ratio_mean": sg((ratio * mask).sum() / n),
        "ratio_max": sg(jnp.max(jnp.where(on, ratio, -jnp.inf), initial=0.0)),
        "num_tokens": mask.sum(),
    }
    return loss, metrics


def pg_loss(
    logp_new: Array,
    logp_old: Array,
    advantages: Array,
    loss_mask: Array,
    **options,
) -> tuple[Array, dict[str, Array]]:
    """Unclipped policy gradient -A * exp(logp_new - sg(logp_old)); see `ppo_loss` for options."""
    options.pop("clip_eps", None)
    options.pop("clip_eps_high", None)
    options.pop("clip", None)
    return ppo_loss(logp_new, logp_old, advantages, loss_mask, clip=False, **options)


LOSSES: Registry[LossFn] = Registry("loss", {"ppo": ppo_loss, "pg": pg_loss})


def get_loss(name: str) -> LossFn:
    """The loss registered under `name`."""
    return LOSSES.lookup(name)
