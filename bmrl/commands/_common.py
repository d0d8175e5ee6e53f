"""Shared CLI plumbing: `--config FILE` plus dotted overrides, and config errors as exit status 2.

Commands that start runs (`train`, `sft`, `reproduce`, `eval`) require `--config` and call
`load_run`, which validates the config and builds (so checks) everything the run needs but the
policy, before anything is written: a bad value exits 2 naming the key, with an empty out_dir.

Commands import bmrl's run modules inside their functions, by design: the CLI imports every command
module to build its parser, and jax, the model and the environments load only for the command that runs.
"""

from __future__ import annotations

import argparse
import sys

EXIT_CONFIG = 2


class ConfigExit(SystemExit):
    """Raised to stop before any work with exit status 2 (the message is already printed)."""


def config_exit(prog: str, err: Exception) -> ConfigExit:
    """Print `err` as `bmrl PROG: config error: ...` and return the exit-2 exception to raise."""
    print(f"bmrl {prog}: config error: {err}", file=sys.stderr)
    return ConfigExit(EXIT_CONFIG)


def add_config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """`--config FILE` and any number of `key.subkey=value` overrides."""
    parser.add_argument(
        "--config", required=required,
        help="YAML config file (see configs/)" + ("; required: a run records the file it came from" if required else ""),
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="dotted overrides applied after the file, e.g. budget.kind=mix train.steps=20",
    )


def load_config(args: argparse.Namespace, prog: str):
    """The validated Config of `args`; on a bad one, print the key and what is allowed, exit 2."""
    from bmrl.config import ConfigError, load

    try:
        return load(args.config, args.overrides)
    except ConfigError as err:
        raise config_exit(prog, err) from None


def claim_out(prog: str, path: str, cfg=None, kind: str | None = None) -> dict | None:
    """`bmrl.rundir.RunDir(path).claim(cfg, kind)` with its refusals as exit status 2: an output
    directory that is not writable, or that holds a run made with other settings; returns the
    summary of a finished run (else None)."""
    from bmrl.config import ConfigError
    from bmrl.rundir import OutputNotWritable, RunDir

    try:
        return RunDir(path).claim(cfg, kind)
    except OutputNotWritable as err:
        print(f"bmrl {prog}: {err.strerror}", file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG) from None
    except ConfigError as err:
        raise config_exit(prog, err) from None


def load_run(args: argparse.Namespace, prog: str, build_fn=None):
    """(cfg, run): the validated Config of `args` and its `bmrl.assembly.Run` (`build_fn`, default
    `build_run`), built before anything is written; a bad config, an output directory that is not
    writable or holds another run (`claim_out`), or a runtime fact that fails (buffer, model
    directory, mesh) exits 2."""
    from bmrl.assembly import build_run
    from bmrl.config import ConfigError

    cfg = load_config(args, prog)
    claim_out(prog, cfg.out_dir, cfg if prog in RUN_KINDS else None, RUN_KINDS.get(prog))  # reproduce: its stages
    try:
        return cfg, (build_fn or build_run)(cfg)
    except ConfigError as err:
        raise config_exit(prog, err) from None


RUN_KINDS = {"train": "rl", "sft": "sft"}  # the run-directory kind (bmrl.rundir.SECTIONS) of a command's out_dir;
# reproduce's out_dir is only checked for writing here: each of its stages meets the rule with its own kind
