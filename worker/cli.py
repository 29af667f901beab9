"""`ps-worker --server HOST:PORT`: join a job and train with the built-in loop until it ends.

Every setting can also come from an environment variable (:data:`ENVIRONMENT`, e.g. ``PS_SERVER``,
``PS_NAME``), as containers and Kubernetes pods pass them; a flag on the command line wins.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from worker.flags import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    """Run ps-worker; its exit status is one of worker.flags.EXIT_STATUSES'. The flags are parsed first:
    the training loop, torch with it, loads only for a command line that can run."""
    args = parse_args(argv)
    from worker.training_loop import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
