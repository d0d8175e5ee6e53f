"""Bootstrap confidence intervals over tasks, for Pass@(K,T) and any per-task metric.

Tasks are the unit of resampling: a resample draws num_tasks task indices with replacement and
averages the per-task values. Drawing indices is turned into a count matrix
`weights: [resamples, num_tasks]`, so every resampled mean is one matmul, done in chunks of
resamples inside one jitted program (float64 on CPU, like the estimator). Intervals are percentile
intervals. A paired comparison resamples the same task indices for both policies, which is the
same as bootstrapping the per-task difference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.eval.passkt import _cpu_put, pass_at_kt_per_task

_CHUNK = 128  # resamples per matmul; bounds memory at CHUNK x (num_tasks + cells) floats


@dataclasses.dataclass(frozen=True)
class SurfaceInterval:
    """A Pass@(K,T) surface (or a difference of two) with its bootstrap percentile interval.

    `estimate`, `lower`, `upper`: float64 [len(ks), len(ts)].
    """

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    ks: tuple[int, ...]
    ts: tuple[int, ...]
    confidence: float
    num_resamples: int
    num_tasks: int

    def significant(self) -> np.ndarray:
        """bool [len(ks), len(ts)]: the interval excludes 0 (for differences)."""
        return (self.lower > 0) | (self.upper < 0)

    def cell(self, k: int, t: int) -> tuple[float, float, float]:
        """(estimate, lower, upper) at K=k, T=t; both must be on the grid."""
        if k not in self.ks or t not in self.ts:
            raise KeyError(f"(k={k}, T={t}) is not on the grid ks={list(self.ks)}, ts={list(self.ts)}.")
        i, j = self.ks.index(k), self.ts.index(t)
        return float(self.estimate[i, j]), float(self.lower[i, j]), float(self.upper[i, j])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: grids, [K][T] nested lists, and the interval settings."""
        return {
            "ks": list(self.ks),
            "ts": list(self.ts),
            "estimate": self.estimate.tolist(),
            "lower": self.lower.tolist(),
            "upper": self.upper.tolist(),
            "confidence": self.confidence,
            "num_resamples": self.num_resamples,
            "num_tasks": self.num_tasks,
        }


def _as_key(key: jax.Array | int) -> jax.Array:
    if isinstance(key, (int, np.integer)):
        return jax.random.key(int(key))
    return key


@partial(jax.jit, static_argnames=("num_resamples",))
def _bootstrap_kernel(values: jax.Array, key: jax.Array, quantiles: jax.Array, num_resamples: int) -> jax.Array:
    """values: [num_tasks, cells] -> [2, cells] percentiles of the resampled means."""
    num_tasks = values.shape[0]
    num_chunks = -(-num_resamples // _CHUNK)

    def one_chunk(chunk_key: jax.Array) -> jax.Array:
        idx = jax.random.randint(chunk_key, (_CHUNK, num_tasks), 0, num_tasks)
        rows = jnp.arange(_CHUNK)[:, None]
        weights = jnp.zeros((_CHUNK, num_tasks), values.dtype).at[rows, idx].add(1.0)
        return weights @ values / num_tasks  # [CHUNK, cells]

    means = jax.lax.map(one_chunk, jax.random.split(key, num_chunks))
    means = means.reshape(num_chunks * _CHUNK, -1)[:num_resamples]
    return jnp.quantile(means, quantiles, axis=0)


def _check_interval_args(num_resamples: int, confidence: float) -> None:
    if not isinstance(num_resamples, (int, np.integer)) or num_resamples < 10:
        raise ValueError(f"num_resamples must be an integer >= 10, got {num_resamples!r}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence!r}.")


def bootstrap_mean(
    per_task: np.ndarray,
    *,
    key: jax.Array | int = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lower, upper) over the task axis of `per_task: [num_tasks, ...]` (any trailing shape).

    Percentile bootstrap over tasks; use it for any per-task metric (decision accuracy, recovery).
    NaN values are not allowed: drop tasks where a metric is undefined first.
    """
    _check_interval_args(num_resamples, confidence)
    values = np.asarray(per_task, dtype=np.float64)
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError(f"per_task must be [num_tasks, ...] with num_tasks >= 1, got shape {values.shape}.")
    if not np.all(np.isfinite(values)):
        raise ValueError("per_task has NaN or infinite values; drop the tasks where the metric is undefined.")
    trailing = values.shape[1:]
    flat = values.reshape(values.shape[0], -1)
    alpha = (1.0 - confidence) / 2.0
    with jax.enable_x64(True):
        (flat_j, q) = _cpu_put(flat, np.array([alpha, 1.0 - alpha], np.float64))
        bounds = np.asarray(_bootstrap_kernel(flat_j, _as_key(key), q, int(num_resamples)))
    mean = flat.mean(axis=0)
    return mean.reshape(trailing), bounds[0].reshape(trailing), bounds[1].reshape(trailing)


def bootstrap_pass_at_kt(
    first_success_turn: np.ndarray | jax.Array,
    ks: Sequence[int] | np.ndarray,
    ts: Sequence[int] | np.ndarray,
    *,
    n_per_task: Sequence[int] | np.ndarray | None = None,
    key: jax.Array | int = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> SurfaceInterval:
    """Pass@(K,T) with a percentile bootstrap interval over tasks (see `pass_at_kt`)."""
    per_task = pass_at_kt_per_task(first_success_turn, ks, ts, n_per_task=n_per_task)
    est, lo, hi = bootstrap_mean(per_task, key=key, num_resamples=num_resamples, confidence=confidence)
    return SurfaceInterval(
        est, lo, hi, tuple(int(k) for k in np.atleast_1d(ks)), tuple(int(t) for t in np.atleast_1d(ts)),
        float(confidence), int(num_resamples), per_task.shape[0],
    )


def paired_difference(
    first_success_turn_a: np.ndarray | jax.Array,
    first_success_turn_b: np.ndarray | jax.Array,
    ks: Sequence[int] | np.ndarray,
    ts: Sequence[int] | np.ndarray,
    *,
    n_per_task_a: Sequence[int] | np.ndarray | None = None,
    n_per_task_b: Sequence[int] | np.ndarray | None = None,
    key: jax.Array | int = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> SurfaceInterval:
    """Pass@(K,T) of policy a minus policy b on the same tasks (row i of both = the same task),
    with a paired bootstrap interval: each resample uses the same task indices for both.

    The two policies may have different numbers of attempts; each uses its own unbiased estimator.
    """
    a = pass_at_kt_per_task(first_success_turn_a, ks, ts, n_per_task=n_per_task_a)
    b = pass_at_kt_per_task(first_success_turn_b, ks, ts, n_per_task=n_per_task_b)
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"paired_difference needs the same tasks in both: a has {a.shape[0]} tasks, b has "
            f"{b.shape[0]}. Match tasks by id first (row i of both must be the same task)."
        )
    est, lo, hi = bootstrap_mean(a - b, key=key, num_resamples=num_resamples, confidence=confidence)
    return SurfaceInterval(
        est, lo, hi, tuple(int(k) for k in np.atleast_1d(ks)), tuple(int(t) for t in np.atleast_1d(ts)),
        float(confidence), int(num_resamples), a.shape[0],
    )
