"""Submit a batch script with sbatch and follow the job: its state, the server's progress, its exit code.

The state comes from ``scontrol show job`` (its first component: the whole heterogeneous job's
state), or from ``sacct`` once slurmctld has forgotten the job; the progress from the server's
metrics log in the job folder (the plan, each epoch, the test accuracy, a resume after a requeue),
as ``ps-cluster run`` prints it. A requeued job is followed through its next run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from deploy.run_files import MetricsTail
from ps.ops.progress import trained_alongside
from deploy.slurm import METRICS_LOG

ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE"})
"""Job states after which the job runs no more (a requeue would first make it PENDING again)."""
POLL_S = 2.0

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise RuntimeError(f"{argv[0]} is not on PATH: submit from a machine with Slurm's commands") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv)} did not answer within 60 s (is slurmctld up?)") from None


@dataclass(frozen=True)
class JobState:
    """What Slurm says of a job: its state, how often it was requeued, its exit code once ended."""

    state: str
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def exit_status(text: str) -> int | None:
    """Slurm's ``EXIT:SIGNAL`` as one status: the exit code, or 128 + the signal that ended the job."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if match is None:
        return None
    code, signal = int(match[1]), int(match[2])
    return 128 + signal if signal else code


def parse_scontrol(text: str) -> JobState | None:
    """The state of the job in ``scontrol show job -o`` output (its first line: component 0)."""
    line = next((line for line in text.splitlines() if "JobState=" in line), None)
    if line is None:
        return None
    fields = dict(re.findall(r"(\w+)=(\S*)", line))
    state = fields["JobState"].split("+")[0]
    restarts = int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0
    code = exit_status(fields.get("ExitCode", "")) if state in ENDED else None
    return JobState(state, restarts, code, fields.get("Reason", ""), fields.get("NodeList", ""))


def parse_sacct(text: str) -> JobState | None:
    """The state of the job in ``sacct -n -X -P -o State,ExitCode`` output (its first line)."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            state = parts[0].split()[0]
            return JobState(state, 0, exit_status(parts[1]) if state in ENDED else None)
    return None


def query(job_id: int, run: Runner = _run) -> JobState | None:
    """The job's state now, from slurmctld or else from accounting; None if neither knows it."""
    shown = run(["scontrol", "-o", "show", "job", str(job_id)])
    if shown.returncode == 0:
        state = parse_scontrol(shown.stdout)
        if state is not None:
            return state
    accounted = run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State,ExitCode"])
    return parse_sacct(accounted.stdout) if accounted.returncode == 0 else None


def submit(script: Path, run: Runner = _run) -> int:
    """``sbatch --parsable SCRIPT``; the job id. RuntimeError with sbatch's message if it refuses."""
    done = run(["sbatch", "--parsable", str(script)])
    if done.returncode != 0:
        raise RuntimeError(f"sbatch refused {script}: {done.stderr.strip() or done.stdout.strip()}")
    text = done.stdout.strip().split(";")[0].split("+")[0]
    if not text.isdigit():
        raise RuntimeError(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return int(text)


def _batches(event: dict[str, Any]) -> str:
    sizes = event.get("batch_sizes") or {}
    return " ".join(f"{name}={sizes[name]}" for name in sorted(sizes, key=_worker_order))


def _worker_order(name: str) -> tuple[int, str]:
    digits = name.lstrip("w")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def describe(event: dict[str, Any]) -> str | None:
    """The line ``--submit`` prints for one metrics-log event (None: none)."""
    kind = event.get("event")
    if kind == "adjust" and (event.get("adjustments") == 0 and not event.get("changed")):
        return f"plan at step {event.get('step')}: {_batches(event)}"
    if kind == "adjust" and event.get("changed"):
        return f"plan at step {event.get('step')}: {_batches(event)} (adjustment {event.get('adjustments')})"
    if (along := trained_alongside(event)) is not None:
        return f"epoch {event.get('epoch')}: {along}"
    if kind == "epoch":
        rate = event.get("samples_per_s")
        return f"epoch {event.get('epoch')}: {_batches(event)}" + (f" | {rate:.0f} samples/s" if rate else "")
    if kind == "eval":
        return f"test accuracy after epoch {event.get('epoch')}: {100 * event['accuracy']:.1f}%"
    if kind == "resume":
        return f"resumed from its checkpoint at step {event.get('step')} (epoch {event.get('epoch')})"
    if kind == "summary":
        accuracy = event.get("accuracy")
        shown = f"{100 * accuracy:.1f}%" if isinstance(accuracy, (int, float)) else "-"
        ended = "done" if event.get("reason", "finished") == "finished" else f"stopped ({event.get('reason')})"
        return (f"{ended}: {event.get('epochs')} epochs, final plan {_batches(event)}, accuracy {shown}, "
                f"{event.get('samples_per_s')} samples/s")
    return None


def follow(job_id: int, job_dir: Path, out: TextIO = sys.stdout, run: Runner = _run,
           poll_s: float = POLL_S) -> int:
    """Print the job's state changes and progress until it ends; its exit status (1 if it is lost)."""
    tail = MetricsTail(job_dir / METRICS_LOG)
    seen: JobState | None = None
    missing = 0
    while True:
        state = query(job_id, run)
        for event in tail.read():
            line = describe(event)
            if line is not None:
                print(f"  {line}", file=out, flush=True)
        if state is None:
            missing += 1
            if missing >= 5:
                print(f"job {job_id}: Slurm no longer knows it (and keeps no accounting)", file=out, flush=True)
                return 1
        else:
            missing = 0
            if seen is None or (state.state, state.restarts) != (seen.state, seen.restarts):
                requeued = f", requeued {state.restarts}x" if state.restarts else ""
                where = f" on {state.nodes}" if state.state == "RUNNING" and state.nodes else ""
                why = f" ({state.reason})" if state.state == "PENDING" and state.reason not in ("", "None") else ""
                print(f"job {job_id}: {state.state}{where}{why}{requeued}", file=out, flush=True)
            seen = state
            if state.ended:
                time.sleep(min(poll_s, 1.0))  # the last lines of the log, written as the server exited
                for event in tail.read():
                    line = describe(event)
                    if line is not None:
                        print(f"  {line}", file=out, flush=True)
                code = state.exit_code if state.exit_code is not None else 1
                print(f"job {job_id}: {state.state}, exit status {code}", file=out, flush=True)
                return code
        time.sleep(poll_s)
