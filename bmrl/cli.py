"""The `bmrl` command line: one subcommand per module in `bmrl.commands`.

Each command module defines `register(subparsers)`, which adds its parser and sets `func` to a
callable taking the parsed arguments and returning an exit status. Heavy imports (jax, the model)
stay inside those callables, so `bmrl --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from bmrl import commands


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command module's subparser."""
    parser = argparse.ArgumentParser(
        prog="bmrl",
        description="Multi-turn RL for LLM agents with compiled rollouts, BudgetMix and Pass@(K,T).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"bmrl.commands.{info.name}").register(sub)
    return parser


# Commands that compute with JAX: on a multi-process run (a TPU pod slice, several GPU hosts) they
# start `jax.distributed` first; for a single process this is a no-op.
DISTRIBUTED_COMMANDS = ("sft", "train", "eval", "reproduce", "sweep")
# Commands that compile XLA programs: they load the ones compiled before from the persistent cache
# (`bmrl.compile_cache`; BMRL_COMPILE_CACHE=off disables it).
COMPILING_COMMANDS = (*DISTRIBUTED_COMMANDS, "compare", "passkt")


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run the chosen command; returns its exit status."""
    from bmrl import xla_flags

    xla_flags.configure()  # before JAX starts its backend: simulated CPU devices wait, not abort
    args = build_parser().parse_args(argv)
    if args.command in COMPILING_COMMANDS:
        from bmrl.compile_cache import CompileCacheError, enable

        try:
            enable()
        except CompileCacheError as err:
            print(f"bmrl {args.command}: {err}", file=sys.stderr)
            return 2
    if args.command in DISTRIBUTED_COMMANDS:
        from bmrl.distributed import initialize

        initialize()
    from bmrl.config import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as err:  # raised past a command's own checks: still bad input, exit 2, no traceback
        from bmrl.commands._common import config_exit

        exit_ = config_exit(args.command, err)
        _exit_now_if_multiprocess(args.command, exit_.code)
        raise exit_ from None
    except SystemExit as exit_:  # a command's own exit (bad input: status 2, already printed)
        _exit_now_if_multiprocess(args.command, exit_.code)
        raise
    except Exception as err:
        if args.command in DISTRIBUTED_COMMANDS and "jax" in sys.modules:
            from bmrl.distributed import is_multiprocess, stop_after_failure

            if is_multiprocess():  # never wait in the shutdown barrier for peers that may be gone
                stop_after_failure(args.command, err)
        raise


def _exit_now_if_multiprocess(command: str, code: int | str | None) -> None:
    """On a multi-process run, end this process with `code` at once: jax.distributed's shutdown barrier
    would wait minutes for peers still in a collective (they stop on the missing heartbeat instead)."""
    if code not in (0, None) and command in DISTRIBUTED_COMMANDS and "jax" in sys.modules:
        from bmrl.distributed import is_multiprocess

        if is_multiprocess():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    sys.exit(main())
