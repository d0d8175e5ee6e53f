"""`bmrl reproduce --config FILE`: SFT base, RL under each budget variant, evaluation, report.

See `bmrl.reproduce`. Writes <out_dir>/report.md (findings, summary table, figures), summary.json and
one directory per seed and stage; a rerun skips finished stages. Exit status 2 on a bad config.
"""

from __future__ import annotations

import argparse

import sys

from bmrl.commands._common import EXIT_CONFIG, ConfigExit, add_config_args, load_config


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
    from bmrl.config import ConfigError, check_reproduce
    from bmrl.reproduce import reproduce

    cfg = load_config(args, "reproduce")
    try:
        check_reproduce(cfg)
    except ConfigError as err:
        print(f"bmrl reproduce: config error: {err}", file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG) from None
    reproduce(cfg)
    return 0
