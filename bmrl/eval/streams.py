"""The bootstrap streams: the int key of every interval bmrl reports, in one table.

A stream is the seed of one measure's resamples (`bmrl.eval.bootstrap`, numpy PCG64): two policies
measured on the same stream and units get the same resamples (paired), and a measure keeps its
numbers as long as its stream does. Values repeat across families (a policy's surface and F1 both
draw stream 0): what matters is that a measure's stream never changes. Changing a value here changes
reported intervals.
"""

from __future__ import annotations

STREAMS: dict[str, int] = {
    # one policy (bmrl.eval.evaluate, bmrl.eval.decompose: each decomposition stream + its `key` offset)
    "surface": 0,  # Pass@(K,T) surface (and its truncation)
    "decision_accuracy": 0,
    "error_rate": 1,
    "recovery": 2,
    "back_on_track": 3,
    "success": 4,
    "first_error_hist": 5,
    "area": 7,  # mean of the surface over the grid (EvalResult.summary)
    # EvalResult.metrics: each metric's stream is in its entry of `bmrl.eval.metrics.METRICS` (11-17 so far)
    "probe_accuracy": 17,
    "recovery_by_turn": 100,  # + the 0-based turn of the first error
    # paired differences of two policies (bmrl.eval.report)
    "paired_surface": 0,
    "paired_decision_accuracy": 1,
    "paired_recovery": 2,
    "paired_probe_accuracy": 3,
    "paired_injected_success": 4,
    "paired_injected_recovery": 5,
    # the study (bmrl.study.findings, bmrl.study.figures)
    "F1": 0,
    "F2": 1,
    "F3": 2,  # + the index of the fixed budget
    "delta_decision_accuracy": 4,  # F2's on-policy changes
    "delta_recovery": 5,
    "delta_probe_accuracy": 6,
    "delta_injected_success": 7,
    "F3_level_min_pass1": 8,
    "F3_level_area": 9,
    "level": 12,  # every policy's own levels (the summary table)
    "F3_curve": 13,
    "figure_surface_difference": 14,
    # `bmrl passkt` on logs of any harness (bmrl.commands.passkt: each + --seed)
    "passkt_surface": 0,  # + the index of the log on the command line
    "passkt_paired_surface": 100,  # the paired difference LOG2 - LOG
}
