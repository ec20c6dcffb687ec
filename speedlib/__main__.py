"""`python3 -m speedlib ...`: the `speedlib` command where no console script was installed
(a source tree on an offline GPU host, with the library on PYTHONPATH)."""

import sys

from speedbench.cli import main

sys.exit(main())
