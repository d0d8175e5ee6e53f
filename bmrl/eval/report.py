"""Evaluation reports: JSON, PNG plots and a markdown report for one or several named policies.

    paths, summary = write_report("runs/eval", {"base": r0, "rl": r1}, baseline="base")

For every policy: its Pass@(K,T) heatmap and table, trajectory metrics and the decomposition
(decision accuracy on-policy and on the probe set, recovery, back on track, first-error turns, error
injection). With a baseline: paired differences (same tasks, same keys) of every other policy
against it, as a surface with intervals and significance marks, a budget audit at the smallest T,
and paired differences of decision accuracy and recovery. Whether a difference is in decisions or
in recovery is the study's F2, decided by its written rule: the caller passes each policy's F2
`Finding` against the baseline (`bmrl.study.findings.compare_f2`, the one `bmrl compare` reads too)
and the report shows its verdict, sentence and intervals; it has no rule of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bmrl.distributed import main_writes
from bmrl.eval import audit, markdown, plots
from bmrl.eval.bootstrap import Interval, SurfaceInterval, describe_estimator, mean_interval, surface_interval
from bmrl.eval.decompose import decision_accuracy_per_task, recovery_per_task
from bmrl.eval.evaluate import EvalResult
from bmrl.eval.metrics import METRICS
from bmrl.eval.streams import STREAMS


def _check_same_tasks(a: EvalResult, b: EvalResult, names: tuple[str, str]) -> None:
    if a.num_tasks != b.num_tasks or a.ts != b.ts or a.ks != b.ks:
        raise ValueError(
            f"{names[0]} and {names[1]} cannot be paired: tasks {a.num_tasks} vs {b.num_tasks}, ts {a.ts} vs "
            f"{b.ts}, ks {a.ks} vs {b.ks}. Evaluate both on the same tasks and grid."
        )
    for k in set(a.tasks) & set(b.tasks):
        if not np.array_equal(np.asarray(a.tasks[k]), np.asarray(b.tasks[k])):
            raise ValueError(f"{names[0]} and {names[1]} were evaluated on different tasks ({k!r} differs); row i must be the same task.")


def paired_surface(a: EvalResult, b: EvalResult, *, key: int = STREAMS["paired_surface"],
                   names: tuple[str, str] = ("a", "b")) -> SurfaceInterval:
    """Pass@(K,T) of a minus b on the same tasks, with a paired bootstrap interval (the per-task
    difference resampled over tasks, as `bmrl.eval.bootstrap.paired_difference` does)."""
    _check_same_tasks(a, b, names)
    return surface_interval(a.per_task - b.per_task, a.ks, a.ts, key=key, num_resamples=a.surface.num_resamples,
                            confidence=a.surface.confidence)


def _paired_metric(va: np.ndarray, vb: np.ndarray, name: str, num_resamples: int) -> Interval:
    """Mean difference of a per-task metric over tasks where both are defined, with its interval (on
    the stream of `name`)."""
    return mean_interval(np.where(np.isfinite(va) & np.isfinite(vb), va - vb, np.nan), key=STREAMS[f"paired_{name}"],
                         num_resamples=num_resamples)


def paired_decomposition(a: EvalResult, b: EvalResult, *, names: tuple[str, str] = ("a", "b")) -> dict[str, Interval]:
    """a - b in decision accuracy (on-policy; on the probe set when both have it), recovery, and
    success under injected errors (when both have it), paired over tasks (or probe states)."""
    _check_same_tasks(a, b, names)
    r = a.surface.num_resamples
    out = {
        "decision_accuracy": _paired_metric(decision_accuracy_per_task(a.episodes), decision_accuracy_per_task(b.episodes),
                                            "decision_accuracy", r),
        "recovery": _paired_metric(recovery_per_task(a.episodes, a.decomposition.errors)[1],
                                   recovery_per_task(b.episodes, b.decomposition.errors)[1], "recovery", r),
    }
    if a.probe is not None and b.probe is not None and a.probe.correct.shape == b.probe.correct.shape:
        out["probe_accuracy"] = _paired_metric(a.probe.correct.astype(float), b.probe.correct.astype(float),
                                               "probe_accuracy", r)
    if a.injected is not None and b.injected is not None:
        ia, ib = a.injected, b.injected
        out["injected_success"] = _paired_metric(ia.episodes.per_task(ia.episodes.success).mean(1),
                                                 ib.episodes.per_task(ib.episodes.success).mean(1), "injected_success", r)
        out["injected_recovery"] = _paired_metric(recovery_per_task(ia.episodes)[1], recovery_per_task(ib.episodes)[1],
                                                  "injected_recovery", r)
    return out


def _signed(e: Interval) -> str:
    return e.format(signed=True) + (" *" if e.significant else "")


def _surface_rows_shown(ts: tuple[int, ...]) -> list[int]:
    if len(ts) <= 12:
        return list(ts)
    return sorted({ts[0], *ts[:: max(1, len(ts) // 8)], ts[-1]})


def _metric_table(result: EvalResult) -> str:
    d = result.decomposition
    rows = {m.label: str(result.metrics[name]) for name, m in METRICS.items() if m.label}
    rows |= {
        "decision accuracy (on-policy)": str(d.decision_accuracy),
        "errors per acted turn": str(d.error_rate),
        "P(success given an error)": f"{d.recovery} ({d.recovery.num_tasks} tasks with an error)",
        f"P(back on track within {d.window} turns given an error)": str(d.back_on_track),
    }
    if result.probe is not None:
        p = result.probe
        rows[f"decision accuracy on the probe set ({p.correct.size} states, noise {p.noise}, seed {p.seed})"] = str(p.accuracy)
    if result.injected is not None:
        inj = result.injected
        what = f"errors injected at turn(s) {inj.injection['turns']} with p={inj.injection['prob']}" if inj.injection else "injection"
        rows[f"success within the largest cap, {what}"] = str(inj.metrics["success"])
        rows[f"P(success given an error), {what}"] = str(inj.decomposition.recovery)
    return audit.markdown_key_values(rows)


def _recovery_table(result: EvalResult) -> str:
    d = result.decomposition
    hist = d.first_error_hist
    share = lambda t: Interval(hist[t], d.first_error_hist_lower[t], d.first_error_hist_upper[t], result.num_tasks).format()  # noqa: E731
    rows: list[list[object]] = [["none", share(0), ""]]
    for t in range(1, len(hist)):
        if hist[t] <= 0 and t not in d.recovery_by_turn:
            continue
        rec = d.recovery_by_turn.get(t)
        rows.append([t, share(t),
                     f"{rec} ({rec.num_tasks} tasks)" if rec else ""])
    return markdown.table(["first error at turn", "share of attempts", "P(success given it)"], rows, align="right")


def write_report(
    out_dir: str | os.PathLike,
    results: Mapping[str, EvalResult],
    baseline: str | None = None,
    *,
    title: str = "Evaluation report",
    description: str | None = None,
    settings: Mapping[str, Any] | None = None,
    plot: bool = True,
    f2: Callable[[EvalResult, EvalResult], Any] | None = None,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Write results.json, PNG plots and report.md for the named `results` into `out_dir`.

    `baseline`: the name every other policy is compared with (paired; default the first name when
    there are several, none for one). `description`/`settings`: what was evaluated, shown on top.
    `f2(baseline result, other result)`: the study's F2 `Finding` of a pair, decisions or recovery
    (`bmrl.study.findings.compare_f2`, as `bmrl compare` reads it); none = no verdict.
    Returns (paths by kind, summary) where summary[name] = `EvalResult.summary()` and
    summary["comparisons"][f"{name} - {baseline}"] holds the paired differences (and "F2": the
    finding's `to_dict`, its verdict, sentence and intervals). On several processes
    process 0 writes and every process returns once the files are there (`distributed.main_writes`);
    the others get the same summary and no paths.
    """
    if not results:
        raise ValueError("write_report needs at least one named EvalResult.")
    names = list(results)
    for n in names:
        if not n or any(c in n for c in "/\\ "):
            raise ValueError(f"policy name {n!r} must be non-empty without spaces or slashes (it names files).")
    if baseline is None and len(names) > 1:
        baseline = names[0]
    if baseline is not None and baseline not in results:
        raise ValueError(f"baseline {baseline!r} is not one of the results {names}.")
    out_dir = os.fspath(out_dir)
    paths: dict[str, str] = {}
    first = results[names[0]]
    ks, ts = first.ks, first.ts

    comparisons: dict[str, dict[str, Any]] = {}
    diffs: dict[str, SurfaceInterval] = {}
    for n in names:
        if baseline is None or n == baseline:
            continue
        label = f"{n} - {baseline}"
        diffs[n] = paired_surface(results[n], results[baseline], names=(n, baseline))
        decomp = paired_decomposition(results[n], results[baseline], names=(n, baseline))
        comparisons[label] = {
            "surface": diffs[n].to_dict(),
            **{k: v.to_dict() for k, v in decomp.items()},
            "audit": audit.paired_audit(n, baseline, diffs[n], min(ts), ks=[ks[0]]),
        }
        if f2 is not None:
            comparisons[label]["F2"] = f2(results[baseline], results[n]).to_dict()

    summary: dict[str, Any] = {n: r.summary() for n, r in results.items()}
    summary["comparisons"] = {k: {kk: vv for kk, vv in v.items() if kk != "surface"} for k, v in comparisons.items()}

    def write() -> None:
        os.makedirs(out_dir, exist_ok=True)
        if plot:
            paths.update(_plots(out_dir, results, baseline, diffs))
        data = {
            "title": title, "estimator": describe_estimator(first.surface.confidence), "baseline": baseline,
            "settings": dict(settings or {}),
            "policies": {n: r.to_dict() for n, r in results.items()}, "comparisons": comparisons,
        }
        paths["json"] = os.path.join(out_dir, "results.json")
        with open(paths["json"], "w") as f:
            json.dump(data, f, indent=1, default=_json_default)
        paths["report"] = os.path.join(out_dir, "report.md")
        with open(paths["report"], "w") as f:
            f.write(_markdown(title, description, settings, results, baseline, diffs, comparisons, paths))

    # Process 0 writes, every process returns once the files are there; the others get the same
    # summary and no paths (they wrote nothing).
    main_writes("bmrl-report", write)
    return paths, summary


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _plots(out_dir: str, results: Mapping[str, EvalResult], baseline: str | None, diffs: Mapping[str, SurfaceInterval]) -> dict[str, str]:
    paths = {}
    for n, r in results.items():
        paths[f"heatmap_{n}"] = plots.plot_surface_heatmap(
            r.surface.estimate, r.ks, r.ts, os.path.join(out_dir, f"heatmap_{n}.png"), title=f"Pass@(K,T): {n}"
        )
    with_k1 = {n: r for n, r in results.items() if 1 in r.ks}
    if with_k1:
        ts = next(iter(with_k1.values())).ts
        paths["pass1"] = plots.plot_pass1_curves(
            ts, {n: r.pass1() for n, r in with_k1.items()}, os.path.join(out_dir, "pass1_curves.png"), title="Pass@(1,T)"
        )
        inj = {n: r.injected.pass1() for n, r in with_k1.items() if r.injected is not None}
        if inj:
            paths["pass1_injected"] = plots.plot_pass1_curves(
                ts, inj, os.path.join(out_dir, "pass1_injected.png"), title="Pass@(1,T) with injected errors"
            )
    for n, d in diffs.items():
        paths[f"difference_{n}"] = plots.plot_difference_heatmap(
            d.estimate, d.lower, d.upper, d.ks, d.ts, os.path.join(out_dir, f"difference_{n}.png"),
            title=f"Pass@(K,T): {n} - {baseline}", confidence=d.confidence, significant=d.significant(),
        )
    # Decomposition bars: one cluster per metric, one bar per policy.
    groups = ["decision acc.", "P(success|error)", "back on track"]
    getters = [lambda r: r.decomposition.decision_accuracy, lambda r: r.decomposition.recovery,
               lambda r: r.decomposition.back_on_track]
    if all(r.probe is not None for r in results.values()):
        groups.insert(1, "probe acc.")
        getters.insert(1, lambda r: r.probe.accuracy)
    if all(r.injected is not None for r in results.values()):
        groups += ["success (inj.)", "P(success|error) (inj.)"]
        getters += [lambda r: r.injected.metrics["success"], lambda r: r.injected.decomposition.recovery]
    est = {n: [np.nan_to_num(g(r).mean) for g in getters] for n, r in results.items()}
    lo = {n: [np.nan_to_num(g(r).lower) for g in getters] for n, r in results.items()}
    hi = {n: [np.nan_to_num(g(r).upper) for g in getters] for n, r in results.items()}
    paths["decomposition"] = plots.plot_grouped_bars(
        groups, est, os.path.join(out_dir, "decomposition.png"), lower=lo, upper=hi,
        title=f"Decision quality and recovery ({100 * next(iter(results.values())).surface.confidence:g}% intervals)",
        ylabel="probability",
    )
    tm = max(r.episodes.max_turns for r in results.values())
    turns = [str(t) for t in range(1, tm + 1)]
    paths["first_error"] = plots.plot_grouped_bars(
        turns, {n: list(r.decomposition.first_error_hist[1:]) + [0.0] * (tm - r.episodes.max_turns) for n, r in results.items()},
        os.path.join(out_dir, "first_error_turn.png"), title="Turn of the first error (share of attempts)", ylabel="share of attempts",
    )
    return paths


def _markdown(title, description, settings, results, baseline, diffs, comparisons, paths) -> str:
    names = list(results)
    first = results[names[0]]
    pct = int(round(100 * first.surface.confidence))
    lines = [f"# {title}", ""]
    if description:
        lines += [description, ""]
    ts_text = ", ".join(map(str, first.ts))
    mode_text = {
        "exact": "every turn cap T was run for real (one batched rollout, caps per attempt)",
        "truncate": f"each attempt ran once with the largest cap T={first.ts[-1]} and was truncated at every smaller T",
        "both": "every T was run for real and also derived by truncating the largest-cap runs",
    }[first.mode]
    lines += [
        f"{len(names)} polic{'y' if len(names) == 1 else 'ies'} ({', '.join(names)}) on {first.num_tasks} held-out tasks of "
        f"`{first.env}`, {first.attempts} attempts per task, K in {{{', '.join(map(str, first.ks))}}}, T in {{{ts_text}}}; "
        f"{mode_text}. The turn budget was {'SHOWN to' if first.show_budget else 'hidden from'} the policy.",
        "",
        f"{describe_estimator(first.surface.confidence)}.",
        "",
    ]
    if settings:
        lines += [audit.markdown_key_values(dict(settings)), ""]
    all_warnings = [f"{n}: {w}" for n, r in results.items() for w in r.warnings]
    if all_warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in all_warnings] + [""]

    # Headline table and sentences.
    lines += ["## Summary", ""]
    fmt = lambda d: Interval.of(d).format() if d else "n/a"  # noqa: E731
    summary_rows = []
    for n, r in results.items():
        s = r.summary()
        summary_rows.append([n, fmt(s.get("pass1_min_over_T", {})), fmt(s.get("pass1_at_max_T", {})), fmt(s["area"]),
                             r.decomposition.decision_accuracy, r.decomposition.recovery])
    lines.append(markdown.table(
        ["policy", f"Pass@(1,T) at T={first.ts[0]}", f"Pass@(1,T) at T={first.ts[-1]}", "area under Pass@(K,T)",
         "decision accuracy", "P(success given an error)"],
        summary_rows, align=["left"] + ["right"] * 5,
    ))
    lines.append("")
    for n, r in results.items():
        if 1 in r.ks:
            est = r.pass1()[0]
            lines.append(
                f"- {n} succeeds in one attempt with probability {est[-1]:.3f} when allowed {r.ts[-1]} turns and "
                f"{est[0]:.3f} when allowed {r.ts[0]}; with {r.ks[-1]} attempts and {r.ts[-1]} turns, "
                f"{r.surface.estimate[-1, -1]:.3f}."
            )
    for label, c in comparisons.items():
        lines += [f"- {s}" for s in c["audit"]]
        if "F2" in c:
            lines.append(f"- {label}: {c['F2']['sentence']}")
    lines += ["", "![Pass@(1,T)](pass1_curves.png)", "", "![decomposition](decomposition.png)", ""]

    for n, r in results.items():
        lines += [
            f"## {n}", "",
            f"Pass@(K,T) with {pct}% bootstrap intervals over {r.num_tasks} tasks ({r.surface.num_resamples} resamples); "
            "rows are turn caps T, columns attempts K:", "",
            audit.markdown_surface_table(r.surface, _surface_rows_shown(r.ts)), "",
            f"![Pass@(K,T) {n}](heatmap_{n}.png)", "",
            f"Attempts run with the largest cap (T={r.ts[-1]}):", "",
            _metric_table(r), "",
            "First error and recovery after it:", "",
            _recovery_table(r), "",
        ]
        if r.max_abs_difference is not None:
            lines += [f"Largest |exact - truncated| over the grid: {r.max_abs_difference:.4f}.", ""]
        if r.injected is not None:
            inj = r.injected
            lines += [
                f"With errors injected at turn(s) {inj.injection['turns'] if inj.injection else []} "
                f"(p={inj.injection['prob'] if inj.injection else 0}):", "",
                audit.markdown_surface_table(inj.surface, _surface_rows_shown(inj.ts)), "",
            ]
    for n, d in diffs.items():
        c = comparisons[f"{n} - {baseline}"]
        lines += [
            f"## Paired comparison: {n} - {baseline}", "",
            f"Same {d.num_tasks} tasks and the same random keys for both; bold cells: the {pct}% interval excludes 0.", "",
            audit.markdown_surface_table(d, _surface_rows_shown(d.ts), signed=True), "",
            f"![difference](difference_{n}.png)", "",
            markdown.table(["metric", "difference"], [
                [key.replace("_", " "), _signed(Interval.of(c[key]))]
                for key in ("decision_accuracy", "probe_accuracy", "recovery", "injected_success", "injected_recovery")
                if key in c
            ], align=["left", "right"]),
        ]
        lines += ["", *_f2_lines(f"{n} - {baseline}", c["F2"]), ""] if "F2" in c else [""]
    rules = {c["F2"]["rule"] for c in comparisons.values() if "F2" in c}
    lines += [
        "## Definitions", "",
        "- Decision accuracy: the share of the policy's own turns (injected turns excluded) where its action was the "
        "oracle's action in that state; the probe set holds fixed states reached by an eps-noisy oracle, the same for every policy.",
        "- Error: a turn whose action was not the oracle's (wrong, invalid or injected) or where the environment reported "
        "an error (a slip, a failed tool call). Recovery: P(success | first error at turn t), pooled over t.",
        f"- Back on track within m turns (m={first.decomposition.window}): after the first error at turn t, progress "
        "exceeds its value before turn t within m turns (or the task is solved); counted only when the window fits the cap.",
        "- Error injection replaces the action at chosen turns by a random wrong one, so every policy faces the same errors.",
        *[f"- F2, decisions or recovery (the rule of `bmrl compare` and `bmrl reproduce`): {rule}" for rule in rules],
        "",
    ]
    return "\n".join(lines)


def _f2_lines(label: str, f2: Mapping[str, Any]) -> list[str]:
    """The F2 finding of one comparison (`Finding.to_dict`): its three intervals, verdict and sentence."""
    iv = {k: Interval.of(f2["intervals"][k]).format(signed=True)
          for k in ("recovery_minus_clean", "delta_clean_accuracy", "delta_recovery_accuracy")}
    table = markdown.table(["F2 statistic", "verdict", "mean [interval]"], [
        ["D = dRec - dClean (post-error minus clean-state accuracy change)", f2["verdict"], iv["recovery_minus_clean"]],
        ["dClean (clean-state accuracy change)", "", iv["delta_clean_accuracy"]],
        ["dRec (post-error accuracy change)", "", iv["delta_recovery_accuracy"]],
    ])
    return [f"On the states both policies met ({f2['shared_states']['clean']} clean, "
            f"{f2['shared_states']['post_error']} right after a first error):", "", table, "", f"{label}: {f2['sentence']}"]
