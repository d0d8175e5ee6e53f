"""Shared CLI plumbing: `--config FILE` plus dotted overrides, and config errors as exit status 2."""

from __future__ import annotations

import argparse
import sys

EXIT_CONFIG = 2


class ConfigExit(SystemExit):
    """Raised (and caught by `bmrl.cli.main`) to stop before any work with exit status 2."""


def add_config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """`--config FILE` and any number of `key.subkey=value` overrides."""
    parser.add_argument("--config", required=required, help="YAML config file (see configs/)")
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
        print(f"bmrl {prog}: config error: {err}", file=sys.stderr)
        raise ConfigExit(EXIT_CONFIG) from None
