"""The figures of `bmrl reproduce`: one per finding, then the Pass@(K,T) surfaces and their differences
from the base, each comparison on one shared colour scale (`bmrl.eval.plots.shared_scale`).

  F1: RL minus base, Pass@(1,T) against T, one line per RL variant (paired over the same units);
  F2: accuracy in clean states and right after an error, base against the generous-budget RL policy
      (the same states for both: F2's verdict intervals);
  F3: Pass@(1,T) (and Pass@(4,T) when K=4 is on the grid) against T, one line per policy.
Every band and error bar is a 95% bootstrap interval over seeds and tasks (`bmrl.eval.bootstrap`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bmrl.eval import plots
from bmrl.eval.bootstrap import bootstrap_stat

INTERVAL = "95% bootstrap interval over seeds and tasks"


@dataclasses.dataclass
class Figures:
    """Paths of the figures written, their captions and the colour scales of the heatmaps."""

    paths: dict[str, str]
    captions: dict[str, str]
    scales: dict[str, tuple[float, float]]  # "surface" and "difference": (vmin, vmax) shared by the group


def _band(stat, *arrays: np.ndarray, groups, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return bootstrap_stat(stat, *arrays, groups=groups, key=seed, num_resamples=max(resamples, 10), confidence=0.95)


def study_figures(out: str, pooled: dict, names: Sequence[str], ks: Sequence[int], ts: Sequence[int], f2: dict[str, Any],
                  generous: str, resamples: int, base: str = "base", groups: np.ndarray | None = None) -> Figures:
    """Write the study's figures under `out/figures`. `pooled[name]["surface"]`: per-unit [N, K, T]
    surfaces (units paired across policies); `f2`: F2's intervals (`bmrl.eval.verdicts.f2_intervals`
    as dicts); `groups`: the seed of each unit (two-level intervals)."""
    fig_dir = os.path.join(out, "figures")
    ks, ts = list(ks), list(ts)
    k1 = ks.index(1)
    paths, captions = {}, {}
    variants = [n for n in names if n != base]
    b = pooled[base]["surface"]

    gains = {n: _band(lambda a: a[:, k1, :].mean(0), pooled[n]["surface"] - b, groups=groups, resamples=resamples, seed=15)
             for n in variants}
    paths["f1_gain"] = plots.plot_curve_panels(ts, {"RL - base, Pass@(1,T)": gains}, os.path.join(fig_dir, "f1_gain.png"),
                                               title="F1: RL's gain over the base at each T", probabilities=False)
    captions["f1_gain"] = (f"F1: Pass@(1,T) of each RL policy minus the base's at every T (paired: the same tasks). "
                           f"Bands: {INTERVAL}.")

    if f2:
        series = {who: [f2[f"{who}_clean_accuracy"]["mean"], f2[f"{who}_recovery_accuracy"]["mean"]] for who in ("base", "trained")}
        bounds = [{who: [f2[f"{who}_clean_accuracy"][x], f2[f"{who}_recovery_accuracy"][x]] for who in series}
                  for x in ("lower", "upper")]
        label = {"base": base, "trained": f"RL {generous}"}
        paths["f2_states"] = plots.plot_grouped_bars(
            ["clean states", "right after an error"], {label[w]: v for w, v in series.items()},
            os.path.join(fig_dir, "f2_states.png"), lower={label[w]: v for w, v in bounds[0].items()},
            upper={label[w]: v for w, v in bounds[1].items()}, title="F2: decision accuracy on the states both met",
            ylabel="P(action = oracle action)")
        captions["f2_states"] = (f"F2: accuracy of the base and of RL {generous} in the clean states and the post-error "
                                 f"states both policies met (paired). Error bars: {INTERVAL}.")

    panels = {}
    for k in (1, 4):
        if k in ks:
            i = ks.index(k)
            panels[f"Pass@({k},T)"] = {n: _band(lambda a, i=i: a[:, i, :].mean(0), pooled[n]["surface"], groups=groups,
                                                resamples=resamples, seed=13) for n in names}
    paths["f3_pass"] = plots.plot_curve_panels(ts, panels, os.path.join(fig_dir, "f3_pass_curves.png"),
                                               title="F3: success across turn budgets T")
    captions["f3_pass"] = f"F3: {' and '.join(panels)} of every policy against T. Bands: {INTERVAL}."

    means = {n: pooled[n]["surface"].mean(0) for n in names}
    vmin, vmax = plots.shared_scale(list(means.values()))
    for n in names:
        paths[f"surface_{n}"] = plots.plot_surface_heatmap(means[n], ks, ts, os.path.join(fig_dir, f"surface_{n}.png"),
                                                           title=f"Pass@(K,T): {n}", vmin=vmin, vmax=vmax)
    captions["surfaces"] = f"Pass@(K,T) surfaces, mean over seeds and tasks, on one colour scale [{vmin:.2f}, {vmax:.2f}]."

    diffs = {n: _band(lambda a: a.mean(0), pooled[n]["surface"] - b, groups=groups, resamples=resamples, seed=14)
             for n in variants}
    lo, hi = plots.shared_scale([d[0] for d in diffs.values()], symmetric=True)
    for n, (est, dlo, dhi) in diffs.items():
        paths[f"diff_{n}"] = plots.plot_difference_heatmap(est, dlo, dhi, ks, ts, os.path.join(fig_dir, f"diff_{n}_vs_base.png"),
                                                           title=f"{n} - base", bound=hi)
    captions["differences"] = (f"Each policy's surface minus the base's, on one colour scale [{lo:+.2f}, {hi:+.2f}]; "
                               f"* = the {INTERVAL} excludes 0.")
    return Figures(paths, captions, {"surface": (vmin, vmax), "difference": (lo, hi)})
