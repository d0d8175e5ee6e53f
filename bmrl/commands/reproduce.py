"""`bmrl reproduce --config FILE`: SFT base, RL under each budget variant, evaluation, report.

See `bmrl.reproduce`. Writes <out_dir>/report.md (findings, summary table, figures), summary.json and
one directory per seed and stage; a rerun skips finished stages (a finished run only re-renders its report
from the saved results). Progress: one line per stage event on stderr. Exit status 2 on a bad config.
"""

from __future__ import annotations

import argparse

from bmrl.commands._common import add_config_args, load_run


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "reproduce",
        help="Reproduce the study: SFT base, RL with fixed and mixed budgets, Pass@(K,T) and recovery report.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, required=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bmrl.assembly import build_reproduce_run
    from bmrl.reproduce import reproduce

    cfg, _ = load_run(args, "reproduce", build_reproduce_run)  # the reproduce section, every variant's buffer
    reproduce(cfg)
    return 0
