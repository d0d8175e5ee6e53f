"""Verdicts as data: each finding of the study is `as_study`, `opposite` or `inconclusive`, decided by a
written rule from bootstrap intervals; the sentences are generated from the verdicts, never the reverse.

The study: "What Does Multi-Turn Reinforcement Learning Really Improve in LLM Agents?". Its findings:
- F1: RL's gain over the base shrinks when the turn budget is tight.
- F2: RL improves recovery after errors more than single decisions in clean states.
- F3: training with BudgetMix (per-sequence turn caps) is robust across test budgets T.

Intervals are records (mean, lower, upper, num_tasks) from the one bootstrap (`bmrl.eval.bootstrap`,
two-level over seeds then tasks when `groups` labels the task rows with their training seed). All
differences are paired: row i of both policies is the same task, run with the same keys. With fewer
than `MIN_UNITS_FOR_SIGNIFICANCE` tasks no interval is trusted and every verdict is `inconclusive`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bmrl.eval.bootstrap import (
    MIN_UNITS_FOR_SIGNIFICANCE,
    bootstrap_mean,
    bootstrap_stat,
)
from bmrl.eval.decompose import Estimate
from bmrl.eval.states import paired_state_counts, state_accuracy_counts

VERDICTS = ("as_study", "opposite", "inconclusive")
STUDY = "What Does Multi-Turn Reinforcement Learning Really Improve in LLM Agents?"

RULES = {
    "F1": ("G = (RL - base Pass@(1,T) at the largest T) - (the same at the smallest T), per task. "
           "as_study if G's interval is above 0; opposite if below 0; else inconclusive."),
    "F2": ("dRec = change (RL - base) of accuracy P(action = oracle) in the states right after a first error, "
           "dClean = its change in clean states (no earlier error in the attempt), both on the states the two "
           "policies shared (same tasks and keys), pooled over tasks; D = dRec - dClean; intervals resample "
           "tasks. as_study if D's "
           "interval is above 0 and dClean's interval is not above 0 (clean decisions did not improve "
           "significantly); opposite if D's interval is below 0, or dClean's interval is above 0 and D's "
           "interval is not above 0 (the gain is in clean decisions); else inconclusive."),
    "F3": ("For each fixed budget, BudgetMix minus it on min over T of Pass@(1,T), min over T of Pass@(4,T) "
           "and the area under the Pass@(K,T) surface. as_study if against every fixed budget at least one "
           "measure's interval is above 0 and none is below 0; opposite if against some fixed budget at least "
           "one is below 0 and none is above 0; else inconclusive."),
}
CLAIMS = {
    "F1": "RL's gain shrinks when the turn budget is tight",
    "F2": "RL improves recovery after errors more than decisions in clean states",
    "F3": "BudgetMix is robust across test budgets, ahead of fixed-budget training",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A finding's verdict, the rule that decided it, why, and the intervals it read."""

    finding: str
    verdict: str
    rule: str
    reason: str
    intervals: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sentence(self) -> str:
        """One sentence generated from the verdict: the claim, what this run says, and why."""
        claim = CLAIMS[self.finding]
        say = {"as_study": f"as the study found ({claim})", "opposite": f"the opposite of the study's finding ({claim})",
               "inconclusive": f"inconclusive on this run for the study's finding ({claim})"}[self.verdict]
        return f"{self.finding}: {say}: {self.reason}."


def _rec(x: Any) -> Estimate:
    """An interval record from an Estimate or a mapping with mean/lower/upper (and num_tasks)."""
    if isinstance(x, Estimate):
        return x
    if isinstance(x, Mapping):
        return Estimate(float(x["mean"]), float(x["lower"]), float(x["upper"]), int(x.get("num_tasks", 0)))
    raise TypeError(f"an interval record needs mean, lower, upper (an Estimate or a dict), got {type(x).__name__}.")


def _fmt(e: Estimate) -> str:
    return f"{e.mean:+.3f} [{e.lower:+.3f}, {e.upper:+.3f}]"


def _above(e: Estimate) -> bool:
    return e.lower > 0


def _below(e: Estimate) -> bool:
    return e.upper < 0


def _too_few(finding: str, recs: dict[str, Estimate]) -> Verdict | None:
    n = min(e.num_tasks for e in recs.values())
    if n >= MIN_UNITS_FOR_SIGNIFICANCE:
        return None
    shown = ", ".join(f"{k} {_fmt(e)}" for k, e in recs.items())
    why = (f"{shown}, but only {n} task(s) with the measure defined, fewer than {MIN_UNITS_FOR_SIGNIFICANCE}; an "
           "interval over so few tasks is not trusted")
    return Verdict(finding, "inconclusive", RULES[finding], why, {k: v.to_dict() for k, v in recs.items()})


# ---- rules: interval records -> verdict ---------------------------------------------------------


def f1_verdict(gain_large_minus_small: Any) -> Verdict:
    """F1 from the interval of G = gain at the largest T minus gain at the smallest T (RULES["F1"])."""
    g = _rec(gain_large_minus_small)
    recs = {"gain_large_minus_small": g}
    if (v := _too_few("F1", recs)) is not None:
        return v
    verdict = "as_study" if _above(g) else "opposite" if _below(g) else "inconclusive"
    where = {"as_study": "above 0", "opposite": "below 0", "inconclusive": "includes 0"}[verdict]
    reason = f"the large-T gain minus the small-T gain is {_fmt(g)}, its interval {where}"
    return Verdict("F1", verdict, RULES["F1"], reason, {k: e.to_dict() for k, e in recs.items()})


def f2_verdict(delta_recovery: Any, delta_clean: Any, difference: Any) -> Verdict:
    """F2 from the intervals of dRec, dClean and D = dRec - dClean (RULES["F2"])."""
    dr, dc, d = _rec(delta_recovery), _rec(delta_clean), _rec(difference)
    recs = {"delta_recovery_accuracy": dr, "delta_clean_accuracy": dc, "recovery_minus_clean": d}
    if (v := _too_few("F2", recs)) is not None:
        return v
    if _above(d) and not _above(dc):
        verdict, why = "as_study", "D's interval is above 0 and dClean's is not"
    elif _below(d):
        verdict, why = "opposite", "D's interval is below 0"
    elif _above(dc) and not _above(d):
        verdict, why = "opposite", "dClean's interval is above 0 and D's is not"
    elif _above(d):
        verdict, why = "inconclusive", "both improved: D's interval is above 0 but so is dClean's"
    else:
        verdict, why = "inconclusive", "D's interval includes 0 and dClean's is not above 0"
    reason = (f"on the states both policies met, accuracy right after an error changed by {_fmt(dr)}, in clean "
              f"states by {_fmt(dc)}, their difference D = {_fmt(d)}; {why}")
    return Verdict("F2", verdict, RULES["F2"], reason, {k: e.to_dict() for k, e in recs.items()})


def f3_verdict(mix_minus: Mapping[str, Mapping[str, Any]]) -> Verdict:
    """F3 from {fixed budget: {measure: interval of BudgetMix minus it}} (RULES["F3"])."""
    if not mix_minus:
        raise ValueError("F3 needs at least one fixed budget to compare BudgetMix with.")
    recs = {f"{b}/{m}": _rec(e) for b, ms in mix_minus.items() for m, e in ms.items()}
    if (v := _too_few("F3", recs)) is not None:
        return v
    up = {b: any(_above(_rec(e)) for e in ms.values()) for b, ms in mix_minus.items()}
    down = {b: any(_below(_rec(e)) for e in ms.values()) for b, ms in mix_minus.items()}
    if all(up[b] and not down[b] for b in mix_minus):
        verdict = "as_study"
    elif any(down[b] and not up[b] for b in mix_minus):
        verdict = "opposite"
    else:
        verdict = "inconclusive"
    parts = [f"against {b}: " + ", ".join(f"{m} {_fmt(_rec(e))}" for m, e in ms.items()) for b, ms in mix_minus.items()]
    return Verdict("F3", verdict, RULES["F3"], "BudgetMix minus each fixed budget, " + "; ".join(parts),
                   {k: e.to_dict() for k, e in recs.items()})


# ---- intervals: paired per-task values -> interval records --------------------------------------


def _estimates(columns: dict[str, np.ndarray], groups, key: int, num_resamples: int, confidence: float) -> dict[str, Estimate]:
    """Paired intervals of several per-task columns [N] on the same resamples (NaN rows dropped)."""
    names = list(columns)
    values = np.stack([np.asarray(columns[n], np.float64) for n in names], axis=1)  # [N, C]
    keep = np.isfinite(values).all(1)
    if not keep.any():
        nan = Estimate(float("nan"), float("nan"), float("nan"), 0)
        return {n: nan for n in names}
    g = None if groups is None else np.asarray(groups)[keep]
    m, lo, hi = bootstrap_mean(values[keep], groups=g, key=key, num_resamples=num_resamples, confidence=confidence)
    n = int(keep.sum())
    return {name: Estimate(float(m[i]), float(lo[i]), float(hi[i]), n) for i, name in enumerate(names)}


def f1_intervals(base_pass1: np.ndarray, trained_pass1: np.ndarray, *, groups=None, key: int = 0,
                 num_resamples: int = 1000, confidence: float = 0.95) -> dict[str, Estimate]:
    """Per-task Pass@(1,T) curves `[N, T]` of both policies (same tasks, T ascending) -> intervals of
    gain_large, gain_small and gain_large_minus_small."""
    b, t = np.asarray(base_pass1, np.float64), np.asarray(trained_pass1, np.float64)
    if b.shape != t.shape or b.ndim != 2 or b.shape[1] < 2:
        raise ValueError(f"F1 needs per-task Pass@(1,T) [tasks, T>=2] of the same shape for both policies, got {b.shape}, {t.shape}.")
    gain = t - b
    cols = {"gain_large": gain[:, -1], "gain_small": gain[:, 0], "gain_large_minus_small": gain[:, -1] - gain[:, 0]}
    return _estimates(cols, groups, key, num_resamples, confidence)


F2_MEASURES = ("base_clean_accuracy", "trained_clean_accuracy", "base_recovery_accuracy", "trained_recovery_accuracy",
               "delta_clean_accuracy", "delta_recovery_accuracy", "recovery_minus_clean")


def _seq(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _f2_counts(base_episodes, trained_episodes, errors: str) -> np.ndarray:
    """[N, 14] per-task counts: shared states (right base, right trained, states) clean then post-error,
    then each policy's own (right, states) clean and post-error."""
    if base_episodes.num_tasks != trained_episodes.num_tasks:
        raise ValueError(f"F2 pairs tasks: base has {base_episodes.num_tasks}, trained {trained_episodes.num_tasks}.")
    p = paired_state_counts(base_episodes, trained_episodes, errors)
    ob, ot = state_accuracy_counts(base_episodes, errors), state_accuracy_counts(trained_episodes, errors)
    cols = [p["clean_right_a"], p["clean_right_b"], p["clean"], p["post_error_right_a"], p["post_error_right_b"],
            p["post_error"], ob["clean_right"], ob["clean"], ot["clean_right"], ot["clean"], ob["post_error_right"],
            ob["post_error"], ot["post_error_right"], ot["post_error"]]
    return np.stack(cols, axis=1).astype(np.float64)


def f2_intervals(base_episodes, trained_episodes, *, groups=None, errors: str = "any", key: int = 1,
                 num_resamples: int = 1000, confidence: float = 0.95) -> dict[str, Estimate]:
    """`Episodes` of both policies on the same tasks and keys -> intervals (F2_MEASURES). Either one
    pair, or one pair per training seed (two sequences): tasks are then pooled and, unless `groups` is
    given, resampled in two levels (seeds, then tasks within seed).

    The changes are paired on the same states (`bmrl.eval.states.paired_state_counts`): dClean over
    the clean states both met, dRec over the post-error states both met; each accuracy pools all such
    states of all tasks (a ratio of sums), D = dRec - dClean. The `base_*`/`trained_*` levels are each
    policy's own (on-policy) accuracies. Resampled units are tasks (two-level with `groups`);
    `num_tasks` counts the tasks with both kinds of shared state (the guard against too few)."""
    bases, traineds = _seq(base_episodes), _seq(trained_episodes)
    if len(bases) != len(traineds):
        raise ValueError(f"F2 pairs seeds: {len(bases)} base and {len(traineds)} trained episode sets.")
    if groups is None and len(bases) > 1:
        groups = np.repeat(np.arange(len(bases)), [b.num_tasks for b in bases])
    counts = np.concatenate([_f2_counts(b, t, errors) for b, t in zip(bases, traineds)])  # [N, 14]
    n = int(((counts[:, 2] > 0) & (counts[:, 5] > 0)).sum())
    if counts[:, [2, 5]].sum(0).min() == 0:
        nan = Estimate(float("nan"), float("nan"), float("nan"), 0)
        return {m: nan for m in F2_MEASURES}
    m, lo, hi = bootstrap_stat(_f2_stat, counts, groups=groups, key=key, num_resamples=num_resamples, confidence=confidence)
    return {name: Estimate(float(m[i]), float(lo[i]), float(hi[i]), n) for i, name in enumerate(F2_MEASURES)}


def _f2_stat(c: np.ndarray) -> np.ndarray:
    """F2_MEASURES from per-task counts [N, 14] (`_f2_counts`): ratios of sums over the tasks."""
    s = c.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        dc = (s[1] - s[0]) / s[2]
        dr = (s[4] - s[3]) / s[5]
        return np.array([s[6] / s[7], s[8] / s[9], s[10] / s[11], s[12] / s[13], dc, dr, dr - dc])


def f2_point(base_episodes, trained_episodes, errors: str = "any") -> dict[str, float]:
    """The F2 measures of one pair (e.g. one training seed) without intervals: the per-seed values."""
    v = _f2_stat(_f2_counts(base_episodes, trained_episodes, errors))
    return {name: float(v[i]) for i, name in enumerate(F2_MEASURES)}


def f3_intervals(mix_surface: np.ndarray, fixed_surfaces: Mapping[str, np.ndarray], ks: Sequence[int], *,
                 groups=None, key: int = 2, num_resamples: int = 1000, confidence: float = 0.95) -> dict[str, dict[str, Estimate]]:
    """Per-task Pass@(K,T) surfaces `[N, K, T]` (same tasks and grid) -> {fixed: {measure: interval of
    BudgetMix minus it}}; measures: min over T of Pass@(k,T) for k in (1, 4) on the grid, and area."""
    ks = [int(k) for k in ks]
    rows = [(f"min_pass{k}", ks.index(k)) for k in (1, 4) if k in ks]
    if not rows:
        raise ValueError(f"F3 needs K=1 or K=4 on the grid, got ks={ks}.")
    mix = np.asarray(mix_surface, np.float64)
    out: dict[str, dict[str, Estimate]] = {}
    for i, (name, fixed) in enumerate(fixed_surfaces.items()):
        fixed = np.asarray(fixed, np.float64)
        if fixed.shape != mix.shape:
            raise ValueError(f"F3 pairs tasks: BudgetMix surface {mix.shape} vs {name} {fixed.shape}.")

        def stat(a, b):
            mins = [a[:, r, :].mean(0).min() - b[:, r, :].mean(0).min() for _, r in rows]
            return np.array(mins + [a.mean() - b.mean()])

        m, lo, hi = bootstrap_stat(stat, mix, fixed, groups=groups, key=key + i, num_resamples=num_resamples,
                                   confidence=confidence)
        names = [n for n, _ in rows] + ["area"]
        out[name] = {n: Estimate(float(m[j]), float(lo[j]), float(hi[j]), mix.shape[0]) for j, n in enumerate(names)}
    return out


# ---- findings of two evaluations ----------------------------------------------------------------


def compare_findings(base, trained, *, num_resamples: int = 1000, confidence: float = 0.95) -> dict[str, Any]:
    """F1 and F2 of two policies: `EvalResult`s on the same tasks, keys and T grid, or one per training
    seed (two sequences, pair i = seed i; intervals then resample seeds, then tasks within seed).
    Returns {"F1": {...}, "F2": {...}}, each with verdict, rule, reason, sentence and intervals."""
    bases, traineds = _seq(base), _seq(trained)
    if len(bases) != len(traineds) or not bases:
        raise ValueError(f"compare pairs seeds: got {len(bases)} base and {len(traineds)} trained evaluations.")
    for b, t in zip(bases, traineds):
        if b.ts != bases[0].ts or t.ts != b.ts or b.num_tasks != t.num_tasks or 1 not in b.ks or 1 not in t.ks:
            raise ValueError(
                f"compare needs both evaluations on the same tasks and T grid with K=1: base {b.num_tasks} tasks, "
                f"ts={list(b.ts)}, ks={list(b.ks)}; trained {t.num_tasks} tasks, ts={list(t.ts)}, ks={list(t.ks)}."
            )
    if num_resamples < 10:
        raise ValueError(f"verdicts need intervals: num_resamples must be >= 10, got {num_resamples}.")
    groups = np.repeat(np.arange(len(bases)), [b.num_tasks for b in bases]) if len(bases) > 1 else None
    boot = {"groups": groups, "num_resamples": num_resamples, "confidence": confidence}
    pass1 = lambda rs: np.concatenate([r.per_task[:, r.ks.index(1), :] for r in rs])
    f1 = f1_intervals(pass1(bases), pass1(traineds), **boot)
    f2 = f2_intervals([b.episodes for b in bases], [t.episodes for t in traineds], **boot)
    out = {}
    for v, iv in ((f1_verdict(f1["gain_large_minus_small"]), f1),
                  (f2_verdict(f2["delta_recovery_accuracy"], f2["delta_clean_accuracy"], f2["recovery_minus_clean"]), f2)):
        out[v.finding] = {**v.to_dict(), "sentence": v.sentence(), "intervals": {k: e.to_dict() for k, e in iv.items()}}
    out["F1"]["T_small"], out["F1"]["T_large"] = int(bases[0].ts[0]), int(bases[0].ts[-1])
    shared = [paired_state_counts(b.episodes, t.episodes) for b, t in zip(bases, traineds)]
    out["F2"]["shared_states"] = {k: int(sum(c[k].sum() for c in shared)) for k in ("clean", "post_error")}
    out["F1"]["seeds"] = out["F2"]["seeds"] = len(bases)
    return out
