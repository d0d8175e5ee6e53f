"""The one bootstrap: two-level variance against its exact value, coverage, pairing, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from bmrl.eval import bootstrap as bs
from bmrl.eval.bootstrap import (
    MIN_UNITS_FOR_SIGNIFICANCE,
    bootstrap_mean,
    bootstrap_stat,
    paired_difference,
    resample_indices,
    resampled_means,
    surface_interval,
)


def _two_level(rng, groups: int, tasks: int, seed_sd: float, task_sd: float):
    labels = np.repeat(np.arange(groups), tasks)
    y = seed_sd * rng.standard_normal(groups)[labels] + task_sd * rng.standard_normal(groups * tasks)
    return y, labels


def test_two_level_variance_matches_its_exact_value():
    """Var* of the mean = (1/G)[(1/G) sum (m_g - m)^2 + (1/(G n)) sum s2_g] for G groups of n."""
    rng = np.random.default_rng(0)
    g, n = 6, 20
    y, labels = _two_level(rng, g, n, seed_sd=0.5, task_sd=1.0)
    by_group = y.reshape(g, n)
    exact = (np.mean((by_group.mean(1) - y.mean()) ** 2) + by_group.var(1).mean() / n) / g
    draws = resampled_means(y, groups=labels, key=1, num_resamples=20000)
    assert draws.var() == pytest.approx(exact, rel=0.05)  # Monte Carlo sd of the ratio ~1%
    assert draws.mean() == pytest.approx(y.mean(), abs=4 * np.sqrt(exact / 20000))
    # The one-level bootstrap of the same pooled units only sees the task-level spread: var(y) / (G n).
    one = resampled_means(y, key=1, num_resamples=20000)
    assert one.var() == pytest.approx(y.var() / (g * n), rel=0.05)
    assert one.var() < 0.6 * draws.var()


def test_two_level_interval_covers_when_seeds_vary():
    """Seed-level spread dominates: the two-level 95% interval covers the true mean far more often
    than a one-level bootstrap over pooled (seed, task) units (measured: 0.90 vs 0.58)."""
    rng = np.random.default_rng(1)
    cover2 = cover1 = 0
    sims = 120
    for s in range(sims):
        y, labels = _two_level(rng, 6, 20, seed_sd=0.5, task_sd=1.0)
        _, lo, hi = bootstrap_mean(y, groups=labels, key=s, num_resamples=300)
        cover2 += lo <= 0 <= hi
        _, lo, hi = bootstrap_mean(y, key=s, num_resamples=300)
        cover1 += lo <= 0 <= hi
    assert cover2 / sims >= 0.82 and cover1 / sims <= 0.72, (cover2 / sims, cover1 / sims)


def test_ragged_groups_resample_whole_seeds():
    """Values constant within a seed, seeds of 3, 5 and 12 tasks: a resample mean is the size-weighted
    mean of G drawn seeds; compare its distribution with a direct simulation of that."""
    sizes, values = np.array([3, 5, 12]), np.array([0.0, 1.0, 4.0])
    labels = np.repeat([7, 2, 9], sizes)  # any labels; order of first appearance does not matter
    y = np.repeat(values, sizes)
    draws = resampled_means(y, groups=labels, key=3, num_resamples=20000)
    rng = np.random.default_rng(99)
    g = rng.integers(0, 3, (20000, 3))
    ref = (sizes[g] * values[g]).sum(1) / sizes[g].sum(1)
    assert draws.mean() == pytest.approx(ref.mean(), abs=0.03)
    assert draws.std() == pytest.approx(ref.std(), rel=0.05)
    assert set(np.round(np.unique(draws), 9)) <= set(np.round(np.unique(ref), 9))  # only seed mixtures occur
    chunks = list(resample_indices(len(y), groups=labels, key=3, num_resamples=10))
    idx, valid = chunks[0]
    assert valid is not None and idx.shape == (10, 3 * 12) and np.all(valid.sum(1) >= 9)


def test_paired_self_difference_is_exactly_zero():
    rng = np.random.default_rng(2)
    fst = np.where(rng.random((40, 6)) < 0.4, rng.integers(1, 9, (40, 6)), 0)
    labels = np.repeat(np.arange(4), 10)
    for groups in (None, labels):
        d = paired_difference(fst, fst, [1, 2], [3, 8], groups=groups, key=5, num_resamples=200)
        for arr in (d.estimate, d.lower, d.upper):
            np.testing.assert_array_equal(arr, 0.0)
        assert not d.significant().any()
    v, lo, hi = bootstrap_stat(lambda a, b: a.mean(0).min() - b.mean(0).min(), fst, fst, groups=labels, key=1, num_resamples=50)
    assert v == lo == hi == 0.0


def test_deterministic_for_a_key_and_the_same_draws_for_paired_inputs():
    rng = np.random.default_rng(3)
    y, labels = _two_level(rng, 5, 8, 0.3, 1.0)
    a = bootstrap_mean(y, groups=labels, key=11, num_resamples=100)
    b = bootstrap_mean(y, groups=labels, key=11, num_resamples=100)
    c = bootstrap_mean(y, groups=labels, key=12, num_resamples=100)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    assert not np.array_equal(a[1], c[1])
    # One label = the one-level bootstrap, bit for bit.
    one = bootstrap_mean(y, groups=np.zeros(len(y), int), key=11, num_resamples=100)
    assert all(np.array_equal(x, z) for x, z in zip(one, bootstrap_mean(y, key=11, num_resamples=100)))
    # A statistic over resampled rows sees the same draws as the count-matrix means.
    s = bootstrap_stat(np.mean, y, groups=labels, key=11, num_resamples=100)
    np.testing.assert_allclose(np.array(s), np.array(a), rtol=0, atol=1e-12)
    # A jax key works and is deterministic too.
    import jax

    k = jax.random.key(4)
    assert np.array_equal(bootstrap_mean(y, key=k, num_resamples=50)[1], bootstrap_mean(y, key=k, num_resamples=50)[1])


def test_chunked_draws_bound_memory(monkeypatch):
    """Tiny chunks give the requested number of resamples with valid intervals."""
    monkeypatch.setattr(bs, "_CELLS", 64)
    rng = np.random.default_rng(4)
    y, labels = _two_level(rng, 4, 30, 0.2, 1.0)
    draws = resampled_means(y, groups=labels, key=0, num_resamples=333)
    assert draws.shape == (333,) and np.all(np.isfinite(draws))
    assert len(list(resample_indices(len(y), key=0, num_resamples=333))) == 333  # one resample per chunk
    m, lo, hi = bootstrap_mean(y, groups=labels, num_resamples=333)
    assert lo < m < hi


def test_few_tasks_are_never_called_significant():
    fst_a = np.array([[1, 1, 1, 1]] * 3)
    fst_b = np.zeros((3, 4), int)
    d = paired_difference(fst_a, fst_b, [1], [1, 2], num_resamples=100)
    assert np.all(d.lower == 1.0) and np.all(d.upper == 1.0)  # zero width: identical tasks
    assert not d.significant().any() and not d.can_be_significant
    assert f"fewer than {MIN_UNITS_FOR_SIGNIFICANCE}" in d.significance_note()
    many = surface_interval(np.ones((MIN_UNITS_FOR_SIGNIFICANCE, 1, 1)), [1], [1], num_resamples=100)
    assert many.significant().all() and many.significance_note() is None


def test_argument_errors():
    with pytest.raises(ValueError, match="one label per unit"):
        bootstrap_mean(np.ones(5), groups=[0, 1])
    with pytest.raises(ValueError, match=">= 10"):
        bootstrap_mean(np.ones(5), num_resamples=3)
    with pytest.raises(ValueError, match="same number"):
        bootstrap_stat(np.mean, np.ones(5), np.ones(4))
    m, lo, hi = bootstrap_mean(np.arange(4.0), num_resamples=0)
    assert m == lo == hi == 1.5
