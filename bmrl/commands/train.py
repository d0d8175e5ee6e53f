"""`bmrl train --config FILE key=value ...` (--config required): RL training (rollout + policy-gradient update) with
BudgetMix caps, evaluation at several T, metrics, checkpoints and automatic resume.

Exit status 0 on success (also for a run that already finished: nothing is rewritten); 2 on bad input
(a config error, an unwritable out_dir or one made with other settings, checkpoints that are all corrupt or
hold another model); 3 when a guard stops the run (too many non-finite updates in a row, a checkpoint write that failed, e.g.
a full disk): the last good checkpoint is kept and the same command resumes from it; 1 is a bug.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys

from bmrl.commands._common import add_config_args, load_run


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="RL training from a config (resumes from out_dir's checkpoints).",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, required=True)
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    p.add_argument("--no-eval", action="store_true",
                   help="skip the training-time Pass@(1,T) evaluations (at the start, every eval.every steps, at "
                        "the end): for a policy evaluated elsewhere (bmrl eval), e.g. a bmrl reproduce RL stage "
                        "resumed by hand, which evaluates in its own stage")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bmrl import assembly
    from bmrl.assembly.checks import check_batch_split

    def build(cfg):  # the run, and its rows split over the mesh
        run = assembly.build_run(cfg)
        check_batch_split(cfg, run)
        return run

    cfg, built = load_run(args, "train", build)
    from bmrl.checkpoint import (
        CheckpointMismatch,
        CheckpointNonFinite,
        CheckpointWriteError,
        NoGoodCheckpoint,
        OutputNotWritable,
    )
    from bmrl.config import ConfigError
    from bmrl.train import NonFiniteError, train

    try:
        summary = train(cfg, progress=False if args.no_progress else None, run=built, evaluate=not args.no_eval)
    except (NonFiniteError, CheckpointNonFinite, CheckpointWriteError) as err:
        print(f"bmrl train: stopped: {err}", file=sys.stderr)
        return 3
    except (OutputNotWritable, NoGoodCheckpoint, CheckpointMismatch) as err:
        print(f"bmrl train: {err.strerror if isinstance(err, OSError) else err}", file=sys.stderr)
        return 2
    except ConfigError as err:  # found while building the run (e.g. the memory plan): nothing trained
        print(f"bmrl train: config error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk while writing metrics, the policy or the summary
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"bmrl train: stopped: no space left on device writing {err.filename or cfg.out_dir}; the last "
              "checkpoint is kept. Free space and rerun the same command to resume.", file=sys.stderr)
        return 3
    brief = {k: summary[k] for k in ("steps", "wall_s", "compiles", "skipped_updates", "eval", "policy")}
    print(json.dumps(brief))
    return 0
