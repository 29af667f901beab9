"""`python -m benchmarks.transport` (the package's docstring says what it measures)."""

import sys

from benchmarks.transport.cli import main

if __name__ == "__main__":
    sys.exit(main())
