"""`python -m benchmarks.hostile` (the package's docstring says what it measures)."""

import sys

from benchmarks.hostile.cli import main

if __name__ == "__main__":
    sys.exit(main())
