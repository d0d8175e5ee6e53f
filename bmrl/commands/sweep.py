"""`bmrl sweep SWEEP.yaml [KEY=VALUE ...]`: run a command over a grid/zip of config values and seeds.

Every run's config is validated before the first one starts (a bad value anywhere: exit status 2,
nothing written). Runs go one after another in this process, each in `<out_dir>/<name>/` with its
resolved config.yaml; finished runs (summary.json present) are skipped on a rerun. At the end,
summary.md and summary.csv list each run's swept values and scalar metrics. Exit status 0 when every
run has finished, 1 when any failed. See docs/configs.md for the sweep file format.
"""

from __future__ import annotations

import argparse
import sys

from bmrl.commands._common import EXIT_CONFIG, ConfigExit


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="Run train/sft/eval/reproduce over a grid or zip of config values and seeds, with a summary table.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep", metavar="SWEEP.yaml", help="sweep file (see configs/sweep_budgets.yaml)")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="dotted config overrides applied to every run, e.g. train.steps=2 (not to swept keys)",
    )
    p.add_argument("--out", default=None, help="sweep directory (default: the file's out_dir, else runs/<name>)")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs; write nothing")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bmrl.config import ConfigError
    from bmrl.rundir import OutputNotWritable
    from bmrl.sweep import load_sweep, run_sweep

    try:
        sweep = load_sweep(args.sweep, args.overrides, out_dir=args.out)
    except ConfigError as err:
        print(f"bmrl sweep: config error: {err}", file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG) from None
    print(f"sweep {args.sweep}: {sweep.spec.command} x {len(sweep.runs)} runs in {sweep.out_dir}")
    if args.dry_run:
        for r in sweep.runs:
            print(f"  {r.name}")
        return 0
    try:
        results = run_sweep(sweep, fail_fast=args.fail_fast)
    except ConfigError as err:  # a run directory made with other settings: refused before any work
        print(f"bmrl sweep: config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except OutputNotWritable as err:
        print(f"bmrl sweep: {err.strerror}", file=sys.stderr)
        return EXIT_CONFIG
    with open(f"{sweep.out_dir}/summary.md") as f:
        print("\n" + f.read())
    failed = [r for r in results if r.status == "failed"]
    if failed:
        print(f"{len(failed)} of {len(sweep.runs)} runs failed: {', '.join(r.name for r in failed)}", file=sys.stderr)
        return 1
    return 0
