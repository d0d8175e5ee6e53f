"""`bmrl passkt LOG [LOG2]`: Pass@(K,T) surfaces, intervals and a budget audit from existing logs.

No model and no training: each log holds one record per attempt (see docs/passkt_logs.md); the
surface is the unbiased per-task estimator with each task's own number of attempts, averaged over
tasks, with bootstrap intervals over tasks. With two logs, the paired difference LOG2 - LOG on the
tasks both share. Exit status 0 on success, 2 on malformed input or arguments.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any

ESTIMATOR = (
    "unbiased per task with its own n: pass@(k,T) = 1 - C(n - c(T), k) / C(n, k), c(T) = attempts "
    "that first succeeded at a turn <= T, averaged over tasks; percentile bootstrap over tasks"
)


def parse_int_list(text: str, name: str) -> list[int]:
    """'1,2,4-8' -> [1, 2, 4, 5, 6, 7, 8] (sorted, unique)."""
    values: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                values.update(range(a, b + 1))
            else:
                values.add(int(part))
        except ValueError:
            raise ValueError(f"{name}: cannot read {part!r}; use integers and ranges like 1,2,4-8.") from None
    if not values:
        raise ValueError(f"{name}: empty list.")
    if min(values) < 1:
        raise ValueError(f"{name}: values must be >= 1, got {min(values)}.")
    return sorted(values)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "passkt",
        help="Pass@(K,T) surfaces and a budget audit from evaluation logs of any harness.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="one or two JSONL/CSV logs (.gz ok); with two, LOG2 - LOG is reported")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--ks", default=None, help="K grid, e.g. 1,2,4,8 or 1-16 (default: powers of 2 up to the fewest attempts of any task)")
    p.add_argument("--ts", default=None, help="T grid, e.g. 1-32 (default: 1..largest logged turn)")
    p.add_argument("--names", default=None, help="comma-separated run names (default: file names)")
    p.add_argument("--production-cap", type=int, default=None, metavar="T", help="audit: compare Pass@(K,T) at this cap with the largest logged T")
    p.add_argument("--budget-visible", action="store_true", help="the agent saw its turn budget (adds the validity warning)")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed records and report how many")
    p.add_argument("--format", choices=("auto", "jsonl", "csv"), default="auto")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    f = p.add_argument_group("field names ('none' turns an optional field off)")
    f.add_argument("--task-field", default="task_id")
    f.add_argument("--attempt-field", default="attempt_id")
    f.add_argument("--turn-field", default="first_success_turn", help="turn of first success, 0/null = never")
    f.add_argument("--turn-list-field", default="turn_success", help="per-turn success list")
    f.add_argument("--success-field", default="success", help="with --turns-field: success flag")
    f.add_argument("--turns-field", default="turns", help="with --success-field: turns used")
    f.add_argument("--budget-field", default="budget_visible", help="true when the agent saw its budget")
    p.set_defaults(func=run)


def _field(value: str) -> str | None:
    return None if value.lower() == "none" else value


def _run_names(args: argparse.Namespace) -> list[str]:
    if args.names:
        names = [n.strip() for n in args.names.split(",")]
        if len(names) != len(args.logs) or len(set(names)) != len(names) or not all(names):
            raise ValueError(f"--names needs {len(args.logs)} distinct names, got {args.names!r}.")
        return names
    names = [os.path.basename(p).split(".")[0] or f"run{i + 1}" for i, p in enumerate(args.logs)]
    if len(set(names)) < len(names):
        names = [f"{n}_{i + 1}" for i, n in enumerate(names)]
    return names


def _write_csv(path: str, header: list[str], rows: list) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def run(args: argparse.Namespace) -> int:
    from bmrl.eval.logs import LogFields, LogFormatError

    try:
        return _run(args, LogFields(
            task=args.task_field,
            attempt=_field(args.attempt_field),
            first_success_turn=_field(args.turn_field),
            turn_success=_field(args.turn_list_field),
            success=_field(args.success_field),
            turns=_field(args.turns_field),
            budget_visible=_field(args.budget_field),
        ))
    except (LogFormatError, ValueError, OSError) as err:
        print(f"bmrl passkt: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, fields: Any) -> int:
    import numpy as np

    from bmrl.eval.logs import read_attempt_log

    if len(args.logs) > 2:
        raise ValueError(f"give one or two logs, got {len(args.logs)}.")
    names = _run_names(args)
    fmt = None if args.format == "auto" else args.format
    logs = [read_attempt_log(p, fields, fmt=fmt, skip_bad=args.skip_bad) for p in args.logs]

    n_min = min(int(log.n_per_task.min()) for log in logs)
    if args.ks:
        ks = parse_int_list(args.ks, "--ks")
        for name, log in zip(names, logs):
            short = log.n_per_task < max(ks)
            if short.any():
                worst = int(np.argmin(log.n_per_task))
                raise ValueError(
                    f"--ks {max(ks)} exceeds the attempts of {int(short.sum())} task(s) in {log.path} (task "
                    f"{log.task_ids[worst]!r} has {int(log.n_per_task[worst])}); Pass@(k,T) needs k <= n, "
                    f"so use --ks up to {n_min}."
                )
    else:
        ks = [2**i for i in range(12) if 2**i <= n_min]
    max_turn = max(max(log.max_turn for log in logs), 1)
    ts = parse_int_list(args.ts, "--ts") if args.ts else list(range(1, max_turn + 1))
    cap = args.production_cap
    if cap is not None:
        if cap < 1:
            raise ValueError(f"--production-cap must be >= 1, got {cap}.")
        if cap > max(ts):
            raise ValueError(
                f"--production-cap {cap} is beyond the largest T on the grid ({max(ts)}); the logs cannot say "
                "what happens there. Raise --ts or lower the cap."
            )
        ts = sorted(set(ts) | {cap})

    os.makedirs(args.out, exist_ok=True)
    result, report, written = _analyse(args, names, logs, ks, ts, cap)
    path = os.path.join(args.out, "passkt.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    written.append(path)
    path = os.path.join(args.out, "report.md")
    with open(path, "w") as f:
        f.write(report)
    written.append(path)

    for warning in result["warnings"]:
        print(warning, file=sys.stderr)
    for sentence in result["audit"]:
        print(sentence)
    for name in names:
        run_info = result["runs"][name]
        print(
            f"{name}: {run_info['tasks']} tasks, {run_info['attempts']} attempts"
            + (f", {run_info['skipped_records']} malformed records skipped" if run_info["skipped_records"] else "")
        )
    print("wrote " + ", ".join(written))
    return 0


def _analyse(args, names, logs, ks, ts, cap) -> tuple[dict, str, list[str]]:
    from bmrl.eval import audit
    from bmrl.eval.bootstrap import bootstrap_pass_at_kt, paired_difference

    out, written = args.out, []
    boot = dict(num_resamples=args.resamples, confidence=args.confidence)
    surfaces = {}
    result: dict[str, Any] = {"estimator": ESTIMATOR, "ks": ks, "ts": ts, "runs": {}, "audit": [], "warnings": []}
    for i, (name, log) in enumerate(zip(names, logs)):
        s = bootstrap_pass_at_kt(log.first_success_turn, ks, ts, n_per_task=log.n_per_task, key=args.seed + i, **boot)
        surfaces[name] = s
        result["runs"][name] = {**log.summary(), "surface": s.to_dict()}
        path = os.path.join(out, f"surface_{name}.csv")
        _write_csv(path, ["k", "t", "estimate", "lower", "upper"], audit.surface_rows(s))
        written.append(path)
        if log.skipped_records:
            result["warnings"].append(f"{name}: skipped {log.skipped_records} malformed records of {log.path}.")
        if log.empty_tasks:
            result["warnings"].append(
                f"{name}: {len(log.empty_tasks)} task(s) had zero valid attempts and are left out: "
                + ", ".join(log.empty_tasks[:10]) + (" ..." if len(log.empty_tasks) > 10 else "")
            )

    visible = [n for n, log in zip(names, logs) if log.budget_visible or args.budget_visible]
    if visible:
        result["warnings"].append(audit.budget_visibility_warning(visible))
    result["budget_visible"] = bool(visible)

    diff = None
    if len(logs) == 2:
        a, b = logs
        index_b = b.task_index()
        shared = [t for t in a.task_ids if t in index_b]
        shared_set = set(shared)
        only_a = [t for t in a.task_ids if t not in index_b]
        only_b = [t for t in b.task_ids if t not in shared_set]
        result["unmatched_tasks"] = {names[0]: only_a, names[1]: only_b}
        if only_a or only_b:
            result["warnings"].append(
                f"{len(only_a)} task(s) only in {names[0]} and {len(only_b)} only in {names[1]}: the paired "
                f"difference uses the {len(shared)} shared tasks (listed in passkt.json under unmatched_tasks)."
            )
        if not shared:
            raise ValueError(f"{a.path} and {b.path} share no task ids: nothing to pair.")
        rows_a = [a.task_index()[t] for t in shared]
        rows_b = [index_b[t] for t in shared]
        diff = paired_difference(
            b.first_success_turn[rows_b], a.first_success_turn[rows_a], ks, ts,
            n_per_task_a=b.n_per_task[rows_b], n_per_task_b=a.n_per_task[rows_a], key=args.seed + 100, **boot,
        )
        result["paired"] = {"difference": f"{names[1]} - {names[0]}", "shared_tasks": len(shared), "surface": diff.to_dict()}
        path = os.path.join(out, "difference.csv")
        _write_csv(path, ["k", "t", "difference", "lower", "upper"], audit.surface_rows(diff))
        written.append(path)

    if cap is not None:
        for name in names:
            result["audit"] += audit.run_audit(name, surfaces[name], cap)
        if diff is not None:
            result["audit"] += audit.paired_audit(names[1], names[0], diff, cap)
        result["production_cap"] = cap

    if not args.no_plots:
        written += _plots(out, names, surfaces, diff, ks, ts)
    return result, _report(names, logs, surfaces, diff, result, cap), written


def _plots(out, names, surfaces, diff, ks, ts) -> list[str]:
    from bmrl.eval import plots

    paths = [
        plots.plot_surface_heatmap(s.estimate, ks, ts, os.path.join(out, f"heatmap_{n}.png"), title=f"Pass@(K,T): {n}")
        for n, s in surfaces.items()
    ]
    curves = {n: (s.estimate[0], s.lower[0], s.upper[0]) for n, s in surfaces.items()}
    paths.append(plots.plot_pass1_curves(
        ts, curves, os.path.join(out, "pass1_curves.png"), title=f"Pass@({ks[0]},T)", ylabel=f"Pass@({ks[0]},T)"
    ))
    if diff is not None:
        paths.append(plots.plot_difference_heatmap(
            diff.estimate, diff.lower, diff.upper, ks, ts, os.path.join(out, "difference_heatmap.png"),
            title=f"Pass@(K,T): {names[1]} - {names[0]}", confidence=diff.confidence, significant=diff.significant(),
        ))
    return paths


def _report(names, logs, surfaces, diff, result, cap) -> str:
    from bmrl.eval import audit

    ts = result["ts"]
    shown = ts if len(ts) <= 12 else sorted({ts[0], *ts[:: max(1, len(ts) // 8)], ts[-1], *( [cap] if cap else [])})
    lines = ["# Pass@(K,T) from logs", "", f"Estimator: {ESTIMATOR}.", ""]
    if result["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in result["warnings"]] + [""]
    if result["audit"]:
        lines += [f"## Budget audit at the production cap T={cap}", ""] + [f"- {s}" for s in result["audit"]] + [""]
    for name, log in zip(names, logs):
        s = surfaces[name]
        info = log.summary()
        lines += [
            f"## {name}", "",
            audit.markdown_key_values({
                "log": log.path, "tasks": info["tasks"], "attempts": info["attempts"],
                "attempts per task": f"{info['attempts_per_task']['min']}..{info['attempts_per_task']['max']}",
                "skipped records": info["skipped_records"], "budget visible": log.budget_visible,
            }),
            "",
            f"Pass@(K,T) with {round(100 * s.confidence)}% bootstrap intervals ({s.num_resamples} resamples over tasks):",
            "", audit.markdown_surface_table(s, shown), "",
            f"![Pass@(K,T) {name}](heatmap_{name}.png)", "",
        ]
    lines += ["![Pass@(1,T) curves](pass1_curves.png)", ""]
    if diff is not None:
        lines += [
            f"## Paired difference: {names[1]} - {names[0]}", "",
            f"On the {diff.num_tasks} shared tasks; bold cells: the interval excludes 0.", "",
            audit.markdown_surface_table(diff, shown, signed=True), "",
            "![difference](difference_heatmap.png)", "",
        ]
    return "\n".join(lines)
