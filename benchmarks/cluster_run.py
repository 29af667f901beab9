"""A benchmark's run of emulated-cluster processes (benchmarks.hetero, benchmarks.tta) in a working folder:
the one given with ``--out`` (kept, logs and all) or a temporary one (removed), with Ctrl-C and SIGTERM
ending it after every process and cgroup it started has been removed, and its errors as one line."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_in_workdir(prog: str, out: Path | None, work: Callable[[Path], Any]) -> tuple[int, Any]:
    """``(0, work(folder))``, or the exit status and None: 2 for bad input (ValueError), 1 for a failed run
    (RuntimeError, TimeoutError), 130 for Ctrl-C, 143 for SIGTERM, each said on stderr."""
    from deploy.signals import Terminated, signals_as_exceptions

    keep = out is not None
    workdir = out if out is not None else Path(tempfile.mkdtemp(prefix=f"{prog}-bench-"))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with signals_as_exceptions():
            return 0, work(workdir)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2, None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; every process and cgroup was removed", file=sys.stderr)
        return 130, None
    except Terminated as exc:
        print(f"{prog}: {exc}; every process and cgroup was removed", file=sys.stderr)
        return 143, None
    except (RuntimeError, TimeoutError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if not keep:
            print(f"{prog}: (pass --out DIR to keep the logs)", file=sys.stderr)
        return 1, None
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
