"""The study's findings, each measured exactly once: one bootstrap per finding gives one `Finding`
(its intervals, the verdict its rule reads from them, and the curves its figure draws), and the
sentences, tables, figures and summary.json of `bmrl reproduce` and `bmrl compare` all read it.

Units are (seed, task) pairs: per-task metrics of every policy (`unit_metrics`), pooled over training
seeds (`pool`). Intervals: a two-level percentile bootstrap (resample training seeds, then tasks
within each seed; one level with one seed), paired for differences: row i of every policy is the
same task, run with the same keys, and the draws depend only on (key, units, seeds), so every
policy of a comparison is resampled alike.

  F1: RL's gain over the base at the largest T minus its gain at the small T (`reproduce.small_t`;
      `bmrl compare`: the smallest T of the grid), with the gain at every T (the F1 figure);
  F2: the change of accuracy right after an error and in clean states, on the states both policies
      met, and each policy's accuracy there (the F2 figure); each policy's own (on-policy) levels too;
  F3: BudgetMix minus each fixed budget (min over T of Pass@(1,T) and Pass@(4,T), area), every
      policy's own levels and its Pass@(k,T) curves (the F3 figure).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from bmrl.eval.bootstrap import Interval, bootstrap_mean, bootstrap_stat, mean_interval
from bmrl.eval.decompose import decision_accuracy_per_task, recovery_per_task
from bmrl.eval.saved import SavedEval
from bmrl.eval.states import paired_state_counts, state_accuracy_counts
from bmrl.eval.streams import STREAMS
from bmrl.study.verdicts import DEAD_RUN_RULE, Verdict, f1_verdict, f2_verdict, f3_verdict

BASE = "base"
GROUPS = "_groups"  # pooled[GROUPS][metric]: the seed of each unit (two-level bootstrap)
Curve = tuple[np.ndarray, np.ndarray, np.ndarray]  # (estimate, lower, upper), each [T]


def _as_dict(x: Any) -> Any:
    if isinstance(x, Interval):
        return x.to_dict()
    if isinstance(x, Mapping):
        return {k: _as_dict(v) for k, v in x.items()}
    return x


@dataclasses.dataclass(frozen=True)
class Finding:
    """One finding, measured once: `intervals` (one bootstrap; F3's nested by fixed budget), the
    `verdict` its written rule read from them, `facts` (e.g. the two T of F1, the shared states of
    F2), `levels` (measured alongside, on each policy's own states: F3's min over T and area per
    policy, F2's on-policy changes) and `curves` (what its figure draws, e.g. F1's gain at every T
    per RL variant)."""

    verdict: Verdict
    intervals: Mapping[str, Any]
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    levels: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    curves: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.verdict.finding

    def sentence(self) -> str:
        """The verdict's sentence, then (in a study with dead runs) whether it holds without them."""
        return self.verdict.sentence() + without_sentence(self.facts.get("without_dead_runs"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the verdict (rule, reason), its sentence, every interval and the facts."""
        return {**self.verdict.to_dict(), "sentence": self.sentence(), "intervals": _as_dict(self.intervals),
                **dict(self.facts)}


def _intervals(values: np.ndarray, names: Sequence[str], groups, key: int, num_resamples: int,
               confidence: float) -> dict[str, Interval]:
    """Paired intervals of the means of the columns of `values: [N, C]` (NaN rows dropped), on one set
    of resamples."""
    keep = np.isfinite(values).all(1)
    if not keep.any():
        return {n: Interval(float("nan"), float("nan"), float("nan"), 0) for n in names}
    g = None if groups is None else np.asarray(groups)[keep]
    m, lo, hi = bootstrap_mean(values[keep], groups=g, key=key, num_resamples=num_resamples, confidence=confidence)
    n = int(keep.sum())
    return {name: Interval(float(m[i]), float(lo[i]), float(hi[i]), n) for i, name in enumerate(names)}


def _curve(ivs: Mapping[str, Interval], names: Sequence[str]) -> Curve:
    return tuple(np.array([getattr(ivs[n], a) for n in names]) for a in ("mean", "lower", "upper"))  # type: ignore[return-value]


def without_sentence(info: Mapping[str, Any] | None) -> str:
    """What `without_dead_runs` found, in one sentence ('' when the study has no dead run). A run of a seed
    whose base RL cannot learn from is named with "(untrainable base)"."""
    if not info or not info.get("study_has_dead_runs"):
        return ""
    runs = info["dead_runs"]
    if not runs:
        return " None of the runs it reads is dead."
    named = ", ".join(f"seed {r['seed']} {r['variant']}" + (" (untrainable base)" if r.get("untrainable_base") else "")
                      for r in runs)
    if info["holds"] is None:
        return f" It cannot be checked without the dead run(s) ({named}): every seed has one, so it rests on dead runs."
    seeds = ", ".join(str(x) for x in info["seeds_without"])
    if info["holds"]:
        return f" It holds without the dead run(s) ({named}): on seeds {seeds} alone the verdict is the same."
    return (f" It does not hold without the dead run(s) ({named}): on seeds {seeds} alone the verdict is "
            f"{info['verdict_without']}.")


# ---- F1 ----------------------------------------------------------------------------------------


def f1_finding(base_pass1: np.ndarray, trained: Mapping[str, np.ndarray], ts: Sequence[int], *, main: str,
               small_t: int | None = None, groups=None, key: int = STREAMS["F1"], num_resamples: int = 1000,
               confidence: float = 0.95) -> Finding:
    """F1 from per-task Pass@(1,T) `[N, T]` of the base and of each RL variant (`trained[name]`, same
    tasks, T ascending): G = gain at the largest T minus gain at `small_t` (default the smallest T) of
    the variant `main`, with the gain at every T in the same bootstrap. The other variants' gain
    curves (the figure) are drawn on the same resamples (same key)."""
    ts = [int(t) for t in ts]
    b = np.asarray(base_pass1, np.float64)
    small_t = ts[0] if small_t is None else int(small_t)
    if small_t not in ts:
        raise ValueError(f"F1's small T={small_t} is not on the grid ts={ts}.")
    j = ts.index(small_t)
    gains = [f"gain_T{t}" for t in ts]
    intervals: dict[str, Interval] = {}
    curves: dict[str, Curve] = {}
    for name, t in trained.items():
        t = np.asarray(t, np.float64)
        if t.shape != b.shape or b.ndim != 2 or b.shape[1] != len(ts) or len(ts) < 2:
            raise ValueError(f"F1 needs per-task Pass@(1,T) [tasks, T>=2] on ts={ts} of the same shape for both "
                             f"policies, got {b.shape}, {t.shape}.")
        gain = t - b
        if name != main:
            curves[name] = _curve(_intervals(gain, gains, groups, key, num_resamples, confidence), gains)
            continue
        cols = np.concatenate([gain, (gain[:, -1] - gain[:, j])[:, None]], axis=1)
        ivs = _intervals(cols, gains + ["gain_large_minus_small"], groups, key, num_resamples, confidence)
        curves[name] = _curve(ivs, gains)
        intervals = {"gain_large": ivs[gains[-1]], "gain_small": ivs[gains[j]],
                     "gain_large_minus_small": ivs["gain_large_minus_small"]}
    if not intervals:
        raise ValueError(f"F1's RL policy {main!r} is not among {list(trained)}.")
    verdict = f1_verdict(intervals["gain_large_minus_small"], t_small=small_t, t_large=ts[-1])
    return Finding(verdict, intervals, facts={"T_small": small_t, "T_large": ts[-1]}, curves=curves)


# ---- F2 ----------------------------------------------------------------------------------------

F2_MEASURES = ("base_clean_accuracy", "trained_clean_accuracy", "base_recovery_accuracy", "trained_recovery_accuracy",
               "delta_clean_accuracy", "delta_recovery_accuracy", "recovery_minus_clean",
               "paired_base_clean_accuracy", "paired_trained_clean_accuracy", "paired_base_recovery_accuracy",
               "paired_trained_recovery_accuracy")


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


def _f2_stat(c: np.ndarray) -> np.ndarray:
    """F2_MEASURES from per-task counts [N, 14] (`_f2_counts`): ratios of sums over the tasks."""
    s = c.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        dc = (s[1] - s[0]) / s[2]
        dr = (s[4] - s[3]) / s[5]
        return np.array([s[6] / s[7], s[8] / s[9], s[10] / s[11], s[12] / s[13], dc, dr, dr - dc,
                         s[0] / s[2], s[1] / s[2], s[3] / s[5], s[4] / s[5]])


def f2_intervals(base_episodes, trained_episodes, *, groups=None, errors: str = "any", key: int = STREAMS["F2"],
                 num_resamples: int = 1000, confidence: float = 0.95) -> dict[str, Interval]:
    """`Episodes` of both policies on the same tasks and keys -> intervals (F2_MEASURES). Either one
    pair, or one pair per training seed (two sequences): tasks are then pooled and, unless `groups` is
    given, resampled in two levels (seeds, then tasks within seed).

    The changes are paired on the same states (`bmrl.eval.states.paired_state_counts`): dClean over
    the clean states both met, dRec over the post-error states both met; each accuracy pools all such
    states of all tasks (a ratio of sums), D = dRec - dClean. `paired_*`: each policy's accuracy on
    those shared states (their difference is dClean / dRec); `base_*`/`trained_*`: each policy's own
    (on-policy) accuracy on the states it met. `num_tasks` counts the tasks with both kinds of shared
    state (the guard against too few)."""
    bases, traineds = _seq(base_episodes), _seq(trained_episodes)
    if len(bases) != len(traineds):
        raise ValueError(f"F2 pairs seeds: {len(bases)} base and {len(traineds)} trained episode sets.")
    if groups is None and len(bases) > 1:
        groups = np.repeat(np.arange(len(bases)), [b.num_tasks for b in bases])
    counts = np.concatenate([_f2_counts(b, t, errors) for b, t in zip(bases, traineds)])  # [N, 14]
    n = int(((counts[:, 2] > 0) & (counts[:, 5] > 0)).sum())
    if counts[:, [2, 5]].sum(0).min() == 0:
        return {m: Interval(float("nan"), float("nan"), float("nan"), 0) for m in F2_MEASURES}
    m, lo, hi = bootstrap_stat(_f2_stat, counts, groups=groups, key=key, num_resamples=num_resamples, confidence=confidence)
    return {name: Interval(float(m[i]), float(lo[i]), float(hi[i]), n) for i, name in enumerate(F2_MEASURES)}


def f2_point(base_episodes, trained_episodes, errors: str = "any") -> dict[str, float]:
    """The F2 measures of one pair (e.g. one training seed) without intervals: the per-seed values."""
    v = _f2_stat(_f2_counts(base_episodes, trained_episodes, errors))
    return {name: float(v[i]) for i, name in enumerate(F2_MEASURES)}


def f2_finding(base_episodes, trained_episodes, *, on_policy: Mapping[str, Interval] | None = None, **boot) -> Finding:
    """F2 of one pair of `Episodes` or one pair per training seed (`f2_intervals`), its verdict, the
    shared states counted; `on_policy`: on-policy changes measured alongside (reported as such)."""
    iv = f2_intervals(base_episodes, trained_episodes, **boot)
    verdict = f2_verdict(iv["delta_recovery_accuracy"], iv["delta_clean_accuracy"], iv["recovery_minus_clean"])
    shared = [paired_state_counts(b, t) for b, t in zip(_seq(base_episodes), _seq(trained_episodes))]
    facts = {"shared_states": {k: int(sum(c[k].sum() for c in shared)) for k in ("clean", "post_error")}}
    return Finding(verdict, iv, facts=facts, levels=dict(on_policy or {}))


# ---- F3 ----------------------------------------------------------------------------------------


def f3_intervals(mix_surface: np.ndarray, fixed_surfaces: Mapping[str, np.ndarray], ks: Sequence[int], *,
                 groups=None, key: int = STREAMS["F3"], num_resamples: int = 1000,
                 confidence: float = 0.95) -> dict[str, dict[str, Interval]]:
    """Per-task Pass@(K,T) surfaces `[N, K, T]` (same tasks and grid) -> {fixed: {measure: interval of
    BudgetMix minus it}}; measures: min over T of Pass@(k,T) for k in (1, 4) on the grid, and area."""
    ks = [int(k) for k in ks]
    rows = [(f"min_pass{k}", ks.index(k)) for k in (1, 4) if k in ks]
    if not rows:
        raise ValueError(f"F3 needs K=1 or K=4 on the grid, got ks={ks}.")
    mix = np.asarray(mix_surface, np.float64)
    out: dict[str, dict[str, Interval]] = {}
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
        out[name] = {n: Interval(float(m[j]), float(lo[j]), float(hi[j]), mix.shape[0]) for j, n in enumerate(names)}
    return out


def f3_finding(surfaces: Mapping[str, np.ndarray], mix: str, fixed: Sequence[str], ks: Sequence[int], *, groups=None,
               num_resamples: int = 1000, confidence: float = 0.95) -> Finding:
    """F3 from per-task surfaces `[N, K, T]` of every policy (`surfaces[name]`): BudgetMix (`mix`)
    minus each of `fixed` (`f3_intervals`, its verdict), every policy's own min over T of Pass@(1,T)
    and area (`levels`), and its Pass@(k,T) curves for k in (1, 4) on the grid (`curves`, the figure)."""
    boot = dict(groups=groups, num_resamples=num_resamples, confidence=confidence)
    iv = f3_intervals(surfaces[mix], {o: surfaces[o] for o in fixed}, ks, **boot)
    ks = [int(k) for k in ks]
    k1 = ks.index(1)
    levels: dict[str, dict[str, Interval]] = {"min_pass1": {}, "area": {}}
    curves: dict[str, dict[str, Curve]] = {}
    for name, s in surfaces.items():
        s = np.asarray(s, np.float64)
        for measure, stat in (("min_pass1", lambda a: a[:, k1, :].mean(0).min()), ("area", np.mean)):
            v, lo, hi = bootstrap_stat(stat, s, key=STREAMS[f"F3_level_{measure}"], **boot)
            levels[measure][name] = Interval(float(v), float(lo), float(hi), s.shape[0])
        for k in (1, 4):
            if k in ks:
                i = ks.index(k)
                curves.setdefault(f"Pass@({k},T)", {})[name] = tuple(np.asarray(x) for x in bootstrap_mean(
                    s[:, i, :], key=STREAMS["F3_curve"], **boot))
    return Finding(f3_verdict(iv), iv, levels=levels, curves=curves)


# ---- per-task metrics, pooled over seeds -------------------------------------------------------


def unit_metrics(result) -> dict[str, np.ndarray]:
    """Per-task arrays of one EvalResult or `SavedEval` (NaN where a metric is undefined for a task)."""
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


ON_POLICY = (("decision_accuracy", "delta_decision_accuracy"), ("recovery", "delta_recovery"),
             ("probe_accuracy_states", "delta_probe_accuracy"), ("injected_success", "delta_injected_success"))
LEVELS = ("decision_accuracy", "probe_accuracy_states", "recovery", "injected_success")


@dataclasses.dataclass(frozen=True)
class Study:
    """The study's results, each computed once: the three findings and every policy's own levels
    (the summary table's decision accuracy, probe accuracy, recovery, success under injection)."""

    f1: Finding
    f2: Finding
    f3: Finding
    levels: Mapping[str, Mapping[str, Interval]]  # levels[policy][metric]
    advantage_f1: Mapping[str, Finding] = dataclasses.field(default_factory=dict)  # F1 of each `reproduce.advantage` variant

    @property
    def findings(self) -> tuple[Finding, Finding, Finding]:
        return self.f1, self.f2, self.f3

    def to_dict(self) -> dict[str, Any]:
        """summary.json's "findings": the measures by name (F1's gains, the on-policy changes, F3's
        levels and differences) and each finding with its verdict."""
        f1, f3 = self.f1, self.f3
        return {"T_large": f1.facts["T_large"], "T_small": f1.facts["T_small"], **_as_dict(f1.intervals),
                **_as_dict(self.f2.levels), **_as_dict(f3.levels), "mix_minus": _as_dict(f3.intervals),
                **{f.name: f.to_dict() for f in self.findings},
                **({"advantage_F1": {n: f.to_dict() for n, f in self.advantage_f1.items()}} if self.advantage_f1 else {})}


def study_findings(pooled: dict, seed_results: list[dict], names: Sequence[str], ks: Sequence[int], ts: Sequence[int],
                   rep, resamples: int) -> Study:
    """The study of `bmrl reproduce` over pooled (seed, task) units (`pool`) and each seed's evaluations
    of the base and the generous-budget RL policy (`seed_results`, F2's paired states): F1 at
    `rep.small_t`, F2, F3 of `rep.budgetmix` against `rep.generous` and `rep.tight`, the levels, and F1's rule
    applied to each variant of `rep.advantage` (another estimator: does step-level credit change the budget
    dependence?)."""
    k1 = list(ks).index(1)
    g = pooled.get(GROUPS, {})
    one_seed = len(seed_results) == 1
    groups = None if one_seed else g.get("surface")
    boot = dict(num_resamples=max(resamples, 10))
    base, gen = pooled[BASE], pooled[rep.generous]
    pass1 = {n: pooled[n]["surface"][:, k1, :] for n in names if n != BASE}
    f1 = f1_finding(base["surface"][:, k1, :], pass1, ts, main=rep.generous, small_t=rep.small_t, groups=groups, **boot)
    by_advantage = {n: f1_finding(base["surface"][:, k1, :], {n: pass1[n]}, ts, main=n, small_t=rep.small_t,
                                  groups=groups, **boot) for n in rep.advantage if n in pass1}
    on_policy = {out: mean_interval(np.where(np.isfinite(gen[m]) & np.isfinite(base[m]), gen[m] - base[m], np.nan),
                                    groups=g.get(m), key=STREAMS[out], **boot)
                 for m, out in ON_POLICY if m in gen}
    f2 = f2_finding([r[BASE].episodes for r in seed_results], [r[rep.generous].episodes for r in seed_results],
                    on_policy=on_policy, **boot)
    f2 = dataclasses.replace(f2, facts={**f2.facts, "seeds": len(seed_results)})
    f1 = dataclasses.replace(f1, facts={**f1.facts, "seeds": len(seed_results)})
    f3 = f3_finding({n: pooled[n]["surface"] for n in names}, rep.budgetmix, (rep.generous, rep.tight), ks,
                    groups=groups, **boot)
    levels = {n: {m: mean_interval(pooled[n][m], groups=g.get(m), key=STREAMS["level"], **boot) for m in LEVELS if m in pooled[n]}
              for n in names}
    return Study(f1, f2, f3, levels, by_advantage)


def finding_runs(rep) -> dict[str, tuple[str, ...]]:
    """The RL variants whose runs each finding of `bmrl reproduce` reads (the base is SFT, not RL)."""
    return {"F1": (rep.generous,), "F2": (rep.generous,), "F3": (rep.budgetmix, rep.generous, rep.tight)}


def without_dead_runs(study: Study, dead: Mapping[tuple[int, str], str], seeds: Sequence[int], per_seed: list[dict],
                      seed_results: list[dict], names: Sequence[str], ks, ts, rep, resamples: int,
                      untrainable: Sequence[tuple[int, str]] = ()) -> Study:
    """`study` with each finding's `facts["without_dead_runs"]`, each `reproduce.advantage` variant's F1 included:
    whether its verdict holds without the dead RL runs (`dead`: {(seed, variant): reason}; those in `untrainable`
    are dead because their seed's base is one RL cannot learn from), by `DEAD_RUN_RULE`: the finding measured again
    on the seeds where none of the runs it reads is dead (`study_findings` on those seeds' units) and its verdict
    compared."""
    seeds, untrainable = [int(x) for x in seeds], set(untrainable)
    again: dict[tuple[int, ...], Study] = {}

    def checked(f: Finding, reads: Sequence[str], same: Callable[[Study], Finding]) -> Finding:
        runs = [{"seed": s, "variant": v, "reason": dead[(s, v)]} | ({"untrainable_base": True} if (s, v) in untrainable else {})
                for s in seeds for v in reads if (s, v) in dead]
        keep = [i for i, s in enumerate(seeds) if not any((s, v) in dead for v in reads)]
        info: dict[str, Any] = {"study_has_dead_runs": bool(dead), "dead_runs": runs, "rule": DEAD_RUN_RULE,
                                "seeds_without": [seeds[i] for i in keep]}
        if not runs:
            info.update(verdict_without=f.verdict.verdict, holds=True)
        elif not keep:
            info.update(verdict_without=None, holds=None)
        else:
            if tuple(keep) not in again:
                again[tuple(keep)] = study_findings(pool([per_seed[i] for i in keep], list(names)),
                                                    [seed_results[i] for i in keep], names, ks, ts, rep, resamples)
            g = same(again[tuple(keep)])
            info.update(verdict_without=g.verdict.verdict, holds=g.verdict.verdict == f.verdict.verdict,
                        intervals_without=_as_dict(g.intervals))
        return dataclasses.replace(f, facts={**f.facts, "without_dead_runs": info})

    out = {f.name: checked(f, finding_runs(rep)[f.name], lambda s, n=f.name: {x.name: x for x in s.findings}[n])
           for f in study.findings}
    variants = {n: checked(f, (n,), lambda s, n=n: s.advantage_f1[n]) for n, f in study.advantage_f1.items()}
    return dataclasses.replace(study, f1=out["F1"], f2=out["F2"], f3=out["F3"], advantage_f1=variants)


def _pairs(base, trained) -> tuple[list, list]:
    bases, traineds = _seq(base), _seq(trained)
    if len(bases) != len(traineds) or not bases:
        raise ValueError(f"compare pairs seeds: got {len(bases)} base and {len(traineds)} trained evaluations.")
    return bases, traineds


def _check_resamples(num_resamples: int) -> None:
    if num_resamples < 10:
        raise ValueError(f"verdicts need intervals: num_resamples must be >= 10, got {num_resamples}.")


def compare_f2(base, trained, *, num_resamples: int = 1000, confidence: float = 0.95) -> Finding:
    """F2 of two policies, decisions or recovery: `EvalResult`s on the same tasks and keys, or one per
    training seed (two sequences, pair i = seed i; intervals then resample seeds, then tasks within
    seed). The one F2 of a pair: `bmrl compare`, `bmrl eval`'s and reproduce's paired reports read it."""
    bases, traineds = _pairs(base, trained)
    for b, t in zip(bases, traineds):
        if b.num_tasks != t.num_tasks:
            raise ValueError(f"F2 pairs tasks: base has {b.num_tasks}, trained {t.num_tasks}; evaluate both on the "
                             "same tasks.")
    _check_resamples(num_resamples)
    f2 = f2_finding([b.episodes for b in bases], [t.episodes for t in traineds], num_resamples=num_resamples,
                    confidence=confidence)
    return dataclasses.replace(f2, facts={**f2.facts, "seeds": len(bases)})


def compare_findings(base, trained, *, num_resamples: int = 1000, confidence: float = 0.95) -> dict[str, Finding]:
    """F1 (at the grid's smallest and largest T) and F2 (`compare_f2`) of two policies: `EvalResult`s on
    the same tasks, keys and T grid, or one per training seed (two sequences, pair i = seed i; intervals
    then resample seeds, then tasks within seed). Returns {"F1": Finding, "F2": Finding}."""
    bases, traineds = _pairs(base, trained)
    for b, t in zip(bases, traineds):
        if b.ts != bases[0].ts or t.ts != b.ts or b.num_tasks != t.num_tasks or 1 not in b.ks or 1 not in t.ks:
            raise ValueError(
                f"compare needs both evaluations on the same tasks and T grid with K=1: base {b.num_tasks} tasks, "
                f"ts={list(b.ts)}, ks={list(b.ks)}; trained {t.num_tasks} tasks, ts={list(t.ts)}, ks={list(t.ks)}."
            )
    _check_resamples(num_resamples)
    groups = np.repeat(np.arange(len(bases)), [b.num_tasks for b in bases]) if len(bases) > 1 else None
    pass1 = lambda rs: np.concatenate([r.per_task[:, r.ks.index(1), :] for r in rs])  # noqa: E731
    f1 = f1_finding(pass1(bases), {"trained": pass1(traineds)}, bases[0].ts, main="trained", groups=groups,
                    num_resamples=num_resamples, confidence=confidence)
    return {"F1": dataclasses.replace(f1, facts={**f1.facts, "seeds": len(bases)}),
            "F2": compare_f2(bases, traineds, num_resamples=num_resamples, confidence=confidence)}
