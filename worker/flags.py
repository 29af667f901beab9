"""ps-worker's command line: its flags, the environment variables they are read from, and its exit
statuses. Light: `ps-worker --help` and a bad argument answer before torch loads (worker/cli.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from common.job.endings import ENDED_EARLY
from common.job.registry import ALLOW_IMPORT_FLAG
from common.ops.arg_types import DefaultsHelpFormatter, float_at_least, float_between, host_name, host_port, int_at_least, int_between, positive_float, positive_int
from common.ops.memory import DEFAULT_HEAP_RESERVE_MIB, HEAP_RESERVE_ENV
from common.transport.security import TOKEN_ENV
from worker.env_flags import env_help, parse_with_environment
from worker.probes.resources import DEFAULT_THREADS, MAX_STEP_OVERHEAD_MS

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
"""What --device takes (worker/device.py resolves it)."""
ALLOW_SHARD_HOST_FLAG = "--allow-shard-host"
"""The flag that lets a worker follow its server to shard servers on another host (worker/transport/server_checks.py)."""

ENVIRONMENT = {
    "server": "PS_SERVER",
    "name": "PS_NAME",
    "cores": "PS_CORES",
    "threads": "PS_THREADS",
    "device": "PS_DEVICE",
    "slowdown": "PS_SLOWDOWN",
    "step_overhead_ms": "PS_STEP_OVERHEAD_MS",
    "max_batch": "PS_MAX_BATCH",
    "no_overlap": "PS_NO_OVERLAP",
    "loader_workers": "PS_LOADER_WORKERS",
    "prefetch": "PS_PREFETCH",
    "timeout": "PS_TIMEOUT",
    "retry_for": "PS_RETRY_FOR",
    "log_every": "PS_LOG_EVERY",
    "quiet": "PS_QUIET",
    "tls_ca": "PS_TLS_CA",
    "tls_cert": "PS_TLS_CERT",
    "tls_key": "PS_TLS_KEY",
    "allow_import": "PS_ALLOW_IMPORT",
    "allow_shard_host": "PS_ALLOW_SHARD_HOST",
    "early_end_status": "PS_EARLY_END_STATUS",
}
"""Options and the environment variables they are read from when the flag is not given
(``--token`` reads ``PS_TOKEN`` and ``--heap-reserve`` ``PS_WORKER_HEAP_RESERVE_MIB`` on their own; a
repeatable flag's variable holds a comma-separated list)."""


UNTRUSTED_SERVER = 4
"""ps-worker's exit status after it refused what the server told it (worker/transport/server_checks.py)
and left the job: a status of its own, apart from ENDED_EARLY, which the server's word decides."""
EXIT_STATUSES = (
    "exit status: 0 the job finished, or the server, SIGTERM or Ctrl-C stopped it; 1 it failed while running "
    "(the server out of reach past --retry-for, or refusing a call; the job's data unreadable; a loss not finite); "
    "2 bad input, or a job this worker cannot build (nothing trained); "
    f"{ENDED_EARLY} the server ended the job early, before its last epoch, and exits {ENDED_EARLY} too (the "
    "worker's last line names the reason unless --quiet; --early-end-status gives another); "
    f"{UNTRUSTED_SERVER} the server told this worker something it does not take (a batch beyond its bounds, "
    "values that are not finite, ...), and it left the job."
)
"""What each exit status of ps-worker says, for ``--help``: a script that runs workers alone tells an
early end from a finished job by it, as by ps-server's."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-worker",
        description="Join a parameter server, build the job's model and data, and train until the server ends the job.",
        formatter_class=DefaultsHelpFormatter,
        epilog=env_help(ENVIRONMENT) + f", {TOKEN_ENV} (--token), {HEAP_RESERVE_ENV} (--heap-reserve). "
        + EXIT_STATUSES,
    )
    # required, from the flag or $PS_SERVER (parse_args checks)
    p.add_argument("--server", type=host_port, default=argparse.SUPPRESS, metavar="HOST:PORT",
                   help="the parameter server to join (required: the flag or $PS_SERVER)")
    p.add_argument("--name", default=None, help="worker name shown in logs (unset: host-pid)")
    p.add_argument("--cores", type=positive_float, default=None, help="declared resources for the static plan and the first plan of the others (unset: the CPUs this process may use, its cgroup CPU quota included)")
    p.add_argument("--threads", type=positive_int, default=DEFAULT_THREADS,
                   help="torch intra-op threads (one per worker: torch's default, one per core, oversubscribes cores "
                        "that workers share)")
    p.add_argument("--device", default="auto",
                   help=f"where the model computes: {DEVICE_CHOICES} (auto: a GPU when there is one). In an --allreduce "
                        "job the group uses NCCL when every worker is on its own GPU, gloo otherwise")
    p.add_argument("--slowdown", type=float_at_least(1.0), default=1.0, help="multiply compute time by F by sleeping, to emulate a slow worker (the sleep scales the CPU time the step "
                        "used, capped at its wall time, so a pause mid-step is not multiplied)")
    p.add_argument("--step-overhead-ms", type=float_between(0.0, MAX_STEP_OVERHEAD_MS), default=0.0, metavar="MS",
                   help="spend MS of CPU (busy work, not sleep) in every step's compute, to emulate a fixed per-step "
                        "cost (optimizer, Python, kernel launches); a CPU quota or --slowdown stretches it like real "
                        f"work; at most {MAX_STEP_OVERHEAD_MS:g}")
    p.add_argument("--max-batch", type=positive_int, default=None, metavar="N",
                   help="the most samples this worker's memory holds, told to the server at join: every plan keeps "
                        "its batch at or below N (unset: measured on the job's model before joining, from two probe "
                        "steps; with --micro-batch the memory bounds one micro-batch, not the batch; "
                        "docs/micro-batches.md)")
    p.add_argument("--no-overlap", action="store_true",
                   help="BSP: push the whole gradient after backward (the serial path) instead of streaming gradient "
                        "buckets while backward runs, and take the whole reply before the next forward (the server's "
                        "--no-overlap turns it off for every worker)")
    p.add_argument("--loader-workers", type=int_at_least(0), default=0, metavar="N",
                   help="processes that read and transform the job's samples beside training (0: a thread in this "
                        "process); a dataset held whole in memory is indexed directly at 0 (docs/data.md)")
    p.add_argument("--prefetch", type=positive_int, default=2, metavar="D",
                   help="batches the loader prepares ahead of the one being computed (per loader process, "
                        "DataLoader's prefetch_factor)")
    p.add_argument("--timeout", type=positive_float, default=60.0, metavar="SECONDS",
                   help="how long the server may take to answer: to come up at the start, and every call (Status, "
                        "Heartbeat, Leave, a Pull's header, each pause within a reply's values). A push's reply waits "
                        "for its round: SECONDS + max(60 s, 4 x the recent round time). A Join held until the job "
                        "starts or the open round closes: every SECONDS the worker asks the server's Status what it "
                        "waits for, and gives up when the server does not answer or says nothing it waits for")
    p.add_argument("--retry-for", type=float_at_least(0.0), default=120.0,
                   help="seconds to keep reconnecting (backoff with jitter) when the server goes away or evicts us")
    p.add_argument("--log-every", type=positive_float, default=5.0, help="seconds between progress lines")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--tls-ca", default=None, metavar="PATH", help="connect over TLS, trusting this PEM CA")
    p.add_argument("--tls-cert", default=None, metavar="PATH", help="mutual TLS: this worker's PEM certificate")
    p.add_argument("--tls-key", default=None, metavar="PATH", help="mutual TLS: the PEM private key of --tls-cert")
    p.add_argument("--token", default=None, help=f"token sent with every call (unset: ${TOKEN_ENV})")
    p.add_argument(ALLOW_IMPORT_FLAG, dest="allow_import", action="append", default=None, metavar="MODULE",
                   help="run a job whose model or dataset is a package.module:function factory from MODULE or a "
                        "module inside it (repeatable); the built-in models and data sets need none, and a job "
                        "naming any other module is refused before anything of it is imported")
    p.add_argument(ALLOW_SHARD_HOST_FLAG, dest="allow_shard_host", action="append", type=host_name, default=None,
                   metavar="HOST",
                   help="follow the server to shard servers on HOST too (repeatable); unset: only on the host of "
                        "--server, since the worker sends its token and secret there")
    p.add_argument("--early-end-status", type=int_between(0, 255), default=ENDED_EARLY, metavar="N",
                   help="the exit status after the server ended the job early (ps-server's own); 0 where a supervisor "
                        "restarts a worker on any other status (docker compose's restart: on-failure, a Kubernetes "
                        "Job's restartPolicy: OnFailure): the server's status still says the job ended early")
    p.add_argument("--heap-reserve", type=int, default=argparse.SUPPRESS, metavar="MIB",
                   help="grow the heap by this much at start so that blocks over glibc's 32 MiB mmap threshold "
                        "(activations at large CPU batches) reuse memory instead of taking fresh pages every step; "
                        f"memory is only used as such blocks need it; 0: off (unset: ${HEAP_RESERVE_ENV}, else "
                        f"{DEFAULT_HEAP_RESERVE_MIB})")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with :data:`ENVIRONMENT`'s variables for the flags it does not give."""
    return parse_with_environment(
        build_parser(), None if argv is None else list(argv), ENVIRONMENT, required=("server",)
    )
