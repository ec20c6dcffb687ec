import sys

from speedbench.cli.parser import main

sys.exit(main())
