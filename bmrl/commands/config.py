"""`bmrl config [--config FILE] [KEY=VALUE ...]`: print the resolved, validated config as YAML.

Shows exactly what a run would use: the schema's defaults, then FILE, then the dotted overrides.
A bad config prints the key at fault and what is allowed, and exits with status 2. With
`--docs FILE`, rewrite the generated schema tables in FILE (docs/configs.md) instead.
"""

from __future__ import annotations

import argparse
import sys

from bmrl.commands._common import EXIT_CONFIG, ConfigExit, add_config_args, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "config",
        help="Print the resolved config (defaults + FILE + overrides) as YAML, or exit 2 naming the bad key.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.add_argument("--docs", metavar="FILE", default=None, help="rewrite the schema tables in FILE (e.g. docs/configs.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bmrl import config

    if args.docs is not None:
        try:
            changed = config.update_docs(args.docs)
        except (config.ConfigError, OSError) as err:
            print(f"bmrl config: {err}", file=sys.stderr)
            raise ConfigExit(EXIT_CONFIG) from None
        print(f"{args.docs}: {'updated' if changed else 'already current'}")
        return 0
    cfg = load_config(args, "config")
    sys.stdout.write(config.to_yaml(cfg))
    return 0
