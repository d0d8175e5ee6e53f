"""`bmrl train --config FILE key=value ...`: RL training (rollout + policy-gradient update) with
BudgetMix caps, evaluation at several T, metrics, checkpoints and automatic resume.

Exit status 0 on success, 2 on a config error (nothing written), 1 when training stops on too many
non-finite updates in a row.
"""

from __future__ import annotations

import argparse
import json
import sys

from bmrl.commands._common import add_config_args, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="RL training from a config (resumes from out_dir's checkpoints).",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args, "train")
    from bmrl.config import ConfigError
    from bmrl.train import NonFiniteError, train

    try:
        summary = train(cfg, progress=False if args.no_progress else None)
    except NonFiniteError as err:
        print(f"bmrl train: {err}", file=sys.stderr)
        return 1
    except ConfigError as err:  # found while building the run (e.g. the memory plan): nothing trained
        print(f"bmrl train: config error: {err}", file=sys.stderr)
        return 2
    brief = {k: summary[k] for k in ("steps", "wall_s", "compiles", "skipped_updates", "eval", "policy")}
    print(json.dumps(brief))
    return 0
