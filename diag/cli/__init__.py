"""The `diag` command: one subcommand per module of this package."""

from diag.cli.main import main

__all__ = ["main"]
