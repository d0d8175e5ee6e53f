"""Evaluation: Pass@(K,T) surfaces with bootstrap intervals, the decomposition, budget audit, plots
(harness logs are read by `bmrl.logs`).

Names are loaded lazily from their modules, so `import bmrl.eval` costs nothing and
`bmrl.eval.bootstrap` / `bmrl.eval.audit` (numpy only) never pull in jax or matplotlib.
To export a new name, add it to `_EXPORTS`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "pass_at_kt": "bmrl.eval.passkt",
    "pass_at_kt_per_task": "bmrl.eval.passkt",
    "success_counts": "bmrl.eval.passkt",
    "reference_pass_at_k": "bmrl.eval.passkt",
    "Interval": "bmrl.eval.bootstrap",
    "SurfaceInterval": "bmrl.eval.bootstrap",
    "mean_interval": "bmrl.eval.bootstrap",
    "bootstrap_mean": "bmrl.eval.bootstrap",
    "bootstrap_pass_at_kt": "bmrl.eval.bootstrap",
    "paired_difference": "bmrl.eval.bootstrap",
    "describe_estimator": "bmrl.eval.bootstrap",
    "STREAMS": "bmrl.eval.streams",
    "EvalSettings": "bmrl.eval.settings",
    "run_audit": "bmrl.eval.audit",
    "paired_audit": "bmrl.eval.audit",
    "budget_visibility_warning": "bmrl.eval.audit",
    "markdown_surface_table": "bmrl.eval.audit",
    "plot_surface_heatmap": "bmrl.eval.plots",
    "plot_difference_heatmap": "bmrl.eval.plots",
    "plot_pass1_curves": "bmrl.eval.plots",
    "plot_grouped_bars": "bmrl.eval.plots",
    "evaluate": "bmrl.eval.evaluate",
    "EvalResult": "bmrl.eval.evaluate",
    "attach_injection": "bmrl.eval.evaluate",
    "injection_at": "bmrl.eval.evaluate",
    "attempt_keys": "bmrl.eval.evaluate",
    "METRICS": "bmrl.eval.metrics",
    "Metric": "bmrl.eval.metrics",
    "Episodes": "bmrl.eval.decompose",
    "Decomposition": "bmrl.eval.decompose",
    "decompose_episodes": "bmrl.eval.decompose",
    "ProbeSet": "bmrl.eval.decompose",
    "ProbeResult": "bmrl.eval.decompose",
    "probe_set": "bmrl.eval.decompose",
    "probe_accuracy": "bmrl.eval.decompose",
    "write_report": "bmrl.eval.report",
    "paired_surface": "bmrl.eval.report",
    "paired_decomposition": "bmrl.eval.report",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from bmrl.eval.audit import budget_visibility_warning, markdown_surface_table, paired_audit, run_audit
    from bmrl.eval.bootstrap import (Interval, SurfaceInterval, bootstrap_mean, bootstrap_pass_at_kt, describe_estimator,
                                     mean_interval, paired_difference)
    from bmrl.eval.passkt import pass_at_kt, pass_at_kt_per_task, reference_pass_at_k, success_counts
    from bmrl.eval.plots import plot_difference_heatmap, plot_grouped_bars, plot_pass1_curves, plot_surface_heatmap
    from bmrl.eval.settings import EvalSettings
    from bmrl.eval.streams import STREAMS


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bmrl.eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
