"""`python -m benchmarks.hetero` (the package's docstring says what it measures)."""

import sys

from benchmarks.hetero.cli import main

if __name__ == "__main__":
    sys.exit(main())
