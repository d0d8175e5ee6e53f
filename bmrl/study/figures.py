"""The figures of `bmrl reproduce`: one per finding, drawn from that finding's one result
(`bmrl.study.findings.Finding`), then the Pass@(K,T) surfaces and their differences from the base,
each comparison on one shared colour scale (`bmrl.eval.plots.shared_scale`).

  F1: RL minus base, Pass@(1,T) against T, one line per RL variant (paired over the same units; the
      generous variant's line is F1's own intervals: its gains at the small and the largest T);
  F2: accuracy in clean states and right after an error of the base and of the generous-budget RL
      policy, on the states both met (paired): the bars' difference is F2's dClean and dRec;
  F3: Pass@(1,T) (and Pass@(4,T) when K=4 is on the grid) against T, one line per policy.
Every band and error bar is a 95% bootstrap interval over seeds and tasks (`bmrl.eval.bootstrap`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from bmrl.eval import plots
from bmrl.eval.bootstrap import MIN_UNITS_FOR_SIGNIFICANCE, bootstrap_mean, significant
from bmrl.eval.streams import STREAMS
from bmrl.study.findings import Study

INTERVAL = "95% bootstrap interval over seeds and tasks"


@dataclasses.dataclass
class Figures:
    """Paths of the figures written, their captions and the colour scales of the heatmaps."""

    paths: dict[str, str]
    captions: dict[str, str]
    scales: dict[str, tuple[float, float]]  # "surface" and "difference": (vmin, vmax) shared by the group


F2_STATES = {"clean states": "clean_accuracy", "right after an error": "recovery_accuracy"}


def study_figures(out: str, pooled: dict, study: Study | None, names: Sequence[str], ks: Sequence[int],
                  ts: Sequence[int], generous: str, resamples: int, base: str = "base",
                  groups: np.ndarray | None = None) -> Figures:
    """Write the study's figures under `out/figures`: F1, F2, F3 from `study`'s findings (none without
    it), the surfaces and differences from `pooled[name]["surface"]`, per-unit [N, K, T] surfaces
    (units paired across policies; `groups`: the seed of each unit, for two-level intervals)."""
    fig_dir = os.path.join(out, "figures")
    ks, ts = list(ks), list(ts)
    paths, captions = {}, {}
    variants = [n for n in names if n != base]
    b = pooled[base]["surface"]

    if study is not None:
        f1, f2, f3 = study.findings
        paths["f1_gain"] = plots.plot_curve_panels(ts, {"RL - base, Pass@(1,T)": dict(f1.curves)},
                                                   os.path.join(fig_dir, "f1_gain.png"),
                                                   title="F1: RL's gain over the base at each T", probabilities=False)
        captions["f1_gain"] = (f"F1: Pass@(1,T) of each RL policy minus the base's at every T (paired: the same tasks); "
                               f"the {generous} line at T={f1.facts['T_small']} and T={f1.facts['T_large']} is F1's "
                               f"measurement. Bands: {INTERVAL}.")
        iv = f2.intervals
        if all(iv[f"paired_{w}_{m}"].defined for w in ("base", "trained") for m in F2_STATES.values()):
            label = {"base": base, "trained": f"RL {generous}"}
            get = lambda who, a: [getattr(iv[f"paired_{who}_{m}"], a) for m in F2_STATES.values()]  # noqa: E731
            paths["f2_states"] = plots.plot_grouped_bars(
                list(F2_STATES), {label[w]: get(w, "mean") for w in label}, os.path.join(fig_dir, "f2_states.png"),
                lower={label[w]: get(w, "lower") for w in label}, upper={label[w]: get(w, "upper") for w in label},
                title="F2: decision accuracy on the states both met (paired)", ylabel="P(action = oracle action)")
            captions["f2_states"] = (
                f"F2: accuracy of the base and of RL {generous} in the clean states and the post-error states both "
                f"policies met (paired): the difference of the bars is F2's dClean "
                f"{iv['delta_clean_accuracy'].format(signed=True)} and dRec "
                f"{iv['delta_recovery_accuracy'].format(signed=True)}. Each policy's own (on-policy) accuracy, on the "
                f"states it met, is in summary.json (F2's base_* and trained_*). Error bars: {INTERVAL}.")
        paths["f3_pass"] = plots.plot_curve_panels(ts, {k: dict(v) for k, v in f3.curves.items()},
                                                   os.path.join(fig_dir, "f3_pass_curves.png"),
                                                   title="F3: success across turn budgets T")
        captions["f3_pass"] = f"F3: {' and '.join(f3.curves)} of every policy against T. Bands: {INTERVAL}."

    means = {n: pooled[n]["surface"].mean(0) for n in names}
    vmin, vmax = plots.shared_scale(list(means.values()))
    for n in names:
        paths[f"surface_{n}"] = plots.plot_surface_heatmap(means[n], ks, ts, os.path.join(fig_dir, f"surface_{n}.png"),
                                                           title=f"Pass@(K,T): {n}", vmin=vmin, vmax=vmax)
    captions["surfaces"] = f"Pass@(K,T) surfaces, mean over seeds and tasks, on one colour scale [{vmin:.2f}, {vmax:.2f}]."

    diffs = {n: bootstrap_mean(pooled[n]["surface"] - b, groups=groups, key=STREAMS["figure_surface_difference"],
                             num_resamples=max(resamples, 10))
             for n in variants}
    lo, hi = plots.shared_scale([d[0] for d in diffs.values()], symmetric=True)
    for n, (est, dlo, dhi) in diffs.items():
        paths[f"diff_{n}"] = plots.plot_difference_heatmap(est, dlo, dhi, ks, ts, os.path.join(fig_dir, f"diff_{n}_vs_base.png"),
                                                           title=f"{n} - base", bound=hi,
                                                           significant=significant(dlo, dhi, b.shape[0]))
    captions["differences"] = (f"Each policy's surface minus the base's, on one colour scale [{lo:+.2f}, {hi:+.2f}]; "
                               f"* = the {INTERVAL} excludes 0 (over at least {MIN_UNITS_FOR_SIGNIFICANCE} tasks).")
    return Figures(paths, captions, {"surface": (vmin, vmax), "difference": (lo, hi)})
