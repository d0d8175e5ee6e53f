"""The one bootstrap of bmrl: intervals for Pass@(K,T) surfaces, the decomposition and the findings.

Units and levels. A unit is a row of per-unit values (a task, or a (seed, task) pair). Without
`groups` (or with one group) a resample draws the units with replacement: the ordinary one-level
bootstrap over tasks. With `groups: int[units]` (e.g. the training seed that produced each row) it
is two-level: each resample draws the groups with replacement, then, inside every drawn group, that
group's units with replacement ("resample seeds, then tasks within seed"; Davison & Hinkley 1997,
sec. 3.8). Its variance then includes the seed-to-seed spread, which a pooled one-level bootstrap
over (seed, task) units leaves out. For the mean of G groups of n units each it is exactly

    (1/G) [ (1/G) sum_g (m_g - m)^2 + (1/(G n)) sum_g s2_g ]     (m_g, s2_g: mean, plug-in variance of group g)

(tested against this). The point estimate is the plain mean over units (groups weigh by their size).

A resample is an index array `idx: [resamples, drawn]` (rows drawn, ragged groups masked); means
are `counts @ values / drawn` with `counts: [resamples, units]`, computed in chunks of resamples so
memory stays bounded (about `_CELLS` numbers per chunk) for logs of any size. Statistics that are
not means (a min over T of a mean curve, a difference of areas) go through `bootstrap_stat`, which
applies a function to the resampled rows.

Paired comparisons: the draws depend only on (key, number of units, groups), so two policies on the
same units get the same resamples; the paired difference is the bootstrap of the per-unit
difference, and a policy against itself gives exactly 0 with a zero-width interval. Intervals are
percentile intervals; draws come from numpy's PCG64 seeded by an int key (a jax key is accepted and
turned into one), so the same key gives the same numbers on every machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

MIN_UNITS_FOR_SIGNIFICANCE = 10  # below this many tasks an interval is reported but never called significant
_CELLS = 1 << 21  # numbers drawn per chunk of resamples (16 MiB of int64 indices)


def significant(lower: Any, upper: Any, num_tasks: int) -> Any:
    """The one significance rule: the interval excludes 0 and rests on at least
    MIN_UNITS_FOR_SIGNIFICANCE tasks (a bootstrap over fewer has too few distinct resamples)."""
    return ((np.asarray(lower) > 0) | (np.asarray(upper) < 0)) & (num_tasks >= MIN_UNITS_FOR_SIGNIFICANCE)


@dataclasses.dataclass(frozen=True)
class Interval:
    """One number with its bootstrap percentile interval: every interval a report shows is one of these.

    `num_tasks`: the tasks (or (seed, task) units, or probe states) the estimate rests on; 0 = none
    (the measure is undefined). It formats itself (`format`, `str`) and knows the significance rule
    (`above_zero`, `below_zero`, `significant`), so every sentence, table and verdict says it alike."""

    mean: float
    lower: float
    upper: float
    num_tasks: int

    @property
    def defined(self) -> bool:
        return self.num_tasks > 0 and bool(np.isfinite(self.mean))

    @property
    def trusted(self) -> bool:
        """Enough tasks for the interval to decide anything (MIN_UNITS_FOR_SIGNIFICANCE)."""
        return self.defined and self.num_tasks >= MIN_UNITS_FOR_SIGNIFICANCE

    @property
    def above_zero(self) -> bool:
        return self.trusted and self.lower > 0

    @property
    def below_zero(self) -> bool:
        return self.trusted and self.upper < 0

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and rests on enough tasks (`significant`)."""
        return self.defined and bool(significant(self.lower, self.upper, self.num_tasks))

    def format(self, signed: bool = False) -> str:
        """'0.512 [0.401, 0.618]' ('+0.141 [+0.047, +0.219]' when `signed`, for differences); 'n/a' when undefined."""
        if not self.defined:
            return "n/a"
        f = "{:+.3f}" if signed else "{:.3f}"
        return f"{f.format(self.mean)} [{f.format(self.lower)}, {f.format(self.upper)}]"

    def __str__(self) -> str:
        return self.format() if self.defined else "n/a (no task)"

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, x: Any) -> Interval:
        """An Interval from an Interval or a mapping with mean, lower, upper (and num_tasks; None = NaN)."""
        if isinstance(x, Interval):
            return x
        if isinstance(x, Mapping):
            num = lambda v: float("nan") if v is None else float(v)  # noqa: E731 (JSON null = undefined)
            return cls(num(x["mean"]), num(x["lower"]), num(x["upper"]), int(x.get("num_tasks", 0)))
        raise TypeError(f"an interval needs mean, lower, upper (an Interval or a dict), got {type(x).__name__}.")


NAN_INTERVAL = Interval(float("nan"), float("nan"), float("nan"), 0)


def mean_interval(per_task: np.ndarray, *, groups: Sequence[int] | np.ndarray | None = None, key: Any = 0,
                  num_resamples: int = 1000, confidence: float = 0.95) -> Interval:
    """The mean of `per_task: [units]` over the units where it is defined (NaN left out), with its
    interval (two levels with `groups`, the seed of each unit); NAN_INTERVAL when none is defined."""
    v = np.asarray(per_task, np.float64).reshape(-1)
    ok = np.isfinite(v)
    if not ok.any():
        return NAN_INTERVAL
    g = None if groups is None else np.asarray(groups).reshape(-1)[ok]
    m, lo, hi = bootstrap_mean(v[ok], groups=g, key=key, num_resamples=num_resamples, confidence=confidence)
    return Interval(float(m), float(lo), float(hi), int(ok.sum()))


@dataclasses.dataclass(frozen=True)
class SurfaceInterval:
    """A Pass@(K,T) surface (or a difference of two) with its bootstrap percentile interval.

    `estimate`, `lower`, `upper`: float64 [len(ks), len(ts)]. `num_groups`: training seeds
    resampled at the top level (1 = one-level bootstrap over tasks).
    """

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    ks: tuple[int, ...]
    ts: tuple[int, ...]
    confidence: float
    num_resamples: int
    num_tasks: int
    num_groups: int = 1

    @property
    def can_be_significant(self) -> bool:
        """False with fewer than MIN_UNITS_FOR_SIGNIFICANCE tasks or without resamples."""
        return self.num_tasks >= MIN_UNITS_FOR_SIGNIFICANCE and self.num_resamples > 0

    def significance_note(self) -> str | None:
        """Why no cell is called significant, or None when cells can be."""
        if self.num_resamples == 0:
            return "no difference is called significant: intervals were switched off (0 resamples)."
        if self.num_tasks < MIN_UNITS_FOR_SIGNIFICANCE:
            return (
                f"no difference is called significant: only {self.num_tasks} task(s), fewer than "
                f"{MIN_UNITS_FOR_SIGNIFICANCE}. A bootstrap over so few tasks has few distinct resamples and "
                "its intervals are too narrow to trust (with identical tasks they have zero width); log more tasks."
            )
        return None

    def significant(self) -> np.ndarray:
        """bool [len(ks), len(ts)]: the interval excludes 0 (for differences) and there are enough tasks
        (the rule of `Interval.significant`), with resamples."""
        return significant(self.lower, self.upper, self.num_tasks) & (self.num_resamples > 0)

    def cell(self, k: int, t: int) -> tuple[float, float, float]:
        """(estimate, lower, upper) at K=k, T=t; both must be on the grid."""
        if k not in self.ks or t not in self.ts:
            raise KeyError(f"(k={k}, T={t}) is not on the grid ks={list(self.ks)}, ts={list(self.ts)}.")
        i, j = self.ks.index(k), self.ts.index(t)
        return float(self.estimate[i, j]), float(self.lower[i, j]), float(self.upper[i, j])

    def interval(self, k: int, t: int) -> Interval:
        """The cell at K=k, T=t as an `Interval` (over this surface's tasks)."""
        return Interval(*self.cell(k, t), self.num_tasks)

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
            "num_groups": self.num_groups,
        }


# ---- draws --------------------------------------------------------------------------------------


def _seed(key: Any) -> int:
    """An int seed for numpy from an int or a jax PRNG key."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key)
    try:
        import jax

        data = np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
    except (AttributeError, TypeError) as err:
        raise TypeError(f"key must be an int or a jax PRNG key, got {type(key).__name__}.") from err
    return int.from_bytes(data.astype(np.uint32).tobytes(), "little")


def _check_args(num_resamples: int, confidence: float) -> None:
    if not isinstance(num_resamples, (int, np.integer)) or isinstance(num_resamples, bool) or (
        num_resamples != 0 and num_resamples < 10
    ):
        raise ValueError(f"num_resamples must be 0 (no interval) or an integer >= 10, got {num_resamples!r}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence!r}.")


def _group_layout(num_units: int, groups: Sequence[int] | np.ndarray | None):
    """None for one level; else (order, starts, sizes) of the units sorted by group label."""
    if groups is None:
        return None
    g = np.asarray(groups)
    if g.shape != (num_units,):
        raise ValueError(f"groups must hold one label per unit: shape ({num_units},), got {g.shape}.")
    labels, inverse = np.unique(g, return_inverse=True)
    if len(labels) < 2:
        return None  # one seed: the one-level bootstrap over tasks
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return order, starts, sizes


def resample_indices(
    num_units: int,
    *,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Chunks `(idx: [chunk, drawn] int, valid: [chunk, drawn] bool or None)` of resampled rows.

    One level: `drawn = num_units` uniform draws. Two levels: the groups with replacement, then each
    drawn group's own units with replacement; `valid` masks the padding when groups differ in size.
    The same (num_units, groups, key, num_resamples) always gives the same rows.
    """
    rng = np.random.default_rng(_seed(key))
    layout = _group_layout(num_units, groups)
    if layout is None:
        chunk = max(1, _CELLS // max(num_units, 1))
        for start in range(0, num_resamples, chunk):
            yield rng.integers(0, num_units, size=(min(chunk, num_resamples - start), num_units)), None
        return
    order, starts, sizes = layout
    num_groups, n_max = len(sizes), int(sizes.max())
    chunk = max(1, _CELLS // (num_groups * n_max))
    pad = np.arange(n_max)
    for start in range(0, num_resamples, chunk):
        c = min(chunk, num_resamples - start)
        g = rng.integers(0, num_groups, size=(c, num_groups))  # [c, G] drawn groups
        size = sizes[g][..., None]  # [c, G, 1]
        pos = rng.integers(0, size, size=(c, num_groups, n_max))  # a unit of the drawn group
        valid = pad < size
        idx = order[np.where(valid, starts[g][..., None] + pos, 0)].reshape(c, -1)
        yield idx, (None if bool(valid.all()) else valid.reshape(c, -1))


def _counts(idx: np.ndarray, valid: np.ndarray | None, num_units: int) -> np.ndarray:
    """[chunk, num_units] float64: how often each unit was drawn in each resample."""
    c = idx.shape[0]
    flat = (np.arange(c)[:, None] * num_units + idx).ravel()
    weights = None if valid is None else valid.ravel().astype(np.float64)
    return np.bincount(flat, weights=weights, minlength=c * num_units).reshape(c, num_units).astype(np.float64)


def _percentiles(draws: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(draws, [alpha, 1.0 - alpha], axis=0)
    return lo, hi


# ---- intervals ----------------------------------------------------------------------------------


def resampled_means(
    values: np.ndarray,
    *,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
) -> np.ndarray:
    """[num_resamples, ...]: the mean over units of `values: [units, ...]` in every resample."""
    v = np.asarray(values, np.float64)
    n = v.shape[0]
    flat = v.reshape(n, -1)
    out = []
    for idx, valid in resample_indices(n, groups=groups, key=key, num_resamples=num_resamples):
        counts = _counts(idx, valid, n)
        drawn = idx.shape[1] if valid is None else counts.sum(1, keepdims=True)
        out.append(counts @ flat / drawn)
    return np.concatenate(out).reshape((num_resamples,) + v.shape[1:])


def bootstrap_mean(
    per_task: np.ndarray,
    *,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lower, upper) over the unit axis of `per_task: [units, ...]` (any trailing shape).

    Percentile bootstrap, two-level when `groups` has >= 2 labels. `num_resamples=0` switches the
    interval off (lower = upper = mean). NaN is refused: drop units where a metric is undefined.
    """
    _check_args(num_resamples, confidence)
    values = np.asarray(per_task, dtype=np.float64)
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError(f"per_task must be [num_tasks, ...] with num_tasks >= 1, got shape {values.shape}.")
    if not np.all(np.isfinite(values)):
        raise ValueError("per_task has NaN or infinite values; drop the tasks where the metric is undefined.")
    mean = values.reshape(values.shape[0], -1).mean(0).reshape(values.shape[1:])
    if num_resamples == 0:
        return mean, mean, mean
    lo, hi = _percentiles(resampled_means(values, groups=groups, key=key, num_resamples=num_resamples), confidence)
    return mean, lo, hi


def bootstrap_stat(
    stat: Callable[..., Any],
    *arrays: np.ndarray,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stat(*arrays), lower, upper): `stat` applied to the resampled rows of every array (axis 0),
    all arrays resampled jointly (paired). For statistics that are not a plain mean, e.g. the
    minimum over T of a mean Pass@(1,T) curve."""
    _check_args(num_resamples, confidence)
    if not arrays:
        raise ValueError("bootstrap_stat needs at least one array of per-unit values.")
    n = np.shape(arrays[0])[0]
    if n == 0 or any(np.shape(a)[0] != n for a in arrays):
        raise ValueError(f"every array needs the same number >= 1 of units (rows), got {[np.shape(a)[0] for a in arrays]}.")
    value = np.asarray(stat(*arrays), np.float64)
    if num_resamples == 0:
        return value, value, value
    draws = []
    for idx, valid in resample_indices(n, groups=groups, key=key, num_resamples=num_resamples):
        for r in range(idx.shape[0]):
            rows = idx[r] if valid is None else idx[r][valid[r]]
            draws.append(np.asarray(stat(*(a[rows] for a in arrays)), np.float64))
    lo, hi = _percentiles(np.stack(draws), confidence)
    return value, lo, hi


def _grid(ks, ts) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(int(k) for k in np.atleast_1d(ks)), tuple(int(t) for t in np.atleast_1d(ts))


def surface_interval(
    per_task: np.ndarray,
    ks: Sequence[int] | np.ndarray,
    ts: Sequence[int] | np.ndarray,
    *,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> SurfaceInterval:
    """A SurfaceInterval from per-unit surfaces `per_task: [units, K, T]` (or their paired differences)."""
    est, lo, hi = bootstrap_mean(per_task, groups=groups, key=key, num_resamples=num_resamples, confidence=confidence)
    num_groups = 1 if groups is None else len(np.unique(np.asarray(groups)))
    return SurfaceInterval(est, lo, hi, *_grid(ks, ts), float(confidence), int(num_resamples), int(per_task.shape[0]), num_groups)


def describe_estimator(confidence: float) -> str:
    """The estimator of every Pass@(K,T) surface and its intervals, in one sentence (reports of `bmrl eval`
    and `bmrl passkt`); `confidence`: the intervals' level."""
    return ("Pass@(K,T) is the unbiased estimator 1 - C(n - c(T), K) / C(n, K) per task, with the task's own n "
            "attempts of which c(T) first succeeded within T turns, averaged over tasks; intervals are "
            f"{100 * confidence:g}% percentile bootstraps over tasks")


def bootstrap_pass_at_kt(
    first_success_turn: np.ndarray,
    ks: Sequence[int] | np.ndarray,
    ts: Sequence[int] | np.ndarray,
    *,
    n_per_task: Sequence[int] | np.ndarray | None = None,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> SurfaceInterval:
    """Pass@(K,T) with a percentile bootstrap interval over tasks (see `pass_at_kt`); `groups`
    (one label per task row, e.g. its training seed) makes it two-level."""
    from bmrl.eval.passkt import pass_at_kt_per_task

    per_task = pass_at_kt_per_task(first_success_turn, ks, ts, n_per_task=n_per_task)
    return surface_interval(per_task, ks, ts, groups=groups, key=key, num_resamples=num_resamples, confidence=confidence)


def paired_difference(
    first_success_turn_a: np.ndarray,
    first_success_turn_b: np.ndarray,
    ks: Sequence[int] | np.ndarray,
    ts: Sequence[int] | np.ndarray,
    *,
    n_per_task_a: Sequence[int] | np.ndarray | None = None,
    n_per_task_b: Sequence[int] | np.ndarray | None = None,
    groups: Sequence[int] | np.ndarray | None = None,
    key: Any = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> SurfaceInterval:
    """Pass@(K,T) of policy a minus policy b on the same tasks (row i of both = the same task),
    with a paired bootstrap interval: each resample uses the same rows for both.

    The two policies may have different numbers of attempts; each uses its own unbiased estimator.
    """
    from bmrl.eval.passkt import pass_at_kt_per_task

    a = pass_at_kt_per_task(first_success_turn_a, ks, ts, n_per_task=n_per_task_a)
    b = pass_at_kt_per_task(first_success_turn_b, ks, ts, n_per_task=n_per_task_b)
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"paired_difference needs the same tasks in both: a has {a.shape[0]} tasks, b has "
            f"{b.shape[0]}. Match tasks by id first (row i of both must be the same task)."
        )
    return surface_interval(a - b, ks, ts, groups=groups, key=key, num_resamples=num_resamples, confidence=confidence)
