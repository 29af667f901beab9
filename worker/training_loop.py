"""ps-worker's built-in training loop and its run once its flags are parsed (worker/flags.py): join the
server, train until the job ends, say why it ended and exit with the status that tells (EXIT_STATUSES)."""

from __future__ import annotations

import argparse
import math
import logging
import os
import sys
import threading
import time

import torch
import torch.nn.functional as F

from common.job.endings import ENDED_EARLY, ended_early
from common.ops.memory import heap_reserve_mib, tune_for_training
from common.ops.stack_dump import enable_stack_dump
from common.transport.security import resolve_token
from worker.accumulate import backward_in_micro_batches, backward_with_sub_norm
from worker.transport.channel import channel_credentials
from worker.transport.client import ServerError
from worker.transport.server_error import printable
from worker.connection import connect
from worker.device import resolve_device
from worker.flags import UNTRUSTED_SERVER
from worker.probes.cpu_parts import PROBE
from worker.probes.stall_hook import stall_while_asked
from worker.data.job_build import JobSetupError
from worker.data.loader import LoaderError, LoaderOptions
from worker.transport.server_checks import UntrustedReply
from worker.probes.resources import default_cores
from worker.stop_signal import StopSignal
from worker.runtime import Session


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


def show_worker_lines() -> None:
    """The runtime's lines for people (the server unreachable, lost, rejoined: the ``worker`` logger)
    on stderr as they are."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("worker")
    logger.addHandler(handler)
    logger.propagate = False


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


def run(args: argparse.Namespace) -> int:
    """ps-worker's run from its parsed flags (worker/cli.py parses them): join, train until the job ends,
    leave; its exit status is one of worker.flags.EXIT_STATUSES'."""
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
