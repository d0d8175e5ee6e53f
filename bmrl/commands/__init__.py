"""Subcommands of the `bmrl` CLI, one module each; see `bmrl.cli`."""
