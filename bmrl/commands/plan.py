"""`bmrl plan --config FILE [KEY=VALUE ...] --hardware NAME[,NAME...]`: does a training config fit on that
hardware, and how long is one RL step?

Prints, per named machine (`bmrl.machines.HARDWARE`), the memory per device by part (parameters, optimizer
state, gradients, the KL reference's copy, one micro-batch's activations, the optimizer step's copies, the
rollout's KV cache, the parameters' compute copy and a tied head's copy) against
the device's memory, and the seconds of one RL step (rollout decode, prefill, learner) under the printed
assumptions: --mfu (learner and prefill FLOP/s / peak) and --bandwidth-share (decode's share of the HBM
bandwidth). When a config does not fit, it names each knob (train.minibatches, train.microbatches,
train.remat, model.lora.rank, mesh.fsdp, mesh.tensor) with its smallest value that fits.

Shapes only: nothing runs on a device, and model.path needs config.json, not the weights. The mesh is the
config's (its -1 axis takes the machine's devices), or every device on the data axis when it cannot form them.

--write-notes rewrites the generated comment block of FILE (between "# --- bmrl plan (generated: ..." and
"# --- end bmrl plan ---"; added after the header comment when absent) with the plans; FILE's other
lines are kept. Give no overrides then but model.path: the notes describe the file. It exits 0 once written.

Exit status 0 when the config fits on every machine named, 1 when it does not fit on one (the output says
so and what fixes it), 2 on a bad config, an unknown machine (the message lists the known ones) or a bad option.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bmrl.commands._common import EXIT_CONFIG, ConfigExit, add_config_args, config_exit, load_config
from bmrl.machines import HARDWARE, Assumptions

EXIT_DOES_NOT_FIT = 1


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1]")
    return value




def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="Memory per device and time per RL step of a config on named hardware; exit 1 when it does not fit.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.add_argument("--hardware", required=True, metavar="NAME[,NAME...]",
                   help=f"machines to plan for, comma-separated: {', '.join(HARDWARE)}")
    p.add_argument("--mfu", type=_share, default=Assumptions.mfu,
                   help=f"learner and prefill FLOP/s as a share of the peak, in (0, 1] (default {Assumptions.mfu})")
    p.add_argument("--bandwidth-share", type=_share, default=Assumptions.bandwidth_share,
                   help=f"decode's share of the HBM bandwidth, in (0, 1] (default {Assumptions.bandwidth_share})")
    p.add_argument("--json", action="store_true", help="print the plans as JSON (bytes and seconds) instead of tables")
    p.add_argument("--write-notes", action="store_true",
                   help="rewrite the generated plan block of the config file (exit 0 once written, fit or not)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bmrl import plan as plan_lib
    from bmrl.config import ConfigError
    from bmrl.registry import UnknownName

    if args.config is None:
        print("bmrl plan: --config FILE is required (the training config to plan).", file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG)
    names = [n.strip() for n in args.hardware.split(",") if n.strip()]
    try:
        machines = [HARDWARE.lookup(n) for n in names or [args.hardware]]
    except UnknownName as err:
        print(f"bmrl plan: {err}", file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG) from None
    if args.write_notes and any(not o.startswith("model.path=") for o in args.overrides):
        print("bmrl plan: --write-notes writes the plan of the file as it is: give no overrides but model.path=DIR.",
              file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG)
    cfg = load_config(args, "plan")
    name = os.path.basename(args.config)
    try:
        mcfg = plan_lib.policy_model_config(cfg)
        plans = [plan_lib.plan(cfg, hw, mfu=args.mfu, bandwidth_share=args.bandwidth_share, mcfg=mcfg, config_name=name)
                 for hw in machines]
    except ConfigError as err:
        raise config_exit("plan", err) from None
    fits = all(p.fits for p in plans)
    if args.write_notes:
        assumptions = Assumptions(args.mfu, args.bandwidth_share)
        block = plan_lib.notes_block(plans, ",".join(names), assumptions)
        with open(args.config, encoding="utf-8") as f:
            text = f.read()
        new = plan_lib.with_notes(text, block)
        if new != text:
            with open(args.config, "w", encoding="utf-8") as f:
                f.write(new)
        print(f"{args.config}: {'updated' if new != text else 'already current'}")
    elif args.json:
        print(json.dumps({"fits": fits, "plans": [p.to_dict() for p in plans]}, indent=1))
    else:
        print("\n\n".join(p.table() for p in plans))
        if not fits:
            print(f"\nbmrl plan: {name} does not fit on "
                  f"{', '.join(p.hardware.name for p in plans if not p.fits)} (exit status {EXIT_DOES_NOT_FIT}).")
    return 0 if fits or args.write_notes else EXIT_DOES_NOT_FIT
