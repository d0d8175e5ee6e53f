"""PNG plots for evaluation reports (matplotlib, Agg canvas; pyplot's global state is never used).

Every function writes one file and returns its path: Pass@(K,T) heatmap, difference heatmap with
significance marks, curves over T with interval bands (one panel or several), grouped bars with
error bars. Heatmaps compared side by side take one colour scale (`shared_scale`) through `vmin`,
`vmax` (surfaces) and `bound` (differences, symmetric around 0).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | os.PathLike) -> str:
    """Write `fig` to `path` and return the path, on every process (`bmrl reproduce` draws its figures
    on each): process 0 alone writes (`bmrl.distributed.main_writes`). No barrier: a caller that needs
    the file on disk for the others meets them itself (`eval.report.write_report` draws inside its
    own `main_writes`, on process 0 alone, where a barrier would wait for processes that never come)."""
    from bmrl.distributed import main_writes

    path = os.fspath(path)

    def write() -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fig.savefig(path)

    main_writes(f"bmrl-plot-{os.path.basename(path)}", write, wait=False)
    return path


def _ticks(ax, ks: Sequence[int], ts: Sequence[int]) -> None:
    step_t = max(1, len(ts) // 16)
    step_k = max(1, len(ks) // 16)
    ax.set_xticks(range(0, len(ts), step_t), [str(t) for t in ts][::step_t])
    ax.set_yticks(range(0, len(ks), step_k), [str(k) for k in ks][::step_k])
    ax.set_xlabel("T (turn cap)")
    ax.set_ylabel("K (attempts)")


def shared_scale(arrays: Sequence[np.ndarray], *, symmetric: bool = False) -> tuple[float, float]:
    """(vmin, vmax) covering every finite value of `arrays`; `symmetric`: (-b, b) with b = max |value|."""
    values = np.concatenate([np.asarray(a, float).ravel() for a in arrays])
    values = values[np.isfinite(values)]
    if symmetric:
        bound = max(float(np.abs(values).max()) if values.size else 0.0, 1e-6)
        return -bound, bound
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    return lo, max(hi, lo + 1e-6)


def plot_surface_heatmap(
    surface: np.ndarray, ks: Sequence[int], ts: Sequence[int], path: str | os.PathLike, *, title: str = "Pass@(K,T)",
    vmin: float = 0.0, vmax: float = 1.0,
) -> str:
    """Heatmap of `surface: [len(ks), len(ts)]` on the colour scale [vmin, vmax]; values printed when
    the grid is small."""
    surface = np.asarray(surface, float)
    fig = _figure(max(4.0, 0.35 * len(ts) + 2), max(3.0, 0.3 * len(ks) + 1.5))
    ax = fig.add_subplot()
    im = ax.imshow(surface, origin="lower", aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
    _ticks(ax, ks, ts)
    if surface.size <= 96:
        for (i, j), v in np.ndenumerate(surface):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < vmin + 0.6 * (vmax - vmin) else "black")
    fig.colorbar(im, ax=ax, label="success probability")
    ax.set_title(title)
    return _save(fig, path)


def plot_difference_heatmap(
    difference: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    ks: Sequence[int],
    ts: Sequence[int],
    path: str | os.PathLike,
    *,
    title: str = "Pass@(K,T) difference",
    confidence: float = 0.95,
    significant: np.ndarray | None = None,
    bound: float | None = None,
) -> str:
    """Diverging heatmap of a difference surface on [-bound, bound] (default: its own max |value|);
    '*' marks significant cells (`significant`, e.g. `SurfaceInterval.significant()`; by default the
    cells whose interval excludes 0)."""
    difference = np.asarray(difference, float)
    if significant is None:
        significant = (np.asarray(lower) > 0) | (np.asarray(upper) < 0)
    if bound is None:
        bound = shared_scale([difference], symmetric=True)[1]
    fig = _figure(max(4.0, 0.35 * len(ts) + 2), max(3.0, 0.3 * len(ks) + 1.5))
    ax = fig.add_subplot()
    im = ax.imshow(difference, origin="lower", aspect="auto", cmap="RdBu", vmin=-bound, vmax=bound)
    _ticks(ax, ks, ts)
    for i, j in zip(*np.nonzero(significant)):
        ax.text(j, i, "*", ha="center", va="center", fontsize=9, color="black")
    fig.colorbar(im, ax=ax, label="difference")
    ax.set_title(f"{title}\n* = {round(100 * confidence)}% interval excludes 0")
    return _save(fig, path)


def plot_pass1_curves(
    ts: Sequence[int],
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    path: str | os.PathLike,
    *,
    title: str = "Pass@(1,T)",
    ylabel: str = "Pass@(1,T)",
) -> str:
    """One line per run over T with its (lower, upper) band; `curves[name] = (estimate, lower, upper)`."""
    return plot_curve_panels(ts, {ylabel: curves}, path, title=title)


def plot_curve_panels(
    ts: Sequence[int],
    panels: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]],
    path: str | os.PathLike,
    *,
    title: str = "",
    probabilities: bool = True,
) -> str:
    """One panel per `panels[ylabel]`, side by side; in each, one line per run over T with its
    (lower, upper) band. `probabilities`: y from 0 to 1; otherwise free, with a line at 0 (differences)."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(6.0 * len(panels), 4.0)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (ylabel, curves) in zip(axes, panels.items()):
        for name, (est, lo, hi) in curves.items():
            (line,) = ax.plot(ts, est, marker="o", markersize=3, label=name)
            ax.fill_between(ts, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("T (turn cap)")
        ax.set_ylabel(ylabel)
        if probabilities:
            ax.set_ylim(-0.02, 1.02)
        else:
            ax.axhline(0.0, color="black", linewidth=0.8)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    return _save(fig, path)


def plot_grouped_bars(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    path: str | os.PathLike,
    *,
    lower: Mapping[str, Sequence[float]] | None = None,
    upper: Mapping[str, Sequence[float]] | None = None,
    title: str = "",
    ylabel: str = "",
) -> str:
    """Bars: one cluster per group (e.g. a metric), one bar per series (e.g. a policy), with
    (lower, upper) error bars when given (e.g. bootstrap intervals)."""
    fig = _figure(max(5.0, 1.2 * len(groups) + 2), 4.0)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        values = np.asarray(values, float)
        yerr = None
        if lower is not None and upper is not None and name in lower:
            yerr = np.stack([values - np.asarray(lower[name], float), np.asarray(upper[name], float) - values])
            yerr = np.maximum(yerr, 0.0)
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, yerr=yerr, capsize=3, label=name)
    ax.set_xticks(x, list(groups))
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    return _save(fig, path)
