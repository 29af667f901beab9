"""A heterogeneous Slurm batch job from a profile: the server and each class of worker as one component.

``ps-cluster slurm --profile hl4`` renders one batch script (``#SBATCH hetjob`` between components):

* component 0, the parameter server: one task with ``--server-cpus`` CPUs (in ASP the profile's server
  cores, times ``--scale``, where it gives them);
* one component per class of worker, the workers with the same cores, GPUs and fixed step cost: one
  task per worker, ``--cpus-per-task`` the cores times ``--scale`` rounded up, ``--gres=gpu:N`` where the
  profile gives GPUs. Each task learns its worker from ``SLURM_PROCID``.

At run time the script makes a token once (a 0600 file in the job folder, kept across requeues) and
hands it to every step in ``PS_TOKEN``, never on a command line; starts the server on the first
component's node (its ``NodeAddr``) with ``--port 0 --port-file``; gives the workers that address in
``PS_SERVER``; and keeps the metrics log, the logs and the checkpoints in the job folder. The job is
``--requeue``-able and idempotent: a run that finds a checkpoint resumes from it (``--resume``).

Every task runs through :mod:`deploy.slurm_task`, which writes its log and, with ``--limiter``, puts
it under the profile's CPU quota as the local emulator does: one Slurm node can then emulate a
heterogeneous cluster. Everything here is pure: :func:`render` turns :class:`SlurmOptions` into text.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deploy.cgroups import slowdown_factors
from deploy.profiles import Profile, check_mode, quota_period_us

LIMITERS = ("none", "auto", "cgroup", "slowdown")
"""How tasks are confined inside the allocation: by Slurm alone (none), or as ``ps-cluster run`` does."""
SET_HERE = ("--mode", "--workers", "--host", "--port", "--port-file", "--metrics-log", "--checkpoint-dir",
            "--resume", "--token", "--quiet")
"""ps-server flags the script sets itself."""
TOKEN_FILE = "token"
PORT_FILE = "port"
METRICS_LOG = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
SCRIPT_NAME = "hetero-ps.sbatch"
OUTPUT = "slurm-%j.out"

_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|\d+-\d+")
_MEMORY = re.compile(r"\d+[KMGT]?")
_PYTHON = "$python"
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:+-]*")


@dataclass(frozen=True)
class WorkerClass:
    """Workers with the same resources: one component of the job, one task per worker."""

    names: tuple[str, ...]
    cores: float
    """The profile's cores times the scale: what each worker declares, and its quota with a limiter."""
    gpus: int = 0
    step_overhead_ms: float = 0.0
    slowdowns: tuple[float, ...] = ()
    """Each worker's ``--slowdown`` under the slowdown fallback (max cores / its cores)."""

    @property
    def cpus(self) -> int:
        """Slurm's ``--cpus-per-task``: the cores rounded up (Slurm counts whole CPUs)."""
        return max(1, math.ceil(round(self.cores, 6)))


@dataclass(frozen=True)
class SlurmOptions:
    """What the batch script is made of, besides the profile."""

    profile: Profile
    mode: str = "bsp"
    scale: float = 1.0
    job_args: Sequence[str] = ()
    """The job, as ps-server flags (model, dataset, epochs, ...)."""
    job_name: str = "hetero-ps"
    job_dir: Path | None = None
    """``--chdir``: the job folder (None: the folder sbatch runs in)."""
    python: str = field(default_factory=lambda: sys.executable)
    """The interpreter, on every node, that has hetero-ps installed."""
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    memory: str | None = None
    """``--mem`` of every component (None: the partition's default)."""
    gres: str = "gpu"
    """The generic resource a profile's GPUs are asked for as (``gpu`` or ``gpu:a100``)."""
    server_cpus: int = 1
    limiter: str = "none"
    listen: str | None = None
    """The server's ``--host`` (None: its node's address, which the workers dial)."""

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.limiter not in LIMITERS:
            raise ValueError(f"limiter must be one of {', '.join(LIMITERS)}, got {self.limiter!r}")
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"--scale must be a number > 0, got {self.scale!r}")
        if isinstance(self.server_cpus, bool) or not isinstance(self.server_cpus, int) or self.server_cpus < 1:
            raise ValueError(f"--server-cpus must be a whole number >= 1, got {self.server_cpus!r}")
        for flag, value, pattern in (("--job-name", self.job_name, _WORD), ("--partition", self.partition, _WORD),
                                     ("--account", self.account, _WORD), ("--time", self.time, _TIME),
                                     ("--memory", self.memory, _MEMORY), ("--gres", self.gres, _WORD),
                                     ("--listen", self.listen, _WORD)):
            if value is not None and (len(value) > 200 or not pattern.fullmatch(value)):
                raise ValueError(f"{flag} {value!r} is not a value sbatch takes here")
        if "\n" in self.python or not self.python:
            raise ValueError(f"--python {self.python!r} is not a path")


def worker_classes(profile: Profile, mode: str, scale: float) -> list[WorkerClass]:
    """The profile's workers grouped by (cores, GPUs, step cost), in the order each first appears."""
    allocation = profile.allocation(mode)
    cores = [c * scale for c in allocation.workers]
    factors = slowdown_factors(cores)
    groups: dict[tuple[float, int, float], list[int]] = {}
    for k, share in enumerate(cores):
        gpus = allocation.gpus[k] if allocation.gpus is not None else 0
        overhead = allocation.step_overhead_ms[k] if allocation.step_overhead_ms is not None else 0.0
        groups.setdefault((share, gpus, overhead), []).append(k)
    return [
        WorkerClass(tuple(f"w{k}" for k in members), share, gpus, overhead, tuple(factors[k] for k in members))
        for (share, gpus, overhead), members in groups.items()
    ]


def server_cores(o: SlurmOptions) -> float | None:
    """The server's cores in ASP where the profile gives them (times the scale), else None."""
    allocation = o.profile.allocation(o.mode)
    return allocation.server * o.scale if o.mode == "asp" and allocation.server is not None else None


def server_args(o: SlurmOptions) -> list[str]:
    """ps-server's arguments besides the address, port and the files of the job folder."""
    workers = len(o.profile.allocation(o.mode).workers)
    return ["--mode", o.mode, "--workers", str(workers), "--quiet", *o.job_args]


def _directives(options: Sequence[tuple[str, str | None]]) -> list[str]:
    return [f"#SBATCH --{name}={value}" if value else f"#SBATCH --{name}" for name, value in options]


def _component(o: SlurmOptions, tasks: int, cpus: int, gpus: int = 0) -> list[tuple[str, str | None]]:
    options: list[tuple[str, str | None]] = [("ntasks", str(tasks)), ("cpus-per-task", str(cpus))]
    if o.partition:
        options.append(("partition", o.partition))
    if o.time:
        options.append(("time", o.time))
    if o.memory:
        options.append(("mem", o.memory))
    if gpus:
        options.append(("gres", f"{o.gres}:{gpus}"))
    return options


def components(o: SlurmOptions) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Each component's description and sbatch options: the server first, then each worker class."""
    cores = server_cores(o)
    cpus = max(1, math.ceil(round(cores, 6))) if cores is not None else o.server_cpus
    found = [(f"server: {'%g cores' % cores if cores is not None else 'no quota'}", _component(o, 1, cpus))]
    for c in worker_classes(o.profile, o.mode, o.scale):
        gpus = f", {c.gpus} GPU{'s' if c.gpus != 1 else ''} each" if c.gpus else ""
        found.append((f"{' '.join(c.names)}: {c.cores:g} cores{gpus}", _component(o, len(c.names), c.cpus, c.gpus)))
    return found


def _task(o: SlurmOptions, names: Sequence[str], cores: float | None, period_us: int, startup: float,
          slowdowns: Sequence[float] = (), settle: bool = False) -> list[str]:
    """The deploy.slurm_task command a component's tasks run their program through."""
    argv = [_PYTHON, "-m", "deploy.slurm_task", "--names", ",".join(names), "--log-dir", "$job_dir"]
    if o.limiter != "none" and cores is not None:
        argv += ["--limiter", o.limiter, "--cores", f"{cores:.6g}", "--period-us", str(period_us)]
        if settle:  # start at `startup` cores while the worker imports and joins, as ps-cluster run does
            argv += ["--startup-cores", f"{startup:.6g}", "--settle-on", f"$job_dir/{METRICS_LOG}"]
        if slowdowns and any(f != 1.0 for f in slowdowns):
            argv += ["--slowdowns", ",".join(f"{f:.6g}" for f in slowdowns)]
    return [*argv, "--"]


def _shell(argv: Sequence[str]) -> str:
    """A command line, quoted for bash; ``$python`` and ``$job_dir...`` stay variables."""
    return " ".join(f'"{a}"' if a == _PYTHON or a.startswith("$job_dir") else shlex.quote(a) for a in argv)


def render(o: SlurmOptions) -> str:
    """The batch script."""
    classes = worker_classes(o.profile, o.mode, o.scale)
    s_cores = server_cores(o)
    shares = [c.cores for c in classes] + ([s_cores] if s_cores is not None else [])
    period = quota_period_us(shares)
    startup = max(1.0, *shares)
    heterogeneity = o.profile.allocation(o.mode).heterogeneity
    lines = [
        "#!/bin/bash",
        f"# hetero-ps: profile {o.profile.name} ({o.mode}, HL {heterogeneity:g}, cores x {o.scale:g}), written by "
        "ps-cluster slurm.",
        "# Submit with sbatch; a requeued run resumes from the newest checkpoint in the job folder.",
    ]
    job: list[tuple[str, str | None]] = [("job-name", o.job_name), ("requeue", None), ("open-mode", "append"),
                                         ("output", OUTPUT)]
    if o.job_dir is not None:
        job.append(("chdir", str(o.job_dir)))
    if o.account:
        job.append(("account", o.account))
    for index, (what, options) in enumerate(components(o)):
        if index:
            lines.append("#SBATCH hetjob")
        lines.append(f"# component {index}, {what}")
        lines += _directives([*job, *options] if index == 0 else options)
    server = [_PYTHON, "-m", "ps.server", *server_args(o)]
    lines += ["", "set -uo pipefail", f"python={shlex.quote(o.python)}", 'job_dir="$PWD"',
              'nodes=""; for ((g = 0; g < ${SLURM_HET_SIZE:-1}; g++)); do v=SLURM_JOB_NODELIST_HET_GROUP_$g; nodes+=" $g:${!v:-?}"; done',
              'echo "hetero-ps: job $SLURM_JOB_ID, run $((${SLURM_RESTART_COUNT:-0} + 1)), components on nodes$nodes"',
              "", "# the token: made on the first run, kept for requeues; the steps get it in their environment",
              f'if [ ! -s "$job_dir/{TOKEN_FILE}" ]; then',
              f'    (umask 077 && "$python" -c "import secrets; print(secrets.token_hex(16))" > "$job_dir/{TOKEN_FILE}.new") '
              f'&& mv "$job_dir/{TOKEN_FILE}.new" "$job_dir/{TOKEN_FILE}"',
              "fi",
              f'chmod 600 "$job_dir/{TOKEN_FILE}"',
              f'read -r PS_TOKEN < "$job_dir/{TOKEN_FILE}"',
              "export PS_TOKEN",
              "", "# the server runs on the first component's node, at the address Slurm knows it by",
              'server_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n 1)',
              'server_addr=$(scontrol show node "$server_node" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p" | head -n 1)',
              'server_addr=${server_addr:-$server_node}',
              f"listen={shlex.quote(o.listen) if o.listen else '$server_addr'}",
              "",
              f'rm -f "$job_dir/{PORT_FILE}"',
              f'if ls "$job_dir/{CHECKPOINTS}"/ckpt-*.pt >/dev/null 2>&1; then',
              f'    start=(--resume "$job_dir/{CHECKPOINTS}")',
              f'    echo "hetero-ps: resuming from the newest checkpoint in $job_dir/{CHECKPOINTS}"',
              "else",
              f'    start=(--checkpoint-dir "$job_dir/{CHECKPOINTS}")',
              "fi",
              "srun --het-group=0 " + _shell(_task(o, ["server"], s_cores, period, startup)) + " "
              + _shell(server) + ' --host "$listen" --port 0 --port-file "$job_dir/' + PORT_FILE
              + '" --metrics-log "$job_dir/' + METRICS_LOG + '" "${start[@]}" &',
              "server=$!",
              f'until [ -s "$job_dir/{PORT_FILE}" ]; do',
              '    kill -0 "$server" 2>/dev/null || { wait "$server"; code=$?; echo "hetero-ps: the server exited '
              '($code) before it listened; see $job_dir/server.log"; exit "$(( code ? code : 1 ))"; }',
              "    sleep 0.5",
              "done",
              f'read -r port < "$job_dir/{PORT_FILE}"',
              'export PS_SERVER="$server_addr:$port"',
              'echo "hetero-ps: server on $PS_SERVER ($server_node)"',
              "", "workers=()"]
    for group, c in enumerate(classes, start=1):
        device = "cuda" if c.gpus else "cpu"
        worker = [_PYTHON, "-m", "worker.cli", "--cores", f"{c.cores:.6g}", "--threads", str(c.cpus),
                  "--device", device]
        if c.step_overhead_ms > 0:
            worker += ["--step-overhead-ms", repr(float(c.step_overhead_ms))]
        task = _task(o, c.names, c.cores, period, startup, c.slowdowns, settle=True)
        lines += [f"srun --het-group={group} " + _shell(task) + " " + _shell(worker) + " &", "workers+=($!)"]
    lines += ['wait "$server"', "code=$?",
              "# the workers leave when the job ends; a step that is still there after a minute is stopped",
              "for _ in $(seq 120); do",
              '    alive=0; for pid in "${workers[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done',
              '    [ "$alive" -eq 0 ] && break; sleep 0.5',
              "done",
              'kill "${workers[@]}" 2>/dev/null',
              'wait "${workers[@]}" 2>/dev/null',
              'echo "hetero-ps: the server exited with status $code"',
              'exit "$code"', ""]
    return "\n".join(lines)
