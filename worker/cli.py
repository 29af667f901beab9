"""`ps-worker --server HOST:PORT`: join a job and train with the built-in loop until it ends.

Every setting can also come from an environment variable (:data:`ENVIRONMENT`, e.g. ``PS_SERVER``,
``PS_NAME``), as containers and Kubernetes pods pass them; a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import math
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from common.job.endings import ENDED_EARLY, ended_early
from common.job.registry import ALLOW_IMPORT_FLAG
from common.ops.arg_types import DefaultsHelpFormatter, float_at_least, float_between, host_name, host_port, int_at_least, int_between, positive_float, positive_int
from common.ops.memory import DEFAULT_HEAP_RESERVE_MIB, HEAP_RESERVE_ENV, heap_reserve_mib, tune_for_training
from common.ops.stack_dump import enable_stack_dump
from common.transport.security import TOKEN_ENV, resolve_token
from worker.accumulate import backward_in_micro_batches, backward_with_sub_norm
from worker.transport.channel import channel_credentials
from worker.transport.client import ServerError
from worker.transport.server_error import printable
from worker.connection import DEFAULT_THREADS, connect
from worker.runtime import Session
from worker.device import DEVICE_CHOICES, resolve_device
from worker.env_flags import env_help, parse_with_environment
from worker.probes.cpu_parts import PROBE
from worker.probes.stall_hook import stall_while_asked
from worker.data.job_build import JobSetupError
from worker.data.loader import LoaderError, LoaderOptions
from worker.transport.server_checks import ALLOW_SHARD_HOST_FLAG, UntrustedReply
from worker.probes.resources import MAX_STEP_OVERHEAD_MS, default_cores
from worker.stop_signal import StopSignal
from worker.runtime import Session

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


class NonFiniteLoss(RuntimeError):
    """A step's loss is NaN or Inf: its gradient would be too, which the server refuses."""


def non_finite_loss(said: str, x: torch.Tensor, model: torch.nn.Module, servers: bool) -> NonFiniteLoss:
    """The error of a step whose loss is not finite (`said`: the step and its loss), naming where it
    came from: a sample of `x` that is not finite, else the model's parameters and their largest
    magnitude. `servers`: they are the server's as its last reply sent them (the PS path: the worker
    never steps them itself), and the line names them so. They are not refused on their size: a
    learning rate that diverges makes a legitimate server's huge and finite as well (past 1e33 in
    tests/e2e/test_worker_lifecycle.py's job), and a bound below that would refuse a model whose
    large values the forward never multiplies; the loss is what shows no forward survives them."""
    tail = "; the server refuses a gradient that is not finite"
    if not bool(torch.isfinite(x).all()):
        return NonFiniteLoss(f"{said}: a sample holds NaN or Inf{tail}")
    largest = max((float(p.detach().abs().max()) for p in model.parameters() if p.numel()), default=0.0)
    if servers:
        return NonFiniteLoss(f"{said} on finite samples, from the server's parameters as it sent them (the largest "
                             f"|value| {largest:.3g}): its learning rate diverged, or it sent values this model "
                             f"cannot compute with{tail}")
    return NonFiniteLoss(f"{said} on finite samples, at parameters whose largest |value| is {largest:.3g}: the "
                         f"learning rate diverged{tail}")


def train(session: Session, log_every: float = 5.0, quiet: bool = False, stop: threading.Event | None = None) -> None:
    """The built-in loop: cross-entropy on the job's data, one push per step (accumulated over the
    job's micro-batches, if it has them). A progress line after the first step, then every
    ``log_every`` seconds. NonFiniteLoss before a push whose loss is not finite, unless the reply that
    streamed the parameters in during its forward was refused (that reply's error, UntrustedReply).
    KeyboardInterrupt before a step once `stop` is set (a stop signal: worker/stop_signal.py)."""
    model = session.model
    last_log = -math.inf
    for x, y in session.batches():
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        sub = session.sub_batch
        if sub and session.spec.micro_batch == 1 and (session.pass_samples is None or session.pass_samples >= len(x)):
            loss, _ = backward_with_sub_norm(model, x, y, sub, F.cross_entropy, session.paused_push, session.note_sub_norm)
        else:
            loss = backward_in_micro_batches(model, x, y, session.spec.micro_batch, F.cross_entropy, session.pass_samples)
        if not bool(torch.isfinite(loss)):
            session.wait_params()  # a reply refused while its values streamed into this forward: its own error
            raise non_finite_loss(f"step {session.steps + 1} (epoch {session.epoch}, batch {len(x)}): the loss is "
                                  f"{float(loss)}", x, model, servers=not session.spec.allreduce)
        stall_while_asked(session.name)  # a test hook: no effect unless $PS_WORKER_STALL_DIR is set
        session.step()
        if not quiet and time.monotonic() - last_log >= log_every:
            last_log = time.monotonic()
            print(
                f"{session.name}: epoch {session.epoch} step {session.steps} batch {session.batch_size} "
                f"compute {session.last_compute_ms:.1f} ms (data wait {session.data_wait_ms:.1f}) loss {float(loss.detach()):.4f}",
                file=sys.stderr,
                flush=True,
            )


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


def show_worker_lines() -> None:
    """The runtime's lines for people (the server unreachable, lost, rejoined: the ``worker`` logger)
    on stderr as they are."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("worker")
    logger.addHandler(handler)
    logger.propagate = False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with :data:`ENVIRONMENT`'s variables for the flags it does not give."""
    return parse_with_environment(
        build_parser(), None if argv is None else list(argv), ENVIRONMENT, required=("server",)
    )


def end_line(session: Session) -> str:
    """The worker's last line: its steps, and why the job ended where the server stopped it before its
    epochs (the survivors of a leave cannot hold the global batch), which "job done" would hide."""
    parked = f" ({session.parked_polls} polls while parked)" if session.parked_polls else ""
    streamed = f", {session.streamed_replies} replies streamed in forward order" if session.streamed_replies else ""
    reason = printable(session.plan.reason)  # the server's words: no escape sequence, no line of its own
    ended = "job done" if reason in ("", "finished") else f"job ended ({reason})"
    return f"{session.name}: {ended} after {session.steps} steps{parked}{streamed}"


def end_status(reason: str, early_end_status: int = ENDED_EARLY) -> int:
    """ps-worker's exit status once the server ended the job for `reason`: `early_end_status` after an
    early end (--early-end-status: by default ENDED_EARLY, as ps-server exits), 0 after a finished or
    stopped job and where the server gave no reason."""
    return early_end_status if reason and ended_early(reason) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ps-worker; its exit status is one of EXIT_STATUSES'."""
    args = parse_args(argv)
    try:
        token = resolve_token(args.token)
        channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
        device = resolve_device(args.device)
        heap_reserve = heap_reserve_mib(getattr(args, "heap_reserve", None))
    except ValueError as exc:
        print(f"ps-worker: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    tune_for_training(heap_reserve)
    show_worker_lines()
    stop = StopSignal()
    enable_stack_dump()
    cores = args.cores if args.cores is not None else default_cores()
    code = 0
    try:
        with connect(args.server, args.name, cores, args.slowdown, args.timeout, retry_for=args.retry_for, device=device,
                     threads=args.threads, step_overhead_ms=args.step_overhead_ms, max_batch=args.max_batch,
                     overlap=not args.no_overlap, loader=LoaderOptions(args.loader_workers, args.prefetch), token=token,
                     tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                     allow_imports=args.allow_import or (), allow_shard_hosts=args.allow_shard_host or ()) as session:
            if not args.quiet:
                print(f"{session.name}: joined as {session.worker_id} on {session.device}, batch {session.batch_size}",
                      file=sys.stderr, flush=True)
            train(session, args.log_every, args.quiet, stop.requested)
            if not args.quiet:
                print(end_line(session), file=sys.stderr, flush=True)
            code = end_status(session.plan.reason, args.early_end_status)
    except ServerError as exc:  # each error line made printable: it may quote what the server said
        print(f"ps-worker: error: {printable(str(exc))}", file=sys.stderr)
        code = 1
    except LoaderError as exc:  # the dataset failed to give a batch (a corrupt file: its name)
        print(f"ps-worker: error: reading the job's data: {printable(str(exc))}", file=sys.stderr)
        code = 1
    except JobSetupError as exc:  # the job names a model or dataset this worker cannot build
        print(f"ps-worker: error: {printable(str(exc))}", file=sys.stderr)
        code = 2
    except NonFiniteLoss as exc:  # nothing it could push would be taken: it left
        print(f"ps-worker: error: {printable(str(exc))}; leaving the job", file=sys.stderr)
        code = 1
    except UntrustedReply as exc:  # the server told this worker something it does not take: it left
        print(f"ps-worker: error: {printable(str(exc))}; leaving the job", file=sys.stderr)
        code = UNTRUSTED_SERVER
    except KeyboardInterrupt:
        code = 0
    # Past connect(), threads of gRPC, torch and the step overlap may still be alive (a SIGTERM can
    # land anywhere): an interpreter shutdown runs C++ destructors under them ("terminate called
    # without an active exception", SIGABRT), and a channel close that hung (PSClient.close) holds its
    # thread up. Nothing is left to finalize, so the worker leaves at once.
    PROBE.write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
