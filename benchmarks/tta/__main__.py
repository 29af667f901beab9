"""`python -m benchmarks.tta` (the package's docstring says what it measures)."""

import sys

from benchmarks.tta.cli import main

if __name__ == "__main__":
    sys.exit(main())
