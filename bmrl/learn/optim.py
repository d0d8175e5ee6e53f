"""The optimizer: an optax chain built from config values, and a guard against non-finite steps.

    skip_nonfinite(chain(clip_by_global_norm(max_grad_norm), adamw(schedule, ...)))

With `master_f32=True` (for bfloat16 parameters) the optimizer keeps a float32 copy of the parameters
in its state (`f32_master`): gradients are cast to float32, the inner optimizer steps the copy, and
the parameters become the copy rounded to their dtype, so small updates accumulate instead of
rounding away.

`skip_nonfinite` drops an update whose gradients (or loss, passed as `loss=`) hold a nan or inf:
the returned updates are zeros and the inner optimizer state is unchanged, so parameters and
moments stay exactly as they were. It counts consecutive and total skips so the train loop can
stop after N in a row. Unlike `optax.apply_if_finite`, it never gives up and applies a
non-finite update, so a checkpoint can never hold nans.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


SCHEDULES = ("cosine", "constant")  # learning-rate schedules by name (make_schedule); config validation reads it


def make_schedule(
    lr: float,
    warmup_steps: int = 0,
    total_steps: int = 1,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.0,
) -> optax.Schedule:
    """Learning rate at update `step` (0-based).

    Linear warmup lr * step / warmup_steps for step < warmup_steps, then
    - "cosine": lr * (m + (1 - m) * (1 + cos(pi * p)) / 2), p = (step - warmup) / (total - warmup)
      clipped to [0, 1], m = min_lr_ratio (so lr at the end of warmup, lr * m from total_steps on);
    - "constant": lr.
    """
    if lr < 0 or not math.isfinite(lr):
        raise ValueError(f"lr must be a finite number >= 0, got {lr}.")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}.")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(map(repr, SCHEDULES))}.")
    if schedule == "cosine" and total_steps <= warmup_steps:
        raise ValueError(
            f"a cosine schedule needs total_steps > warmup_steps, got total_steps={total_steps}, "
            f"warmup_steps={warmup_steps}; lower warmup_steps or raise total_steps."
        )
    decay_steps = max(total_steps - warmup_steps, 1)

    def lr_at(step: Array) -> Array:
        step = jnp.asarray(step, jnp.float32)
        warm = lr * step / max(warmup_steps, 1)
        if schedule == "constant":
            after = jnp.asarray(lr, jnp.float32)
        else:
            p = jnp.clip((step - warmup_steps) / decay_steps, 0.0, 1.0)
            after = lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * p)))
        return jnp.where(step < warmup_steps, warm, after)

    return lr_at


def _is_matrix(params: Any) -> Any:
    """Weight-decay mask: decay matrices and embeddings (ndim >= 2), not biases or norm scales."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(
    lr: float,
    warmup_steps: int = 0,
    total_steps: int = 1,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    max_grad_norm: float | None = 1.0,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.0,
    *,
    decay_matrices_only: bool = True,
    skip_nonfinite_updates: bool = True,
    master_f32: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """clip_by_global_norm(max_grad_norm) -> adamw(make_schedule(...)), wrapped in `skip_nonfinite`.

    `max_grad_norm=None` (or <= 0) disables clipping. With `decay_matrices_only`, weight decay
    skips parameters with fewer than 2 dimensions (biases, norm scales). Call `update(grads,
    state, params, loss=loss)` so a non-finite loss also skips the step.
    """
    if not 0.0 <= b1 < 1.0 or not 0.0 <= b2 < 1.0:
        raise ValueError(f"b1 and b2 must be in [0, 1), got b1={b1}, b2={b2}.")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
    parts = []
    if max_grad_norm is not None and max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    parts.append(
        optax.adamw(
            make_schedule(lr, warmup_steps, total_steps, schedule, min_lr_ratio),
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=weight_decay,
            mask=_is_matrix if decay_matrices_only else None,
        )
    )
    tx = optax.chain(*parts)
    if master_f32:
        tx = f32_master(tx)
    return skip_nonfinite(tx) if skip_nonfinite_updates else optax.with_extra_args_support(tx)


def optimizer_from_config(
    optim: Any, updates: int, *, master_f32: bool = False
) -> optax.GradientTransformationExtraArgs:
    """`make_optimizer` from an `optim` config section (`train.optim`, `sft.optim`) for a run of
    `updates` optimizer updates (the schedule spans max(updates, warmup_steps + 1)): the one place a
    section becomes an optimizer, for the training loop, SFT and the tests that rebuild their programs."""
    o = optim
    return make_optimizer(o.lr, o.warmup_steps, max(updates, o.warmup_steps + 1), o.weight_decay, o.b1, o.b2,
                          o.eps, o.max_grad_norm, o.schedule, o.min_lr_ratio, master_f32=master_f32)


class F32MasterState(NamedTuple):
    """State of `f32_master`: the float32 copy of the parameters and the wrapped state (over it)."""

    master: Any
    inner_state: Any


def f32_master(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """Step a float32 copy of the parameters with `inner`; the updates make the parameters equal that
    copy rounded to their own dtype. Needs `params` in `update`. A no-op in effect for float32 params.

    The returned updates are float32 (`copy.astype(p.dtype) - p`, exact in float32 for bfloat16
    `p`), so `optax.apply_updates(params, updates)` gives exactly the rounded copy.
    """
    inner = optax.with_extra_args_support(inner)
    f32 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)  # noqa: E731

    def init(params: Any) -> F32MasterState:
        master = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), params)
        return F32MasterState(master, inner.init(master))

    def update(updates: Any, state: F32MasterState, params: Any = None, **extra_args: Any):
        if params is None:
            raise ValueError("f32_master needs the parameters: call update(grads, state, params).")
        step, inner_state = inner.update(f32(updates), state.inner_state, state.master, **extra_args)
        master = optax.apply_updates(state.master, step)
        out = jax.tree.map(lambda m, p: m.astype(p.dtype).astype(jnp.float32) - p.astype(jnp.float32), master, params)
        return out, F32MasterState(master, inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


class SkipNonFiniteState(NamedTuple):
    """State of `skip_nonfinite`: skip counters (int32 scalars) and the wrapped state."""

    consecutive_skips: Array
    total_skips: Array
    last_finite: Array
    inner_state: Any


def _all_finite(tree: Any) -> Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


_all_finite_program = None


def all_finite(tree: Any) -> Array:
    """True when every leaf of `tree` is entirely finite (a bool scalar; True for no leaves).

    On concrete (sharded) arrays it runs as one compiled program: one reduction across
    devices instead of one small collective program per leaf (which, on 8 simulated CPU devices,
    could time out in XLA's rendezvous at a checkpoint)."""
    global _all_finite_program
    leaves = jax.tree.leaves(tree)
    if not leaves or any(isinstance(x, jax.core.Tracer) for x in leaves):
        return _all_finite(tree)
    if _all_finite_program is None:  # a checkpoint utility, not one of a run's counted programs
        _all_finite_program = jax.jit(_all_finite)
    return _all_finite_program(tree)


def skip_nonfinite(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """Wrap `inner` so updates with non-finite gradients (or `loss=`) are skipped and counted.

    On a skip the updates are zeros (so `optax.apply_updates` leaves params as they are), the
    inner state (step count, moments) is unchanged, `consecutive_skips` and `total_skips` rise
    by one; a finite step resets `consecutive_skips` to 0. Other extra args go to `inner`.
    """
    inner = optax.with_extra_args_support(inner)

    def init(params: Any) -> SkipNonFiniteState:
        zero = jnp.zeros([], jnp.int32)
        return SkipNonFiniteState(zero, zero, jnp.asarray(True), inner.init(params))

    def update(
        updates: Any, state: SkipNonFiniteState, params: Any = None, *, loss: Array | None = None,
        **extra_args: Any,
    ) -> tuple[Any, SkipNonFiniteState]:
        finite = all_finite(updates)
        if loss is not None:
            finite = finite & jnp.all(jnp.isfinite(loss))

        def apply(_: None) -> tuple[Any, Any]:
            return inner.update(updates, state.inner_state, params, **extra_args)

        def skip(_: None) -> tuple[Any, Any]:  # zeros shaped like `apply`'s (f32_master returns float32)
            shapes = jax.eval_shape(apply, None)[0]
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), state.inner_state

        new_updates, inner_state = jax.lax.cond(finite, apply, skip, None)
        skipped = (~finite).astype(jnp.int32)
        return new_updates, SkipNonFiniteState(
            consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1),
            total_skips=state.total_skips + skipped,
            last_finite=finite,
            inner_state=inner_state,
        )

    return optax.GradientTransformationExtraArgs(init, update)


def skip_counts(opt_state: Any) -> dict[str, Array]:
    """{'consecutive_skips', 'total_skips'} from an optimizer state holding a SkipNonFiniteState."""
    found = [
        s
        for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, SkipNonFiniteState))
        if isinstance(s, SkipNonFiniteState)
    ]
    if not found:
        raise ValueError(
            "opt_state holds no SkipNonFiniteState; build the optimizer with "
            "make_optimizer(..., skip_nonfinite_updates=True) or wrap it in skip_nonfinite()."
        )
    return {"consecutive_skips": found[0].consecutive_skips, "total_skips": found[0].total_skips}
