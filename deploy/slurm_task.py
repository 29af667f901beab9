"""One task of a Slurm job from ``ps-cluster slurm``: its name, its log, and its CPU quota where asked.

``python -m deploy.slurm_task --names w0,w1 --log-dir DIR [quota options] -- COMMAND...`` runs COMMAND
as the task ``SLURM_PROCID`` picks from ``--names``, with ``PS_NAME`` set to that name (ps-worker
reads it) and its output appended to ``DIR/<name>.log`` (a requeued job keeps adding to it).

With ``--limiter`` it confines COMMAND as ``ps-cluster run`` does (:class:`deploy.cgroups.CpuLimiter`,
the quota reserved: a floor as well as a cap): a group with ``--cores`` CPUs, entered before exec;
with ``--startup-cores`` the group starts at that quota while the worker imports and joins, and drops
to ``--cores`` at the job's first ``adjust`` event in the metrics log ``--settle-on``. Where no cgroup
CPU controller is writable (``auto``), or with ``slowdown``, the task runs unconfined with
``PS_SLOWDOWN`` set to its factor from ``--slowdowns`` instead, the same ratios. This is for a Slurm
whose nodes share a machine (one node emulating a heterogeneous cluster); on a real cluster Slurm's
own allocation is the heterogeneity. SIGTERM (scancel, scontrol requeue) stops COMMAND and removes
the group. The exit status is COMMAND's (128 + N when signal N ended it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common.ops.arg_types import positive_float, positive_int
from deploy.cgroups import CgroupError, CpuLimiter, cleanup_stale, detect_backend
from deploy.run_files import MetricsTail
from deploy.signals import Terminated, signals_as_exceptions

STOP_GRACE_S = 10.0
"""How long COMMAND gets after SIGTERM before SIGKILL (Slurm's KillWait is usually 30 s)."""
POLL_S = 0.1


def _names(text: str) -> list[str]:
    names = text.split(",")
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _factors(text: str) -> list[float]:
    return [positive_float(part) for part in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m deploy.slurm_task", description=__doc__.split("\n\n")[0])
    p.add_argument("--names", type=_names, required=True, help="the task names, one per SLURM_PROCID")
    p.add_argument("--log-dir", type=Path, required=True, help="where <name>.log goes")
    p.add_argument("--limiter", choices=("auto", "cgroup", "slowdown"), default=None,
                   help="confine the task to --cores (unset: Slurm's allocation only)")
    p.add_argument("--cores", type=positive_float, default=None, help="the task's CPU quota, in cores")
    p.add_argument("--period-us", type=positive_int, default=None, help="the CFS period of the quota")
    p.add_argument("--startup-cores", type=positive_float, default=None, help="the quota until the job starts")
    p.add_argument("--settle-on", type=Path, default=None, help="the metrics log whose first adjust starts the job")
    p.add_argument("--slowdowns", type=_factors, default=None, help="each task's factor under the slowdown fallback")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def _command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    if args.limiter is not None and (args.cores is None or args.period_us is None):
        parser.error("--limiter needs --cores and --period-us")
    if args.slowdowns is not None and len(args.slowdowns) != len(args.names):
        parser.error(f"--slowdowns needs one factor per name ({len(args.names)})")
    return command


def task_index(names: Sequence[str], env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """This task's index in ``names``, from ``SLURM_PROCID`` (0 outside Slurm); ValueError if out of range."""
    text = env.get("SLURM_PROCID", "0")
    if not text.isdigit() or int(text) >= len(names):
        raise ValueError(f"SLURM_PROCID {text!r} names no task of {', '.join(names)}")
    return int(text)


def _quota(args: argparse.Namespace, name: str) -> CpuLimiter | None:
    """The task's group (None: no limiter, or the slowdown fallback); CgroupError where 'cgroup' cannot be."""
    if args.limiter in (None, "slowdown"):
        return None
    backend = detect_backend()
    if backend is None:
        if args.limiter == "cgroup":
            raise CgroupError("no writable cgroup CPU controller on this node (needs root on Linux); use "
                              "--limiter auto or slowdown")
        return None
    with contextlib.suppress(CgroupError, OSError):
        cleanup_stale(backend)
    start = args.startup_cores if args.startup_cores is not None and args.settle_on is not None else args.cores
    run = f"slurm-{os.environ.get('SLURM_JOB_ID', 'job')}".replace("+", "-")
    return CpuLimiter.create(name, start, args.period_us, run_id=run, backend=backend, reserve=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()


def run(args: argparse.Namespace, command: list[str]) -> int:
    """Start COMMAND as this task, wait for it, and return its status."""
    index = task_index(args.names)
    name = args.names[index]
    env = {**os.environ, "PS_NAME": name, "PYTHONUNBUFFERED": "1"}
    args.log_dir.mkdir(parents=True, exist_ok=True)
    limiter = _quota(args, name)
    how = "Slurm's allocation only"
    if limiter is not None:
        how = f"a cgroup-v{limiter.backend.version} quota of {args.cores:g} cores"
    elif args.limiter is not None and args.slowdowns is not None:
        env["PS_SLOWDOWN"] = repr(args.slowdowns[index])
        how = f"--slowdown {args.slowdowns[index]:g} (no writable cgroup here)" if args.limiter == "auto" else \
            f"--slowdown {args.slowdowns[index]:g}"
    settle = MetricsTail(args.settle_on) if limiter is not None and args.settle_on is not None else None
    try:
        with signals_as_exceptions() as received, open(args.log_dir / f"{name}.log", "ab") as log:
            node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
            log.write(f"slurm_task: {name} on {node}, {how}\n".encode())
            log.flush()
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, preexec_fn=None if limiter is None else limiter.preexec)
            try:
                while (code := proc.poll()) is None:
                    received.check()
                    if settle is not None and any(e.get("event") == "adjust" for e in settle.read()):
                        assert limiter is not None
                        limiter.set(args.cores)
                        settle = None
                    time.sleep(POLL_S)
            finally:
                _stop(proc)
    except Terminated as exc:
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 130
    finally:
        if limiter is not None:
            limiter.close()
    return code if code >= 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = _command(args, parser)
    try:
        return run(args, command)
    except (ValueError, CgroupError, OSError) as exc:
        print(f"slurm_task: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
