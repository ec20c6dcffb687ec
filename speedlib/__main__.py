"""`python3 -m speedlib ...`: the `speedlib` command where no console script was installed
(a source tree on an offline GPU host, with the library on PYTHONPATH).

The command is the harness's (speedbench.cli.parser); it is imported only when this runs, so that
importing any speedlib module, this one included, never needs the harness."""

import sys


def main() -> int:
    from speedbench.cli.parser import main as cli_main  # noqa: PLC0415 - the harness, only when the command runs

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
