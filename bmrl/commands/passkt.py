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

MAX_GRID_POINTS = 4096  # values of --ks or --ts
DEFAULT_TS_POINTS = 128  # the default T grid: every turn up to this many, else log-spaced
MAX_RESAMPLES = 100_000
MAX_SURFACE_VALUES = 1 << 26  # tasks x len(ks) x len(ts) floats held at once (512 MiB)
MAX_DRAW_VALUES = 1 << 26  # resamples x len(ks) x len(ts) floats held at once


def parse_int_list(text: str, name: str, maximum: int | None = None, max_count: int = MAX_GRID_POINTS) -> list[int]:
    """'1,2,4-8' -> [1, 2, 4, 5, 6, 7, 8] (sorted, unique); at most `max_count` values, each <= `maximum`.

    Sizes are checked before a range is expanded, so '1-1000000000' is refused, not built."""
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
            else:
                a = b = int(part)
        except ValueError:
            raise ValueError(f"{name}: cannot read {part!r}; use integers and ranges like 1,2,4-8.") from None
        if a < 1:
            raise ValueError(f"{name}: values must be >= 1, got {a}.")
        if maximum is not None and b > maximum:
            raise ValueError(f"{name}: {b} is beyond the largest supported value {maximum:,}.")
        if b - a + 1 + len(values) > max_count:
            raise ValueError(f"{name}: more than {max_count} values ({part!r}); pick a coarser grid, e.g. 1-64,128,256.")
        values.update(range(a, b + 1))
    if not values:
        raise ValueError(f"{name}: empty list.")
    return sorted(values)


def default_ts(max_turn: int) -> list[int]:
    """1..max_turn when that is at most DEFAULT_TS_POINTS values, else DEFAULT_TS_POINTS log-spaced
    turns from 1 to max_turn (both included): the grid is bounded by the data and by a fixed size."""
    if max_turn <= DEFAULT_TS_POINTS:
        return list(range(1, max_turn + 1))
    import numpy as np

    return sorted({int(t) for t in np.round(np.geomspace(1, max_turn, DEFAULT_TS_POINTS))} | {max_turn})


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
    from bmrl.logs import LogFields, LogFormatError

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


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before any log is read."""
    from bmrl.logs import MAX_TURN

    if len(args.logs) > 2:
        raise ValueError(f"give one or two logs, got {len(args.logs)}.")
    if args.resamples != 0 and not 10 <= args.resamples <= MAX_RESAMPLES:
        raise ValueError(f"--resamples must be 0 (no intervals) or 10..{MAX_RESAMPLES:,}, got {args.resamples}.")
    if not 0.0 < args.confidence < 1.0:
        raise ValueError(f"--confidence must be in (0, 1), e.g. 0.95, got {args.confidence}.")
    if args.production_cap is not None and not 1 <= args.production_cap <= MAX_TURN:
        raise ValueError(f"--production-cap must be in 1..{MAX_TURN:,}, got {args.production_cap}.")


def _run(args: argparse.Namespace, fields: Any) -> int:
    import numpy as np

    from bmrl.logs import MAX_TURN, read_attempt_log

    _check_args(args)
    names = _run_names(args)
    ks_arg = parse_int_list(args.ks, "--ks", maximum=MAX_TURN) if args.ks else None
    ts_arg = parse_int_list(args.ts, "--ts", maximum=MAX_TURN) if args.ts else None
    fmt = None if args.format == "auto" else args.format
    logs = [read_attempt_log(p, fields, fmt=fmt, skip_bad=args.skip_bad) for p in args.logs]

    n_min = min(int(log.n_per_task.min()) for log in logs)
    if ks_arg:
        ks = ks_arg
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
    ts = ts_arg or default_ts(max_turn)
    cap = args.production_cap
    if cap is not None:
        if cap > max(ts):
            raise ValueError(
                f"--production-cap {cap} is beyond the largest T on the grid ({max(ts)}); the logs cannot say "
                "what happens there. Raise --ts or lower the cap."
            )
        ts = sorted(set(ts) | {cap})
    cells = len(ks) * len(ts)
    tasks = max(len(log.task_ids) for log in logs)
    if tasks * cells > MAX_SURFACE_VALUES or args.resamples * cells > MAX_DRAW_VALUES:
        raise ValueError(
            f"the grid --ks ({len(ks)} values) x --ts ({len(ts)} values) is too large for {tasks:,} tasks and "
            f"{args.resamples:,} resamples: it needs {tasks * cells:,} per-task and {args.resamples * cells:,} resampled "
            f"values (limits {MAX_SURFACE_VALUES:,} and {MAX_DRAW_VALUES:,}); choose fewer K or T values."
        )

    result, report, tables, surfaces, diff = _analyse(args, names, logs, ks, ts, cap)
    os.makedirs(args.out, exist_ok=True)  # only now: bad input leaves nothing behind
    written = []
    for fname, (header, rows) in tables.items():
        written.append(os.path.join(args.out, fname))
        _write_csv(written[-1], header, rows)
    if not args.no_plots:
        written += _plots(args.out, names, surfaces, diff, ks, ts)
    for fname, text in (("passkt.json", json.dumps(result, indent=1)), ("report.md", report)):
        written.append(os.path.join(args.out, fname))
        with open(written[-1], "w") as f:
            f.write(text)

    for warning in result["warnings"]:
        print(warning, file=sys.stderr)
    for sentence in result["audit"]:
        print(sentence)
    if diff is not None and diff.significance_note():
        print(f"{names[1]} - {names[0]}: {diff.significance_note()}")
    for name in names:
        run_info = result["runs"][name]
        print(
            f"{name}: {run_info['tasks']} tasks, {run_info['attempts']} attempts"
            + (f", {run_info['skipped_records']} malformed records skipped" if run_info["skipped_records"] else "")
        )
    print("wrote " + ", ".join(written))
    return 0


def _analyse(args, names, logs, ks, ts, cap) -> tuple[dict, str, dict, dict, Any]:
    """(passkt.json data, report.md text, CSV tables by file name, surfaces, paired difference)."""
    from bmrl.eval import audit
    from bmrl.eval.bootstrap import describe_estimator, surface_interval
    from bmrl.eval.streams import STREAMS

    boot = dict(num_resamples=args.resamples, confidence=args.confidence)
    surfaces, tables, per_task = {}, {}, {}
    result: dict[str, Any] = {"estimator": describe_estimator(args.confidence), "ks": ks, "ts": ts, "runs": {},
                              "audit": [], "warnings": []}
    for i, (name, log) in enumerate(zip(names, logs)):
        per_task[name] = log.per_task(ks, ts)
        s = surface_interval(per_task[name], ks, ts, key=args.seed + STREAMS["passkt_surface"] + i, **boot)
        surfaces[name] = s
        result["runs"][name] = {**log.summary(), "surface": s.to_dict()}
        tables[f"surface_{name}.csv"] = (["k", "t", "estimate", "lower", "upper"], audit.surface_rows(s))
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
        index_a, index_b = a.task_index(), b.task_index()
        shared = [t for t in a.task_ids if t in index_b]
        only_a = [t for t in a.task_ids if t not in index_b]
        only_b = [t for t in b.task_ids if t not in index_a]
        result["unmatched_tasks"] = {names[0]: only_a, names[1]: only_b}
        if only_a or only_b:
            result["warnings"].append(
                f"{len(only_a)} task(s) only in {names[0]} and {len(only_b)} only in {names[1]}: the paired "
                f"difference uses the {len(shared)} shared tasks (listed in passkt.json under unmatched_tasks)."
            )
        if not shared:
            raise ValueError(f"{a.path} and {b.path} share no task ids: nothing to pair.")
        rows_a = [index_a[t] for t in shared]
        rows_b = [index_b[t] for t in shared]
        # Paired: the same resampled tasks for both runs, i.e. the bootstrap of the per-task difference.
        diff = surface_interval(per_task[names[1]][rows_b] - per_task[names[0]][rows_a], ks, ts,
                                key=args.seed + STREAMS["passkt_paired_surface"], **boot)
        result["paired"] = {"difference": f"{names[1]} - {names[0]}", "shared_tasks": len(shared), "surface": diff.to_dict(),
                            "significance": diff.significance_note() or "cells whose interval excludes 0 are significant"}
        tables["difference.csv"] = (["k", "t", "difference", "lower", "upper"], audit.surface_rows(diff))

    if cap is not None:
        for name in names:
            result["audit"] += audit.run_audit(name, surfaces[name], cap)
        if diff is not None:
            result["audit"] += audit.paired_audit(names[1], names[0], diff, cap)
        result["production_cap"] = cap
    return result, _report(names, logs, surfaces, diff, result, cap), tables, surfaces, diff


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
    lines = ["# Pass@(K,T) from logs", "", f"Estimator: {result['estimator']}.", ""]
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
            f"On the {diff.num_tasks} shared tasks; "
            + (diff.significance_note() or "bold cells: the interval excludes 0 (significant)."), "",
            audit.markdown_surface_table(diff, shown, signed=True), "",
            "![difference](difference_heatmap.png)", "",
        ]
    return "\n".join(lines)
