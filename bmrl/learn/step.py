"""The jitted policy-gradient update: advantages -> epochs x minibatches of loss + optimizer steps.

    update = make_update(graphdef, optimizer, cfg.train, temperature)
    params, opt_state, metrics = update(params, opt_state, ref_params, traj, key)

One `jax.jit` holds the whole update, PureJaxRL style:

    A = advantage estimator (registry: per group, or per turn for gigpo) [+ process_coef * process advantage]
    logp_ref = reference policy's log-probs (once, when kl_coef > 0)
    for epoch (lax.scan):                       rows permuted by fold_in(key, epoch)
        for minibatch (lax.scan):
            logp, entropy = full forward of the minibatch's tokens (logits / temperature)
            loss = loss_fn(logp, traj.logprobs, A, loss_mask, logp_ref, entropy)
            params, opt_state = optimizer step (skipped, and counted, when non-finite;
                                not taken when every advantage of the minibatch is 0)

With a history window (`rollout.history_turns`) the rows are the trajectory's per-turn samples
(`learning_rows`: batch x max turns, each turn's context and reply) in minibatches of as many rows as
without one, so memory does not grow with the turns; the played turns come first in every epoch and a
minibatch of unplayed turns runs nothing (no step, no metrics).

Memory options (cfg.remat, cfg.microbatches; see `bmrl.memory`): decoder layers recomputed in the
backward pass, and each minibatch's gradient accumulated over micro-batches (weighted so the sum
equals the minibatch's gradient). With `shardings`, the jit pins params and optimizer state to
their layouts on both sides (they come back as they went in: one compile for a whole run).

`traj.logprobs` (the sampling policy's) are the "old" log-probs, so the first minibatch of the
first epoch is exactly on-policy. `params` is the state half of `nnx.split(policy)`.

With LoRA (`frozen=True`) `params` are the adapters only and the third argument is the frozen base
(`bmrl.model.lora.split_lora`): gradients and optimizer state exist for the adapters alone, the base
is read, never written, and the KL reference is the base itself (the same forward with the adapters
zeroed), no copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bmrl.learn.advantages import (combine_advantages, get_advantage, group_has_signal, process_advantages,
                                   process_turn_values, spread_to_tokens, takes_trajectory, token_advantages)
from bmrl.learn.logprobs import chunked_token_logprobs, token_logprobs_and_entropy
from bmrl.learn.losses import get_loss
from bmrl.compiles import counted_jit
from bmrl.learn.optim import SkipNonFiniteState, all_finite, skip_counts
from bmrl.model.lora import lora_dropout
from bmrl.parallel import constrain_batch, replicated
from bmrl.rollout import Trajectory

if TYPE_CHECKING:
    from bmrl.config.schema import TrainCfg

# Above this vocabulary size the log-probs are computed from hidden states a chunk of positions at
# a time, so the full [rows, L, V] logits never exist at once.
CHUNKED_VOCAB = 8192
DROPOUT_STREAM = 0x10DA  # fold_in constant of the LoRA dropout keys (apart from the permutation keys)


def sequence_mask(length: jax.Array, width: int) -> jax.Array:
    """length: int32[B] -> bool[B, width], True on each row's first `length` positions."""
    return jnp.arange(width, dtype=jnp.int32)[None, :] < length[:, None]


def policy_token_logprobs(
    graphdef: nnx.GraphDef, params: Any, tokens: jax.Array, length: jax.Array, temperature: float,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs and entropies [B, L] of `tokens` under the policy log_softmax(logits / temperature).

    `params`: the policy's state, or a tuple of states merged together (LoRA: (adapters, base)). Matches `bmrl.sampling.policy_logprobs` (greedy, temperature 0, reports temperature 1) and the
    alignment of `bmrl.learn.token_logprobs` (position i holds log p(token i | tokens < i)).
    """
    t = 1.0 if temperature == 0 else float(temperature)
    model = nnx.merge(graphdef, *params) if isinstance(params, tuple) else nnx.merge(graphdef, params)
    if remat:
        from bmrl.memory import remat_layers  # memory (model-family side) reads the config: not imported by learn

        remat_layers(model)
    mask = sequence_mask(length, tokens.shape[1])
    if model.config.vocab_size > CHUNKED_VOCAB:
        hidden = model.hidden_states(tokens, attention_mask=mask)
        unembed = model.embed_tokens.embedding[...].T if model.lm_head is None else model.lm_head.kernel[...]
        cap = model.config.final_logit_softcapping
        if cap is not None:
            return chunked_token_logprobs(hidden, unembed.astype(jnp.float32), tokens, softcap=cap, temperature=t)
        return chunked_token_logprobs(hidden, unembed.astype(jnp.float32) / t, tokens)
    logits = model(tokens, attention_mask=mask)
    return token_logprobs_and_entropy(logits / t, tokens)


def compute_advantages(traj: Trajectory, cfg: TrainCfg) -> jax.Array:
    """Token advantages of the rows the learner trains on (`learning_rows`): the estimator `cfg.advantage`
    over groups of `cfg.group_size` contiguous rows (an outcome estimator reads `traj.outcome_reward`, a
    trajectory one such as gigpo the whole trajectory and gives each turn its own), plus
    `cfg.process_coef` x progress-delta process advantages (discount `cfg.gamma`). [B, L]; with a history
    window [B * Tm, L], turn t of sequence b's sample getting that turn's advantage."""
    estimator = get_advantage(cfg.advantage)
    if traj.turn_samples is not None:
        return _turn_sample_advantages(traj, cfg, estimator)
    if takes_trajectory(estimator):
        adv = spread_to_tokens(estimator(traj, cfg.group_size, **cfg.advantage_options), traj.turn_of_token,
                               traj.loss_mask)
    else:
        seq_adv = estimator(traj.outcome_reward, cfg.group_size, **cfg.advantage_options)
        adv = token_advantages(seq_adv, traj.loss_mask)
    if cfg.process_coef:
        proc = process_advantages(
            traj.progress, traj.turn_active, traj.turn_of_token, traj.loss_mask, gamma=cfg.gamma
        )
        adv = combine_advantages(adv, proc, cfg.process_coef)
    return adv


def _turn_sample_advantages(traj: Trajectory, cfg: TrainCfg, estimator) -> jax.Array:
    """`compute_advantages` of a windowed trajectory: each turn's advantage [B, Tm] (the sequence's own for
    an outcome estimator) on its sample's reply tokens -> [B * Tm, L]."""
    if takes_trajectory(estimator):
        values = estimator(traj, cfg.group_size, **cfg.advantage_options)
    else:
        seq_adv = estimator(traj.outcome_reward, cfg.group_size, **cfg.advantage_options)
        values = jnp.broadcast_to(seq_adv[:, None], traj.turn_active.shape)
    if cfg.process_coef:
        values = values + cfg.process_coef * process_turn_values(traj.progress, traj.turn_active, gamma=cfg.gamma)
    rows = traj.turn_samples.rows()
    return values.reshape(-1)[:, None].astype(jnp.float32) * rows.loss_mask


def learning_rows(traj: Trajectory) -> dict[str, jax.Array]:
    """The sequences the learner trains on: the trajectory's rows, or with a history window each played turn
    as its own row (`TurnSamples.rows`: row b * Tm + t). tokens, loss_mask, logprobs: [N, L]; length: [N]."""
    src = traj if traj.turn_samples is None else traj.turn_samples.rows()
    return dict(tokens=src.tokens, length=src.length, loss_mask=src.loss_mask, logp_old=src.logprobs)


def make_update(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformationExtraArgs, cfg: TrainCfg,
                temperature: float, *, donate: bool = True, shardings: tuple[Any, Any] | None = None,
                frozen: bool = False, dropout: float = 0.0):
    """Build the jitted `update(params, opt_state, ref_params, traj, key) -> (params, opt_state, metrics)`.

    cfg: a `TrainCfg` (advantage, group_size, process_coef, gamma, loss, epochs, minibatches,
    clip_eps, kl_coef, entropy_coef, aggregation). `ref_params` is None (no KL term) or a frozen
    policy's params. `optimizer` must be wrapped in `skip_nonfinite` (as `make_optimizer` does):
    non-finite minibatch steps are skipped and counted. With `donate`, the params and optimizer
    state buffers passed in are reused for the outputs (do not use them after the call).
    `shardings=(params_shardings, opt_state_shardings)` (`bmrl.parallel.param_shardings` /
    `state_shardings`) pins both on the way in and out; the batch is pinned along (data, fsdp).
    With `frozen` (LoRA) the call is `update(adapters, opt_state, base, traj, key)`: `base` is the
    frozen rest of the policy (required; the KL reference when kl_coef > 0) and `dropout` the adapters'
    input dropout rate (keys from (key, epoch, row)).
    Compiled as the program "train_step" of `bmrl.compiles`; `update.trace_count()` counts its traces.
    """
    loss_fn = get_loss(cfg.loss)
    loss_opts = dict(kl_coef=cfg.kl_coef, entropy_coef=cfg.entropy_coef, aggregation=cfg.aggregation,
                     clip_eps=cfg.clip_eps, **cfg.loss_options)  # a loss takes what it uses
    epochs, minibatches, micro, remat = int(cfg.epochs), int(cfg.minibatches), int(cfg.microbatches), bool(cfg.remat)
    mesh = None if shardings is None else jax.tree.leaves(shardings[0])[0].mesh

    def update(params, opt_state, ref_params, traj: Trajectory, key):
        batch = traj.tokens.shape[0]
        if batch % minibatches:
            raise ValueError(f"train.minibatches={minibatches} does not divide the batch of {batch} rows.")
        mb = batch // minibatches
        if mb % micro:
            raise ValueError(f"train.microbatches={micro} does not divide the minibatch of {mb} rows "
                             f"(batch {batch} / train.minibatches {minibatches}); pick a divisor of {mb}.")
        if frozen and ref_params is None:
            raise ValueError("make_update(frozen=True): pass the frozen base as the third argument.")
        if mesh is not None:
            traj = constrain_batch(traj, mesh)
            if ref_params is not None and not frozen:  # (the frozen base keeps the layout it was placed with)
                ref_params = jax.lax.with_sharding_constraint(ref_params, shardings[0])
        rows = dict(learning_rows(traj), adv=compute_advantages(traj, cfg))
        n_rows = rows["tokens"].shape[0]  # the batch, or with a history window batch x max turns samples
        use_ref = ref_params is not None and cfg.kl_coef > 0
        if use_ref:  # LoRA: the base alone (adapters zeroed: exactly the base's outputs)
            ref = (jax.tree.map(jnp.zeros_like, params), ref_params) if frozen else ref_params

            def ref_logprobs(tokens, length):
                return policy_token_logprobs(graphdef, ref, tokens, length, temperature)[0]

            if n_rows == batch:
                logp_ref = ref_logprobs(rows["tokens"], rows["length"])
            else:  # per-turn samples: a minibatch of rows at a time, so memory does not grow with the turns
                chunks = jax.tree.map(lambda x: x.reshape((n_rows // mb, mb) + x.shape[1:]), (rows["tokens"], rows["length"]))
                logp_ref = jax.lax.map(lambda r: ref_logprobs(*r), chunks).reshape(rows["tokens"].shape)
            rows["logp_ref"] = jax.lax.stop_gradient(logp_ref)
        drop_key = jax.random.fold_in(key, DROPOUT_STREAM) if frozen and dropout else None

        def loss_of(p, data):
            weights = (p, ref_params) if frozen else p
            with lora_dropout(None if drop_key is None else jax.random.fold_in(drop_key, data["draw"][0])):
                logp, ent = policy_token_logprobs(graphdef, weights, data["tokens"], data["length"], temperature,
                                                  remat)
            if not cfg.entropy_coef:
                ent = jax.lax.stop_gradient(ent)
            loss, m = loss_fn(logp, data["logp_old"], data["adv"], data["loss_mask"],
                              logp_ref=data.get("logp_ref"), entropy=ent, **loss_opts)
            return loss, m

        def grads_of(p, data):
            if micro == 1:
                (loss, m), grads = jax.value_and_grad(loss_of, has_aux=True)(p, data)
                return loss, m, grads
            return accumulate_grads(loss_of, p, data, micro, cfg.aggregation)

        per_turn = n_rows != batch  # a history window: a row per turn, the turns no row played empty
        played = rows["loss_mask"].sum(axis=-1) > 0  # [N]

        def minibatch_step(carry, xs):
            (p, s), (idx, epoch) = carry, xs
            data = jax.tree.map(lambda x: x[idx], rows)
            if drop_key is not None:  # one dropout key per (epoch, first row of each micro-batch)
                data["draw"] = epoch * n_rows + idx
            if per_turn:  # a minibatch of unplayed turns only (they come last) computes nothing and takes no step
                ran = jnp.any(played[idx])
                none = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(grads_of, p, data))
                loss, m, grads = jax.lax.cond(ran, lambda: grads_of(p, data), lambda: none)
                m = dict(m, ran=ran)
            else:
                loss, m, grads = grads_of(p, data)
            grad_norm = optax.tree.norm(grads)
            updates, s_new = optimizer.update(grads, s, p, loss=loss)
            signal = signal_of(data["adv"])
            p, s = keep_finite(p, s, optax.apply_updates(p, updates), s_new, loss, grad_norm, signal)
            ran = m.get("ran", True)  # (a minibatch that ran nothing is no step: neither skipped nor without signal)
            m = dict(m, grad_norm=grad_norm, skipped=(skip_counts(s)["consecutive_skips"] > 0) & ran,
                     no_signal=~signal & ran, touched=jnp.zeros((n_rows,), jnp.int32).at[idx].add(1))
            return (p, s), m

        def epoch_step(carry, epoch):
            perm = jax.random.permutation(jax.random.fold_in(key, epoch), n_rows)
            if per_turn:  # the played turns first, in the permutation's order
                perm = perm[jnp.argsort(~played[perm], stable=True)]
            steps = n_rows // mb  # train.minibatches, or per-turn samples in minibatches of as many rows
            return jax.lax.scan(minibatch_step, carry, (perm.reshape(steps, mb), jnp.full(steps, epoch)))

        (params, opt_state), ms = jax.lax.scan(epoch_step, (params, opt_state), jnp.arange(epochs))
        counts = skip_counts(opt_state)
        touched = ms.pop("touched").sum(axis=(0, 1))  # [N] times each row was trained on
        skipped = ms.pop("skipped")
        no_signal = ms.pop("no_signal")
        if per_turn:  # means over the minibatches that ran; every played turn counts, the unplayed ones not
            ran = ms.pop("ran").astype(jnp.float32)
            metrics = {k: jnp.sum(v * ran) / jnp.maximum(ran.sum(), 1.0) for k, v in ms.items()}
            touched = jnp.where(played, touched, jnp.iinfo(jnp.int32).max)
        else:
            metrics = {k: jnp.mean(v) for k, v in ms.items()}  # mean over epochs x minibatches
        metrics.update(
            ratio_max=jnp.max(ms["ratio_max"]),
            num_tokens=jnp.sum(ms["num_tokens"]) / epochs,
            skipped_updates=skipped.sum().astype(jnp.int32),  # non-finite minibatch steps skipped here
            no_signal_updates=no_signal.sum().astype(jnp.int32),  # minibatch steps with every advantage 0: not taken
            groups_with_signal=groups_with_signal(traj.outcome_reward, cfg.group_size),
            skipped_total=counts["total_skips"],
            consecutive_skips=counts["consecutive_skips"],
            rows_trained_min=touched.min(),
            adv_mean=jnp.sum(rows["adv"]) / jnp.maximum(rows["loss_mask"].sum(), 1.0),
            adv_abs_mean=jnp.sum(jnp.abs(rows["adv"])) / jnp.maximum(rows["loss_mask"].sum(), 1.0),
            reward_mean=traj.outcome_reward.mean(),
        )
        return params, opt_state, metrics

    pinned = {}
    if shardings is not None:
        pinned = dict(in_shardings=(shardings[0], shardings[1], None, None, None),
                      out_shardings=(shardings[0], shardings[1], replicated(mesh)))
    return counted_jit(update, name="train_step", donate_argnums=(0, 1) if donate else (), **pinned)


# Loss metrics that are means over tokens (weighted by token counts across micro-batches), the one
# that is a max and the one that is a count; the rest are the loss terms (weighted like the loss).
_TOKEN_MEAN_METRICS = ("clip_fraction", "approx_kl", "ratio_mean")


def accumulate_grads(loss_of, params: Any, data: dict, micro: int, aggregation: str):
    """(loss, metrics, grads) of `loss_of(params, data)` over the whole minibatch `data`, computed
    `micro` rows-blocks at a time (gradient accumulation, a `lax.scan`): micro-batch i weighs
    n_i / N, its share of the masked tokens ("token_mean") or of the sequences with any ("seq_mean"),
    which makes the weighted sum equal the full minibatch's loss and gradient."""
    parts = jax.tree.map(lambda x: x.reshape(micro, x.shape[0] // micro, *x.shape[1:]), data)
    mask = parts["loss_mask"].astype(jnp.float32)  # [micro, rows, L]
    tokens = mask.sum(axis=(1, 2))
    units = tokens if aggregation == "token_mean" else (mask.sum(axis=2) > 0).sum(axis=1).astype(jnp.float32)
    weight = units / jnp.maximum(units.sum(), 1.0)
    token_weight = tokens / jnp.maximum(tokens.sum(), 1.0)

    def one(acc, part_w):
        part, w = part_w
        (loss, m), g = jax.value_and_grad(loss_of, has_aux=True)(params, part)
        return jax.tree.map(lambda a, x: a + w * x.astype(jnp.float32), acc, g), (loss, m)

    zero = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
    acc, (losses, ms) = jax.lax.scan(one, zero, (parts, weight))
    grads = jax.tree.map(lambda a, p: a.astype(p.dtype), acc, params)
    metrics = {}
    for k, v in ms.items():
        if k == "ratio_max":
            metrics[k] = v.max()
        elif k == "num_tokens":
            metrics[k] = v.sum()
        else:
            metrics[k] = jnp.sum((token_weight if k in _TOKEN_MEAN_METRICS else weight) * v)
    return jnp.sum(weight * losses), metrics, grads


def keep_finite(params: Any, state: Any, new_params: Any, new_state: Any, loss: jax.Array,
                grad_norm: jax.Array, signal: jax.Array | bool = True) -> tuple[Any, Any]:
    """The step's (params, state): (new_params, new_state) when the minibatch has `signal` and the loss, the
    gradients' global norm and every new parameter and optimizer-state value are finite; (params, state) when it
    has no signal; else (params, state) with the skip counted in `state` (a `SkipNonFiniteState`), signal or not.

    Non-finite: `skip_nonfinite` sees only the gradients; this also catches an update that overflows after them
    (a huge learning rate, Adam's squared gradients), in one fused check.

    No signal (`signal` = any advantage non-zero, `signal_of`): a minibatch whose group rewards are all equal
    changes nothing. Without this guard Adam still steps on a zero gradient: its bias-corrected update
    m_hat / sqrt(v_hat) decays roughly as b1^k * sqrt(k + 1) after the last real step and does not depend on
    that step's size, so the weights keep moving in its direction, 5.0 real steps' worth in all at Adam's
    defaults (4.4 in the first 20 empty steps), while nothing in the batch asks for it
    (docs/training_stability.md). The moments and Adam's step count stay as they were too, so the next batch
    with signal is stepped as if the empty ones had not happened. A KL or entropy term alone is not signal.

    One elementwise select per value, not a `lax.cond` over the whole (params, state): XLA kept a copy of the
    new values in temporaries for each such cond (two in a row: 6x the parameters' bytes beside the donated
    inputs at Qwen2.5-0.5B's widths, compiled on CPU); a select fuses into the update's own output."""
    if not isinstance(state, SkipNonFiniteState):
        raise ValueError("the optimizer state must be a SkipNonFiniteState: build the optimizer with "
                         "make_optimizer() or wrap it in skip_nonfinite().")
    signal = jnp.asarray(signal, bool)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & (~signal | all_finite((new_params, new_state)))
    kept = state._replace(consecutive_skips=jnp.where(ok, state.consecutive_skips, state.consecutive_skips + 1),
                          total_skips=jnp.where(ok, state.total_skips, state.total_skips + 1),
                          last_finite=jnp.where(ok, state.last_finite, False))
    take = signal & ok

    def pick(new, old):
        return jax.tree.map(lambda n, o: jnp.where(take, n, o), new, old)

    return pick(new_params, params), pick(new_state, kept)


def signal_of(adv: jax.Array) -> jax.Array:
    """bool[]: the minibatch carries signal, some advantage is non-zero (`keep_finite`)."""
    return jnp.any(adv != 0)


def groups_with_signal(rewards: jax.Array, group_size: int) -> jax.Array:
    """rewards: [B] (task-major groups of `group_size`) -> int32: the groups whose rewards are not all
    equal, the only ones an outcome advantage can learn from."""
    return jnp.sum(group_has_signal(rewards, group_size)).astype(jnp.int32)


def init_opt_state(optimizer: optax.GradientTransformation, params: Any) -> Any:
    """`optimizer.init(params)` with every leaf in its own buffer, so the state can be donated
    (optax states may share one zeros array between counters, which donation refuses)."""
    return jax.tree.map(jnp.copy, optimizer.init(params))


def consecutive_skips(opt_state: Any) -> int:
    """Host int: non-finite updates in a row at the end of `opt_state` (0 when the last was finite)."""
    return int(skip_counts(opt_state)["consecutive_skips"])


__all__ = [
    "CHUNKED_VOCAB",
    "SkipNonFiniteState",
    "accumulate_grads",
    "compute_advantages",
    "consecutive_skips",
    "groups_with_signal",
    "init_opt_state",
    "keep_finite",
    "learning_rows",
    "make_update",
    "policy_token_logprobs",
    "sequence_mask",
    "signal_of",
]
