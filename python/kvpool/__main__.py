"""``python -m kvpool``: the kvpool command line (see :mod:`kvpool.cli`)."""

import sys

from kvpool.cli import main

if __name__ == "__main__":
    sys.exit(main())
