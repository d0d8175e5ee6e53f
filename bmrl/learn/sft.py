"""Behaviour cloning: the SFT loss and its jitted step on demonstrations in tokens (`bmrl.learn.demos`).

    step = make_sft_step(graphdef, tx, max_targets)
    params, opt_state, metrics = step(params, opt_state, demos.tokens, demos.length, demos.loss_mask)
    # LoRA: step(adapters, opt_state, ..., frozen=base) trains the adapters alone

The SFT run that uses them (demonstrations, evaluation, the policy written out) is `bmrl.sft.run_sft`.

"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bmrl.learn.demos import Demos
from bmrl.learn.logprobs import token_logprobs
from bmrl.model.lora import lora_dropout


def sft_loss(
    model, tokens: jax.Array, length: jax.Array, loss_mask: jax.Array, max_targets: int | None = None
) -> tuple[jax.Array, dict]:
    """Token-mean cross-entropy on the loss-masked tokens and the argmax accuracy there.

    tokens: [B, L], length: [B], loss_mask: [B, L] (1 on reply tokens). The model sees each row's
    first `length` tokens (padding masked); the hidden state at i predicts token i + 1 (the
    alignment of `token_logprobs`). With `max_targets` (a static bound on loss tokens per row, e.g.
    turns x reply tokens) only those positions go through the unembedding: a demo trains on a few
    dozen of its hundreds of tokens, so this skips most of the [B, L, V] logits.
    """
    attention = jnp.arange(tokens.shape[1])[None, :] < length[:, None]
    mask = loss_mask.astype(jnp.float32)
    if max_targets is None:
        logits = model(tokens, attention_mask=attention)
        logp = token_logprobs(logits, tokens)
        pred = jnp.pad(jnp.argmax(logits[:, :-1], axis=-1), ((0, 0), (1, 0)), constant_values=-1)
        target, weight = tokens, mask
    else:
        hidden = model.hidden_states(tokens, attention_mask=attention)
        # Positions of the loss tokens (row-wise, padded with position 0 and weight 0).
        pos = jax.vmap(lambda m: jnp.nonzero(m > 0, size=max_targets, fill_value=0)[0])(mask)  # [B, K]
        weight = jnp.take_along_axis(mask, pos, axis=1) * (pos > 0)
        target = jnp.take_along_axis(tokens, pos, axis=1)
        h = jnp.take_along_axis(hidden, jnp.maximum(pos - 1, 0)[..., None], axis=1)  # state before each target
        logits = model.logits(h)  # [B, K, V]
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), target[..., None], axis=-1)[..., 0]
        pred = jnp.argmax(logits, axis=-1)
    n = jnp.maximum(weight.sum(), 1.0)
    loss = -(logp * weight).sum() / n
    correct = (pred == target).astype(jnp.float32) * weight
    return loss, {"token_acc": correct.sum() / n, "tokens": weight.sum()}


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, max_targets: int | None = None) -> Callable:
    """The jitted `step(params, opt_state, tokens, length, loss_mask, frozen=None, dropout_key=None) ->
    (params, opt_state, metrics)`.

    params and opt_state are donated; `max_targets` as in `sft_loss`. `frozen`: the state that does not
    train, merged with `params` (LoRA: params are the adapters, frozen the base); `dropout_key`: the
    adapters' input dropout draws (`bmrl.model.lora.lora_dropout`; None: no dropout).
    """

    def step(params, opt_state, tokens, length, loss_mask, frozen=None, dropout_key=None):
        def loss_fn(p):
            states = (p,) if frozen is None else (p, frozen)
            with lora_dropout(dropout_key):
                return sft_loss(nnx.merge(graphdef, *states), tokens, length, loss_mask, max_targets)

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params, loss=loss)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}

    return jax.jit(step, donate_argnums=(0, 1))


def demo_stats(d: Demos) -> dict[str, float]:
    """Host summary of a demo batch: turns, cut/success rates, demonstrator error rate, length."""
    d = jax.tree.map(np.asarray, d)
    active = d.turn_active
    return {
        "demo_turns": float(d.num_turns.mean()),
        "demo_success": float(d.success.mean()),
        "demo_cut": float(d.cut.mean()),
        "demo_wrong_rate": float(d.wrong[active].mean()) if active.any() else 0.0,
        "demo_tokens": float(d.length.mean()),
        "demo_overflow": float(d.overflow.mean()),
    }


__all__ = ["demo_stats", "make_sft_step", "sft_loss"]
