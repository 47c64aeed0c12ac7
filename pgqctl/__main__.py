"""`python -m pgqctl` runs the command line."""

import sys

from pgqctl.cli import main

if __name__ == "__main__":
    sys.exit(main())
