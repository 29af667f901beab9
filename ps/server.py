"""`ps-server`: parse the command line, then build the job (ps/server_job.py) and serve it over gRPC until
it ends (ps/server_run.py). The serving side, torch with it, loads once the flags are parsed: --help and
bad arguments answer at once."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from common.ops.memory import tune_malloc
from common.ops.stack_dump import enable_stack_dump
from ps.server_flags import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ps-server; its exit status: 0 finished or stopped, 1 failed at run time, 2 bad input, 3 the job
    ended early (common.job.endings)."""
    tune_malloc()
    enable_stack_dump()
    args = build_parser().parse_args(argv)
    from ps.server_run import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
