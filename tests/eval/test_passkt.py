"""Pass@(K,T) estimator, bootstrap intervals, paired comparison, plots and report helpers."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from bmrl.eval import audit, passkt, plots
from bmrl.eval.bootstrap import bootstrap_mean, bootstrap_pass_at_kt, paired_difference
from bmrl.eval.passkt import pass_at_kt, pass_at_kt_per_task, reference_pass_at_k, success_counts


def exact_surface(fst: np.ndarray, ks, ts, n_per_task=None) -> np.ndarray:
    """Independent per-cell estimator with exact integer combinatorics (math.comb, Fractions-free)."""
    out = np.zeros((len(ks), len(ts)))
    for row_i, row in enumerate(fst):
        n = len(row) if n_per_task is None else int(n_per_task[row_i])
        row = row[:n]
        for j, t in enumerate(ts):
            c = sum(1 for v in row if 1 <= v <= t)
            for i, k in enumerate(ks):
                out[i, j] += 1.0 - math.comb(n - c, k) / math.comb(n, k)
    return out / len(fst)


@pytest.mark.parametrize(
    "num_tasks,n,max_turn,p_never",
    [(7, 1, 5, 0.3), (5, 6, 9, 0.5), (3, 33, 40, 0.2), (2, 200, 60, 0.6), (1, 1024, 100, 0.5)],
)
def test_equals_exact_combinatorics(num_tasks, n, max_turn, p_never):
    rng = np.random.default_rng(n)
    fst = rng.integers(1, max_turn + 1, (num_tasks, n))
    fst[rng.random((num_tasks, n)) < p_never] = 0
    ks = sorted({1, n, max(1, n // 2), min(n, 3)})
    ts = [1, 2, max_turn // 3 + 1, max_turn, max_turn + 5]
    got = pass_at_kt(fst, ks, ts)
    assert got.dtype == np.float64 and got.shape == (len(ks), len(ts))
    np.testing.assert_allclose(got, exact_surface(fst, ks, ts), rtol=0, atol=1e-9)


def test_all_success_all_failure_and_k_equals_n():
    n = 16
    ks, ts = [1, 4, 16], [1, 3, 10]
    never = np.zeros((4, n), int)
    np.testing.assert_array_equal(pass_at_kt(never, ks, ts), 0.0)
    always = np.ones((4, n), int)
    np.testing.assert_array_equal(pass_at_kt(always, ks, ts), 1.0)
    late = np.full((4, n), 5)  # succeed at turn 5: nothing before, everything from 5 on
    np.testing.assert_array_equal(pass_at_kt(late, ks, ts), np.array([[0, 0, 1.0]] * 3))
    one = np.zeros((1, n), int)
    one[0, 3] = 2  # k = n always includes the one success
    np.testing.assert_allclose(pass_at_kt(one, [n], [2]), [[1.0]])


def test_a_task_without_success_scores_exactly_zero_for_every_n_and_k():
    """c(T) = 0 is exactly 0 (and c(T) = n exactly 1) beside tasks with other counts, for every n and k: the
    log-ratio's cancelling terms are paired, so no compiler's order of summation leaves -9e-16 behind."""
    n_max = 24
    n_i = np.arange(1, n_max + 1)
    fst = np.zeros((n_max, n_max), int)
    for i, n in enumerate(n_i):
        fst[i, : n // 2] = 3  # task i: n // 2 successes at turn 3, nothing before
    per_task = pass_at_kt_per_task(fst, [1], [1, 2, 3], n_per_task=n_i)
    assert (per_task[:, :, :2] == 0.0).all()
    for n in (1, 2, 3, 5, 7, 12, 24):
        never = np.zeros((3, n), int)
        never[1, :] = 1  # one task that always succeeds beside two that never do
        out = pass_at_kt_per_task(never, list(range(1, n + 1)), [1, 4])
        assert (out[[0, 2]] == 0.0).all() and (out[1] == 1.0).all(), n


def test_ragged_attempts_use_each_tasks_own_n():
    rng = np.random.default_rng(1)
    fst = rng.integers(0, 8, (12, 20))
    n_i = rng.integers(5, 21, 12)
    got = pass_at_kt(fst, [1, 3, 5], [1, 4, 8], n_per_task=n_i)
    np.testing.assert_allclose(got, exact_surface(fst, [1, 3, 5], [1, 4, 8], n_i), atol=1e-9)
    # Padding beyond n_i is ignored, even if negative.
    padded = fst.copy()
    padded[np.arange(20)[None, :] >= n_i[:, None]] = -7
    np.testing.assert_allclose(pass_at_kt(padded, [1, 3, 5], [1, 4, 8], n_per_task=n_i), got, atol=0)


def test_per_task_values_and_counts():
    fst = np.array([[0, 1, 3, 3], [2, 0, 0, 0]])
    np.testing.assert_array_equal(success_counts(fst, [1, 2, 3, 9]), [[1, 1, 3, 3], [0, 1, 1, 1]])
    per = pass_at_kt_per_task(fst, [1, 2], [1, 3])
    assert per.shape == (2, 2, 2)
    np.testing.assert_allclose(per[0, 0], [0.25, 0.75])
    np.testing.assert_allclose(per[1, 1], [0.0, 0.5])
    np.testing.assert_allclose(per.mean(0), pass_at_kt(fst, [1, 2], [1, 3]))


def test_monotone_in_k_and_t():
    rng = np.random.default_rng(2)
    fst = rng.integers(0, 30, (40, 32))
    s = pass_at_kt(fst, np.arange(1, 33), np.arange(1, 41))
    assert np.all(np.diff(s, axis=0) >= -1e-12)
    assert np.all(np.diff(s, axis=1) >= -1e-12)
    assert s.min() >= 0 and s.max() <= 1


def test_reference_matches():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 70))
        c, k = int(rng.integers(0, n + 1)), int(rng.integers(1, n + 1))
        assert abs(reference_pass_at_k(n, c, k) - (1 - math.comb(n - c, k) / math.comb(n, k))) < 1e-9


def test_one_compile_per_shape_and_x64_untouched():
    rng = np.random.default_rng(4)
    before = passkt.TRACE_COUNT["per_task"]
    for seed in range(3):  # new values, new ks/ts values, same shapes
        fst = rng.integers(0, 9, (13, 11))
        pass_at_kt(fst, [1 + seed, 2, 3], [2, 4 + seed])
    assert passkt.TRACE_COUNT["per_task"] - before <= 1
    assert not jax.config.jax_enable_x64


@pytest.mark.parametrize(
    "fst,ks,ts,match",
    [
        (np.zeros((3, 4), int), [5], [1], "exceeds the number of attempts"),
        (np.zeros((3, 4), int), [0], [1], "ks must be >= 1"),
        (np.zeros((3, 4), int), [1], [0], "ts must be >= 1"),
        (np.array([[1, -2]]), [1], [1], "negative"),
        (np.zeros((0, 4), int), [1], [1], "empty"),
        (np.zeros((3, 0), int), [1], [1], "empty"),
        (np.zeros(4, int), [1], [1], r"\[num_tasks, attempts\]"),
        (np.full((2, 2), 1.5), [1], [1], "integer"),
        (np.zeros((3, 4), int), [], [1], "non-empty"),
        (np.zeros((3, 4), int), [1.5], [1], "integers"),
    ],
)
def test_invalid_inputs(fst, ks, ts, match):
    with pytest.raises(ValueError, match=match):
        pass_at_kt(fst, ks, ts)


def test_invalid_n_per_task():
    with pytest.raises(ValueError, match="outside 1..4"):
        pass_at_kt(np.zeros((2, 4), int), [1], [1], n_per_task=[0, 4])
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_kt(np.zeros((2, 4), int), [3], [1], n_per_task=[2, 4])


def test_bootstrap_interval_brackets_estimate_and_is_deterministic():
    rng = np.random.default_rng(5)
    fst = rng.integers(0, 6, (60, 8))
    a = bootstrap_pass_at_kt(fst, [1, 4], [1, 3, 5], key=7, num_resamples=200)
    b = bootstrap_pass_at_kt(fst, [1, 4], [1, 3, 5], key=7, num_resamples=200)
    np.testing.assert_array_equal(a.lower, b.lower)
    np.testing.assert_allclose(a.estimate, pass_at_kt(fst, [1, 4], [1, 3, 5]))
    assert np.all(a.lower <= a.estimate + 1e-12) and np.all(a.estimate <= a.upper + 1e-12)
    inner = (a.estimate > 0) & (a.estimate < 1)
    assert inner.sum() >= 4 and np.all((a.upper - a.lower)[inner] > 0)
    assert a.to_dict()["ks"] == [1, 4] and a.cell(4, 3)[0] == a.estimate[1, 1]


def test_bootstrap_coverage_in_simulation():
    """The 95% interval covers the population value in >= 90% of simulated evaluations."""
    rng = np.random.default_rng(6)
    num_tasks, n, max_turn, sims = 80, 6, 8, 120
    ks, ts = [1, 3], [2, 8]
    # Task difficulty p ~ U(0, 1); a success happens at a uniform turn in 1..max_turn.
    # P(success by T | p) = p T / max_turn; truth = E_p[1 - (1 - p T / M)^k] = 1 - (1 - (1-a)^(k+1)) / ((k+1) a), a = T/M.
    truth = np.array([[1 - (1 - (1 - t / max_turn) ** (k + 1)) / ((k + 1) * t / max_turn) for t in ts] for k in ks])
    covered = np.zeros((len(ks), len(ts)))
    for s in range(sims):
        p = rng.random((num_tasks, 1))
        succeeded = rng.random((num_tasks, n)) < p
        fst = np.where(succeeded, rng.integers(1, max_turn + 1, (num_tasks, n)), 0)
        ci = bootstrap_pass_at_kt(fst, ks, ts, key=s, num_resamples=200)
        covered += (ci.lower <= truth) & (truth <= ci.upper)
    assert np.all(covered / sims >= 0.90), covered / sims


def test_bootstrap_mean_generic_shapes_and_errors():
    rng = np.random.default_rng(8)
    values = rng.random((50, 3))
    m, lo, hi = bootstrap_mean(values, num_resamples=200)
    np.testing.assert_allclose(m, values.mean(0))
    assert lo.shape == (3,) and np.all(lo < m) and np.all(m < hi)
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_mean(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_mean(values, confidence=95)
    with pytest.raises(ValueError, match="num_tasks >= 1"):
        bootstrap_mean(np.zeros((0, 2)))


def test_paired_difference_detects_gain_and_matches_per_task():
    rng = np.random.default_rng(9)
    base = np.where(rng.random((100, 8)) < 0.3, rng.integers(1, 5, (100, 8)), 0)
    # Policy b adds successes late (turns 10..15) to failed attempts: same at T <= 9, better at 15.
    extra = (base == 0) & (rng.random((100, 8)) < 0.5)
    better = np.where(extra, rng.integers(10, 16, (100, 8)), base)
    d = paired_difference(better, base, [1, 2], [4, 9, 15], key=1, num_resamples=200)
    np.testing.assert_allclose(d.estimate, pass_at_kt(better, [1, 2], [4, 9, 15]) - pass_at_kt(base, [1, 2], [4, 9, 15]), atol=1e-12)
    sig = d.significant()
    assert not sig[:, :2].any() and sig[:, 2].all()
    np.testing.assert_array_equal(d.estimate[:, :2], 0.0)
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference(better[:5], base, [1], [4])


def test_paired_interval_is_tighter_than_unpaired():
    rng = np.random.default_rng(10)
    p = rng.random((200, 1))
    a = np.where(rng.random((200, 8)) < p, 1, 0)
    b = np.where(rng.random((200, 8)) < np.minimum(p + 0.05, 1), 1, 0)
    d = paired_difference(b, a, [1], [1], num_resamples=200)
    sa = bootstrap_pass_at_kt(a, [1], [1], num_resamples=200)
    sb = bootstrap_pass_at_kt(b, [1], [1], num_resamples=200)
    assert (d.upper - d.lower)[0, 0] < (sa.upper - sa.lower)[0, 0] + (sb.upper - sb.lower)[0, 0]


def _synthetic_pair():
    rng = np.random.default_rng(11)
    base = np.where(rng.random((120, 8)) < 0.35, rng.integers(1, 4, (120, 8)), 0)
    extra = (base == 0) & (rng.random((120, 8)) < 0.6)
    return base, np.where(extra, rng.integers(8, 13, (120, 8)), base)


def test_audit_says_gain_vanishes_at_small_cap():
    base, late = _synthetic_pair()
    ts = [1, 2, 3, 4, 8, 12]
    d = paired_difference(late, base, [1, 4], ts, num_resamples=200)
    sentences = audit.paired_audit("new", "old", d, production_cap=4)
    assert len(sentences) == 2
    assert all("does not survive at the production cap" in s for s in sentences)
    assert "T=12" in sentences[0] and "T=4" in sentences[0]
    at_largest = audit.paired_audit("new", "old", d, production_cap=12)
    assert all("the largest logged T" in s and "significant at 95%" in s for s in at_largest)
    run = audit.run_audit("new", bootstrap_pass_at_kt(late, [1], ts, num_resamples=200), 4)
    assert "production cap T=4" in run[0] and "largest logged T=12" in run[0] and "losing" in run[0]
    with pytest.raises(ValueError, match="not on the grid"):
        audit.paired_audit("new", "old", d, production_cap=5)


def test_audit_survives_and_no_difference_cases():
    rng = np.random.default_rng(12)
    weak = np.where(rng.random((150, 8)) < 0.2, rng.integers(1, 3, (150, 8)), 0)
    strong = np.where(rng.random((150, 8)) < 0.7, rng.integers(1, 3, (150, 8)), 0)
    d = paired_difference(strong, weak, [1], [2, 10], num_resamples=200)
    assert "survives" in audit.paired_audit("strong", "weak", d, 2)[0]
    same = paired_difference(weak, weak, [1], [2, 10], num_resamples=200)
    assert "do not differ significantly" in audit.paired_audit("x", "y", same, 2)[0]


def test_markdown_and_plots(tmp_path):
    base, late = _synthetic_pair()
    ks, ts = [1, 2, 4], [1, 2, 4, 8, 12]
    sa = bootstrap_pass_at_kt(base, ks, ts, num_resamples=200)
    d = paired_difference(late, base, ks, ts, num_resamples=200)
    table = audit.markdown_surface_table(d, signed=True)
    assert table.count("\n") == len(ts) + 1 and "**+" in table and "| 1 |" in table
    assert len(audit.surface_rows(sa)) == len(ks) * len(ts)
    paths = [
        plots.plot_surface_heatmap(sa.estimate, ks, ts, tmp_path / "h.png"),
        plots.plot_difference_heatmap(d.estimate, d.lower, d.upper, ks, ts, tmp_path / "d.png"),
        plots.plot_pass1_curves(ts, {"a": (sa.estimate[0], sa.lower[0], sa.upper[0])}, tmp_path / "c.png"),
        plots.plot_grouped_bars(
            ["accuracy", "recovery"], {"sft": [0.5, 0.2], "rl": [0.6, 0.4]}, tmp_path / "b.png",
            lower={"sft": [0.45, 0.1], "rl": [0.55, 0.3]}, upper={"sft": [0.55, 0.3], "rl": [0.65, 0.5]},
        ),
    ]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_are_written_by_process_0_alone(tmp_path, monkeypatch):
    """Every process draws and gets the path back (`bmrl reproduce` draws its figures on each); only
    process 0 writes, through `bmrl.distributed.main_writes`, and no process waits at a barrier (the
    report draws inside its own `main_writes`, on process 0 alone)."""
    import importlib

    module = importlib.import_module("bmrl.distributed.barrier")  # the package re-exports a function of that name
    met = []
    monkeypatch.setattr(module, "barrier", lambda name, *a, **k: met.append(name))
    for main in (False, True):
        monkeypatch.setattr(module, "is_main", lambda main=main: main)
        path = tmp_path / str(main) / "h.png"
        assert plots.plot_surface_heatmap(np.full((2, 3), 0.5), [1, 2], [1, 2, 3], path) == str(path)
        assert path.exists() == main
    assert met == []


def test_lazy_package_exports():
    import bmrl.eval as ev

    assert ev.pass_at_kt is pass_at_kt
    with pytest.raises(AttributeError):
        ev.does_not_exist  # noqa: B018
