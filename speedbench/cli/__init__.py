"""The `speedlib` command: argument parsing only; each command's work lives in the package
that owns its data (run, results, report)."""

from speedbench.cli.parser import main

__all__ = ["main"]
