"""The evaluation metrics, one table: what each measures of the evaluated attempts, its report row and its
bootstrap stream.

    METRICS.add("reward", Metric(lambda ep: ep.per_task(ep.reward.sum(1)).mean(1), "reward per attempt", 18))

Each metric is a per-task value of the attempts run with the largest cap (`Episodes`: the trajectory's
records grouped by task; NaN where a task leaves it undefined). The evaluator gives each its interval
over tasks (`EvalResult.metrics[name]`, results.json's "metrics"), the report shows those with a label
as rows, in this order. A metric computed from existing records is one entry here; the decomposition's
measures (decision accuracy, recovery, back on track: `bmrl.eval.decompose`) are not in this table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from bmrl.eval.decompose import Episodes
from bmrl.registry import Registry


@dataclasses.dataclass(frozen=True)
class Metric:
    """One evaluation metric: `per_task(episodes) -> float[num_tasks]`, the label of its report row (None:
    results.json only) and its bootstrap stream (`bmrl.eval.streams`: a stream never changes, or the
    metric's intervals do)."""

    per_task: Callable[[Episodes], np.ndarray]
    label: str | None
    stream: int


def _ratio(num, den) -> np.ndarray:
    """num / den per task, NaN where den is 0 (no such turn or attempt)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


def _acted(ep: Episodes) -> np.ndarray:
    return ep.per_task(ep.turn_active).sum((1, 2)).astype(float)


def _turns_to_success(ep: Episodes) -> np.ndarray:
    won = ep.per_task(ep.success)
    return _ratio(np.where(won, ep.per_task(ep.first_success_turn), 0).sum(1), won.sum(1))


METRICS: Registry[Metric] = Registry("evaluation metric", {
    "success": Metric(lambda ep: ep.per_task(ep.success).mean(1), "success within the largest cap", 11),
    "turns_used": Metric(lambda ep: ep.per_task(ep.turns_used).mean(1), "turns used", 12),
    "turns_to_success": Metric(_turns_to_success, "turns to success (successful attempts)", 13),
    "invalid_rate": Metric(lambda ep: _ratio(ep.per_task(ep.invalid & ep.turn_active).sum((1, 2)), _acted(ep)),
                           "invalid replies per acted turn", 14),
    "env_error_rate": Metric(lambda ep: _ratio(ep.per_task(ep.error & ep.turn_active).sum((1, 2)), _acted(ep)),
                             "environment errors per acted turn", 15),
    "truncated": Metric(lambda ep: ep.per_task(ep.truncated).mean(1), None, 16),
    "overflow": Metric(lambda ep: ep.per_task(ep.overflow).mean(1), "attempts stopped by the context buffer", 17),
})

__all__ = ["METRICS", "Metric"]
