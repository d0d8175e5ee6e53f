"""`bmrl launch --processes N [--cpu-devices K] [--logs DIR] -- COMMAND ARGS...`: one bmrl command as N
local JAX processes (`bmrl.launch`), the way N hosts run it.

    bmrl launch --processes 2 --cpu-devices 2 -- train --config configs/corridor_tiny.yaml mesh.data=2 mesh.fsdp=2

Sets BMRL_COORDINATOR (127.0.0.1 and a free port), BMRL_NUM_PROCESSES and BMRL_PROCESS_ID for each
process, shows process 0's output here and writes the others' to --logs (default: a temporary
directory, named on stderr), and stops every process as soon as one fails. Exit status: 0 when all
succeed, else the failing process's (128 + signal when it was killed); 2 on bad launcher arguments.
On several hosts start one process per host with the same three variables instead (tpu/run.sh).
"""

from __future__ import annotations

import argparse
import sys

from bmrl.commands._common import EXIT_CONFIG


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch", help="Run a bmrl command as N local JAX processes (multi-host, on one machine).",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--processes", type=int, required=True, help="number of JAX processes (>= 1)")
    p.add_argument("--cpu-devices", type=int, default=None, metavar="K",
                   help="run on the CPU with K simulated devices per process (JAX_PLATFORMS=cpu)")
    p.add_argument("--logs", default=None, metavar="DIR", help="where processes 1..N-1 log (default: a temp dir)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the bmrl command and its arguments, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bmrl.launch import LaunchError, launch

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command[:1] == ["launch"]:
        print("bmrl launch: the command to launch cannot be launch itself.", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return launch([sys.executable, "-m", "bmrl", *command] if command else [], args.processes,
                      cpu_devices=args.cpu_devices, log_dir=args.logs)
    except LaunchError as err:
        print(f"bmrl launch: {err}", file=sys.stderr)
        return EXIT_CONFIG
