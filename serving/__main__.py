"""`python -m serving`: the command line is serving/cli.py (`python -m serving --help`)."""

import sys

from serving.cli import main

if __name__ == "__main__":
    sys.exit(main())
