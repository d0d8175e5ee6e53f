"""The study's findings over pooled (seed, task) units: per-task metrics, pooling across training
seeds, bootstrap intervals, the three measured findings and their verdicts (`bmrl reproduce`).

Intervals: a two-level percentile bootstrap (resample training seeds, then tasks within each seed;
one level with one seed), paired for differences (the same units for both policies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bmrl.eval.bootstrap import bootstrap_stat

BASE = "base"
GROUPS = "_groups"  # pooled[GROUPS][metric]: the seed of each unit (two-level bootstrap)


def _boot(stat: Callable[..., np.ndarray], *arrays: np.ndarray, resamples: int, seed: int, confidence: float = 0.95,
          groups: np.ndarray | None = None):
    """(value, lower, upper) of `stat(*arrays)`, resampling units (axis 0 of every array) jointly;
    with `groups` (the seed of each unit) seeds first, then tasks within seed (`bmrl.eval.bootstrap`)."""
    return bootstrap_stat(stat, *arrays, groups=groups, key=seed, num_resamples=max(resamples, 10), confidence=confidence)



def paired_mean_interval(a: np.ndarray, b: np.ndarray, resamples: int, seed: int, groups: np.ndarray | None = None) -> dict:
    """mean(a - b) over units where both are defined, with its interval (two levels with `groups`)."""
    return mean_interval(np.where(np.isfinite(a) & np.isfinite(b), a - b, np.nan), resamples, seed, groups)



def mean_interval(a: np.ndarray, resamples: int, seed: int, groups: np.ndarray | None = None) -> dict:
    """mean(a) over units where it is defined, with its interval: with `groups` (the training seed of
    each unit) the bootstrap resamples seeds, then units within each seed."""
    ok = np.isfinite(a)
    if not ok.any():
        return {"mean": float("nan"), "lower": float("nan"), "upper": float("nan"), "units": 0}
    g = None if groups is None else np.asarray(groups)[ok]
    v, lo, hi = _boot(np.mean, a[ok], resamples=resamples, seed=seed, groups=g)
    return {"mean": float(v), "lower": float(lo), "upper": float(hi), "units": int(ok.sum())}



def unit_metrics(result) -> dict[str, np.ndarray]:
    """Per-task arrays of one EvalResult or `SavedEval` (NaN where a metric is undefined for a task)."""
    from bmrl.eval.decompose import decision_accuracy_per_task, recovery_per_task
    from bmrl.eval.saved import SavedEval

    result = SavedEval.of(result)
    ep = result.episodes
    out = {
        "surface": np.asarray(result.per_task, float),  # [N, K, T]
        "decision_accuracy": decision_accuracy_per_task(ep),
        "recovery": recovery_per_task(ep)[1],
    }
    if result.probe_correct is not None:  # per probe state; the probe set depends only on the seed, so pairs match
        out["probe_accuracy_states"] = result.probe_correct
    if result.injected is not None:
        k1 = result.injected.ks.index(1) if 1 in result.injected.ks else 0
        out["injected_success"] = np.asarray(result.injected.per_task, float)[:, k1, -1]
    return out



def pool(per_seed: list[dict[str, dict[str, np.ndarray]]], names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Units of every seed concatenated per policy and metric; `pooled[GROUPS][metric]` holds the seed
    index of each unit (the same units, tasks or probe states, for every policy of a seed)."""
    pooled: dict[str, dict[str, np.ndarray]] = {}
    for name in names:
        keys = per_seed[0][name].keys()
        pooled[name] = {k: np.concatenate([s[name][k] for s in per_seed], axis=0) for k in keys}
    first = per_seed[0][names[0]]
    pooled[GROUPS] = {k: np.concatenate([np.full(len(s[names[0]][k]), i) for i, s in enumerate(per_seed)])
                      for k in first}
    return pooled



def findings(pooled: dict, ks: tuple[int, ...], ts: tuple[int, ...], rep, resamples: int) -> dict:
    """The study's three findings, measured, with paired intervals over (seed, task) units."""
    k1 = ks.index(1)
    j_large, j_small = len(ts) - 1, ts.index(rep.small_t)
    base, gen, tight, mix = pooled[BASE], pooled[rep.generous], pooled[rep.tight], pooled[rep.budgetmix]
    g = pooled.get(GROUPS, {})
    f: dict[str, Any] = {"T_large": ts[-1], "T_small": rep.small_t}

    d_large = gen["surface"][:, k1, j_large] - base["surface"][:, k1, j_large]
    d_small = gen["surface"][:, k1, j_small] - base["surface"][:, k1, j_small]
    f["gain_large"] = mean_interval(d_large, resamples, 1, g.get("surface"))
    f["gain_small"] = mean_interval(d_small, resamples, 2, g.get("surface"))
    f["gain_large_minus_small"] = mean_interval(d_large - d_small, resamples, 3, g.get("surface"))

    for i, (metric, out) in enumerate((("decision_accuracy", "delta_decision_accuracy"), ("recovery", "delta_recovery"),
                                       ("probe_accuracy_states", "delta_probe_accuracy"),
                                       ("injected_success", "delta_injected_success"))):
        if metric in gen:
            f[out] = paired_mean_interval(gen[metric], base[metric], resamples, 4 + i, g.get(metric))

    def min_pass1(s):
        return s[:, k1, :].mean(0).min()

    def area(s):
        return s.mean()

    for name, p in ((rep.generous, gen), (rep.tight, tight), (rep.budgetmix, mix), (BASE, base)):
        v, lo, hi = _boot(min_pass1, p["surface"], resamples=resamples, seed=8, groups=g.get("surface"))
        f.setdefault("min_pass1", {})[name] = {"mean": float(v), "lower": float(lo), "upper": float(hi)}
        v, lo, hi = _boot(area, p["surface"], resamples=resamples, seed=9, groups=g.get("surface"))
        f.setdefault("area", {})[name] = {"mean": float(v), "lower": float(lo), "upper": float(hi)}
    for other in (rep.generous, rep.tight):
        o = pooled[other]
        v, lo, hi = _boot(lambda a, b: min_pass1(a) - min_pass1(b), mix["surface"], o["surface"], resamples=resamples,
                          seed=10, groups=g.get("surface"))
        f.setdefault("mix_minus", {})[other] = {"min_pass1": {"mean": float(v), "lower": float(lo), "upper": float(hi)}}
        v, lo, hi = _boot(lambda a, b: a.mean() - b.mean(), mix["surface"], o["surface"], resamples=resamples, seed=11,
                          groups=g.get("surface"))
        f["mix_minus"][other]["area"] = {"mean": float(v), "lower": float(lo), "upper": float(hi)}
    return f



def verdicts(seed_results: list[dict], pooled: dict, ks, rep, resamples: int) -> dict[str, dict]:
    """The three verdicts (`bmrl.eval.verdicts`, written rules over intervals): F1 and F2 from the base
    and the generous-budget RL policy of every seed (paired states; seeds, then tasks), F3 from
    BudgetMix against both fixed budgets on the pooled surfaces."""
    from bmrl.eval.verdicts import compare_findings, f3_intervals, f3_verdict

    out = compare_findings([r[BASE] for r in seed_results], [r[rep.generous] for r in seed_results],
                           num_resamples=resamples)
    groups = pooled[GROUPS]["surface"] if len(seed_results) > 1 else None
    fixed = {o: pooled[o]["surface"] for o in (rep.generous, rep.tight)}
    f3 = f3_intervals(pooled[rep.budgetmix]["surface"], fixed, ks, groups=groups, num_resamples=resamples)
    v3 = f3_verdict(f3)
    out["F3"] = {**v3.to_dict(), "sentence": v3.sentence(),
                 "intervals": {b: {m: e.to_dict() for m, e in ms.items()} for b, ms in f3.items()}}
    return out

