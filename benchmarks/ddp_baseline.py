"""The baseline to beat: PyTorch DistributedDataParallel with equal batches (gloo, CPU), or with
per-rank batches set by hand (what DDP users do for mixed hardware: the benchmark sets them to our
controller's final split).

:func:`run_ddp` starts one process per worker, each in its worker's CPU cgroup before it execs
(or slowed down in software where there is no cgroup backend), all of them training the same model
on the same data with the same batch ``B / K`` (or rank k's own ``b_k``, its loss scaled by
``K b_k / B`` so that DDP's mean of the ranks' gradients is the gradient of the ``B`` samples). They meet through a ``torch.distributed.TCPStore``
that rank 0 hosts on 127.0.0.1, on a free port the driver picks. After ``warmup`` steps, rank 0 times ``steps``
more between two barriers and prints ``{"samples_per_s", "step_ms", ...}`` as one JSON line. With
``cpu_out``, every rank also writes its CPU time per step there (``rank<R>.json``: :func:`cpu_record`).

With ``--epochs E`` a rank trains to a test accuracy instead (:func:`train_to_target`, what
``benchmarks.tta`` runs): exact epochs, the rank ``--eval-rank`` evaluating the test split at each
epoch end while the clock is stopped, and prints the accuracy curve.

The child entry point is ``python -m benchmarks.ddp_baseline --rank R --world K --store-port P ...``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.ops.arg_types import eval_interval
from benchmarks.workload import (
    Workload,
    add_child_workload_arguments,
    build,
    spawn,
    stop,
    tune_like_a_worker,
)

INIT_TIMEOUT_S = 300.0
"""How long ranks wait for each other at start-up (a throttled rank imports torch slowly)."""


def run_ddp(
    workload: Workload,
    batch_per_worker: int | Sequence[int],
    preexecs: Sequence[Callable[[], None] | None],
    slowdowns: Sequence[float],
    *,
    warmup: int,
    steps: int,
    workdir: Path,
    timeout_s: float,
    cpu_out: Path | None = None,
    extra_args: Sequence[str] = (),
    reporter: int = 0,
) -> dict:
    """Run the DDP baseline with ``len(preexecs)`` ranks; returns rank ``reporter``'s measurement
    (its last JSON line). ``extra_args`` go to every rank (e.g. :func:`train_to_target`'s flags).

    ``preexecs[k]`` places rank k in its cgroup (None: no cgroup), ``slowdowns[k]`` slows it down
    in software (1: not at all). Every child is stopped on every exit path. RuntimeError (with the
    tail of the failing rank's log) if a rank fails or the run exceeds ``timeout_s``.
    """
    world = len(preexecs)
    batches = [batch_per_worker] * world if isinstance(batch_per_worker, int) else list(batch_per_worker)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for rank in range(world):
            argv = [
                "-m", "benchmarks.ddp_baseline", *workload.cli_args(),
                "--lr", str(workload.lr), "--momentum", str(workload.momentum),
                "--rank", str(rank), "--world", str(world), "--store-port", str(port),
                "--batch", str(batches[rank]), "--batches", ",".join(map(str, batches)),
                "--warmup", str(warmup), "--steps", str(steps),
                "--slowdown", str(slowdowns[rank]), *extra_args,
            ]
            if cpu_out is not None:
                argv += ["--cpu-out", str(cpu_out / f"rank{rank}.json")]
            procs.append(spawn(argv, preexec=preexecs[rank], log=workdir / f"ddp-rank{rank}.log"))
        deadline = time.monotonic() + timeout_s
        while any(proc.poll() is None for proc in procs):
            # a rank that fails leaves the others blocked in a collective: stop at the first failure
            for rank, proc in enumerate(procs):
                if proc.returncode not in (None, 0):
                    text = (workdir / f"ddp-rank{rank}.log").read_text(encoding="utf-8", errors="replace")
                    raise RuntimeError(f"DDP rank {rank} exited with {proc.returncode}:\n{text[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"DDP baseline did not finish within {timeout_s:.0f} s (logs: {workdir})")
            time.sleep(0.1)
        for rank, proc in enumerate(procs):
            if proc.returncode != 0:
                text = (workdir / f"ddp-rank{rank}.log").read_text(encoding="utf-8", errors="replace")
                raise RuntimeError(f"DDP rank {rank} exited with {proc.returncode}:\n{text[-2000:]}")
        stdout = procs[reporter].stdout
        out = stdout.read() if stdout else ""
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"DDP rank {reporter} printed no result: {out[-500:]!r}")
        return json.loads(lines[-1])
    finally:
        stop(procs)
        for proc in procs:
            if proc.stdout:
                proc.stdout.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (rank 0 binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.ddp_baseline",
        description="One DDP rank (gloo, CPU) of the equal-batch baseline; rank 0 prints samples/s as JSON.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_child_workload_arguments(p)
    p.add_argument("--rank", type=int, required=True, help="this process's rank")
    p.add_argument("--world", type=int, required=True, help="number of ranks")
    p.add_argument("--store-host", default="127.0.0.1", help="where rank 0's TCPStore listens")
    p.add_argument("--store-port", type=int, required=True, help="the TCPStore's port (rank 0 binds it)")
    p.add_argument("--batch", type=int, required=True, help="this rank's batch (B / K, or its b_k)")
    p.add_argument("--batches", default=None, metavar="B0,B1,...",
                   help="every rank's batch, when they differ: the loss is scaled by K*b_k/B and samples/s counts them all")
    p.add_argument("--warmup", type=int, default=3, help="steps before timing")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--slowdown", type=float, default=1.0, help="software slowdown of this rank's compute")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--cpu-out", type=Path, default=None, metavar="FILE",
                   help="write this rank's CPU time per step here as JSON (benchmarks.round_cpu)")
    tta = p.add_argument_group("to a test accuracy (train_to_target; --warmup and --steps are then unused)")
    tta.add_argument("--epochs", type=int, default=0, help="train up to this many epochs (0: time --steps instead)")
    tta.add_argument("--target", type=float, default=1.0, help="stop at the first evaluation at this accuracy or above ...")
    tta.add_argument("--budget", type=float, default=0.0, help="... once this many seconds of training have passed")
    tta.add_argument("--eval-rank", type=int, default=0, help="the rank that evaluates the test split and prints the curve")
    tta.add_argument("--eval-every", type=eval_interval, default="1", metavar="EPOCHS",
                     help="evaluate at every EPOCHS-th epoch's end and the last, or K times an epoch with EPOCHS = 1/K, "
                          "as ps-server --eval-every does")
    return p


def cpu_record(steps: int, process_s: float, fwd_bwd_s: float, optimizer_s: float, solo_s: float) -> dict:
    """A rank's CPU ms per timed step: the whole process's (every thread: gloo's too), its main
    thread's in forward and backward (with DDP's hooks) and in the optimizer step, and forward and
    backward of the same model without DDP, timed after the DDP steps on the same batches."""
    per_step = lambda seconds: round(1e3 * seconds / steps, 3)  # noqa: E731
    return {"steps": steps, "process_cpu_ms": per_step(process_s), "fwd_bwd_cpu_ms": per_step(fwd_bwd_s),
            "optimizer_cpu_ms": per_step(optimizer_s), "solo_fwd_bwd_cpu_ms": per_step(solo_s)}


def solo_fwd_bwd(model: Any, dataset: Any, batches: Sequence[Any], scale: float) -> float:
    """This thread's CPU seconds for forward and backward of `model` (no DDP) on `batches`."""
    import torch.nn.functional as F

    from common.job.splits import sample_batch

    model.train()
    began = time.thread_time()
    for idx in batches:
        x, y = sample_batch(dataset.train, idx)
        loss = F.cross_entropy(model(x), y) * scale
        model.zero_grad(set_to_none=False)
        loss.backward()
    return time.thread_time() - began


def slow_down(slowdown: float, began: float, began_cpu: float) -> None:
    """``--slowdown``: sleep as ps-worker does, the step's compute times ``slowdown - 1``. Its compute is this
    thread's CPU time, not the wall time, which holds the wait for the other ranks in the all-reduce (a
    sleep scaled from that would grow with every step, each rank waiting on the others' sleeps)."""
    from worker.probes.resources import slowdown_delay

    if slowdown > 1.0:
        time.sleep(slowdown_delay(time.perf_counter() - began, time.thread_time() - began_cpu, slowdown))


def rank_counts(batches: Sequence[int], samples: int) -> list[int]:
    """Each rank's part of a step of ``samples`` samples, in proportion to its batch: its batch itself at a
    full step (``samples == sum(batches)``), a share of the remainder at an epoch's short last step."""
    from ps.control.split import largest_remainder

    plan = largest_remainder({str(k): b for k, b in enumerate(batches)}, samples)
    return [plan[str(k)] for k in range(len(batches))]


def train_to_target(args: argparse.Namespace, ddp: Any, optimizer: Any, dataset: Any, batches: list[int]) -> dict:
    """Train to ``--target`` (and at least ``--budget`` seconds) or ``--epochs``; rank ``--eval-rank``'s curve.

    Exact epochs, as the parameter server's: each epoch is one permutation of the training split, the
    same on every rank (seeded alike), cut into steps of B samples, each step's samples split among the
    ranks in their batches' proportions (the last step takes the remainder), and the loss of rank k's
    ``c_k`` samples scaled by ``K / c`` so that DDP's mean over the ranks is the mean over the step's ``c``.
    The clock starts once every rank has set up and taken its first step (the server's ``first_round``)
    and is stopped while rank ``--eval-rank`` evaluates the test split at each epoch end (the server
    evaluates a snapshot on another thread, off its training time): the curve's ``seconds`` are
    training time only. The evaluating rank decides whether to stop and broadcasts it."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from common.job.splits import sample_batch
    from ps.rounds.evaluator import evaluate

    world, total = args.world, sum(batches)
    n = len(dataset.train)
    generator = torch.Generator().manual_seed(args.seed * 7919 + 17)
    evals: list[dict] = []
    seconds, resumed, step, trained = 0.0, 0.0, 0, 0
    every, per_epoch = args.eval_every

    def evaluated(epoch: float, last: bool) -> bool:
        """The clock stopped while the evaluating rank evaluates; whether to stop (the rank's say)."""
        nonlocal seconds, resumed
        dist.barrier()
        seconds += time.perf_counter() - resumed
        stop = torch.zeros(1)
        if args.rank == args.eval_rank:
            accuracy, loss_value = evaluate(ddp.module, dataset.test)
            ddp.module.train()
            evals.append({"epoch": epoch, "accuracy": round(accuracy, 5), "loss": round(loss_value, 5),
                          "seconds": round(seconds, 3), "step": step})
            print(f"epoch {epoch}: accuracy {accuracy:.4f} at {seconds:.1f} s", file=sys.stderr, flush=True)
            stop[0] = float((accuracy >= args.target and seconds >= args.budget) or last)
        dist.broadcast(stop, src=args.eval_rank)
        resumed = time.perf_counter()
        return bool(stop[0] > 0)

    stopped = False
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n, generator=generator)
        taken = 0  # the epoch's K-ths evaluated (--evals-per-epoch), as the server takes them
        for start in range(0, n, total):
            chunk = order[start:start + total]
            counts = rank_counts(batches, len(chunk))
            begin = sum(counts[:args.rank])
            x, y = sample_batch(dataset.train, chunk[begin:begin + counts[args.rank]])
            began, began_cpu = time.perf_counter(), time.thread_time()
            loss = F.cross_entropy(ddp(x), y, reduction="sum") * (world / len(chunk))
            optimizer.zero_grad(set_to_none=False)
            loss.backward()  # the gradient all-reduce runs here
            slow_down(args.slowdown, began, began_cpu)
            optimizer.step()
            step += 1
            trained += len(chunk) if step > 1 else 0  # the first step is before the clock
            if step == 1:  # every rank set up and stepped once: the clock starts
                dist.barrier()
                resumed = time.perf_counter()
            passed = min(per_epoch - 1, (start + len(chunk)) * per_epoch // n)
            if passed > taken and start + len(chunk) < n:
                taken = passed
                if evaluated(round(epoch - 1 + passed / per_epoch, 4), last=False):
                    stopped = True
                    break
        if stopped or ((epoch % every == 0 or epoch == args.epochs) and evaluated(epoch, last=epoch == args.epochs)):
            break
    return {"evals": evals, "steps": step, "epochs": evals[-1]["epoch"] if evals else 0, "seconds": round(seconds, 3),
            "samples_per_s": round(trained / seconds, 2) if seconds > 0 else None,
            "batch_per_worker": batches, "workers": world}


def time_steps(args: argparse.Namespace, ddp: Any, optimizer: Any, dataset: Any, batches: list[int]) -> dict:
    """``--warmup`` steps, then ``--steps`` timed between two barriers; the measurement (rank 0 prints it)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from common.job.splits import sample_batch
    from worker.data.sampler import ElasticBatchSampler

    scale = args.world * args.batch / sum(batches)
    sampler = ElasticBatchSampler(len(dataset.train), seed=args.seed * 1009 + args.rank, batch_size=args.batch)
    compute_s = 0.0
    start = 0.0
    cpu = [0.0, 0.0, 0.0]  # process, main thread in forward and backward, in the optimizer step
    batches_timed = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            start, compute_s, cpu = time.perf_counter(), 0.0, [-time.process_time(), 0.0, 0.0]
        began, began_cpu = time.perf_counter(), time.thread_time()
        idx = sampler.next_batch()
        batches_timed.append(idx)
        x, y = sample_batch(dataset.train, idx)
        loss = F.cross_entropy(ddp(x), y) * scale
        optimizer.zero_grad(set_to_none=False)
        loss.backward()  # the gradient all-reduce runs here, overlapped with backward
        slow_down(args.slowdown, began, began_cpu)
        stepping = time.thread_time()
        optimizer.step()
        compute_s += time.perf_counter() - began
        cpu[1] += stepping - began_cpu
        cpu[2] += time.thread_time() - stepping
    cpu[0] += time.process_time()
    dist.barrier()
    seconds = time.perf_counter() - start
    if args.cpu_out is not None:
        solo_s = solo_fwd_bwd(copy.deepcopy(ddp.module), dataset, batches_timed[args.warmup:], scale)
        args.cpu_out.write_text(json.dumps(cpu_record(args.steps, cpu[0], cpu[1], cpu[2], solo_s)), encoding="utf-8")
    return {
        "samples_per_s": round(args.steps * sum(batches) / seconds, 2),
        "step_ms": round(1000.0 * seconds / args.steps, 3),
        "steps": args.steps,
        "warmup": args.warmup,
        "seconds": round(seconds, 4),
        "batch_per_worker": args.batch if len(set(batches)) == 1 else batches,
        "workers": args.world,
        "rank0_step_incl_allreduce_ms": round(1000.0 * compute_s / args.steps, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (0 <= args.rank < args.world) or args.batch < 1 or args.steps < 1 or args.warmup < 0 or args.slowdown < 1:
        print("benchmarks.ddp_baseline: error: need 0 <= --rank < --world, --batch/--steps >= 1, --warmup >= 0, --slowdown >= 1",
              file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")] if args.batches else [args.batch] * args.world
    if len(batches) != args.world or batches[args.rank] != args.batch or min(batches) < 1:
        print("benchmarks.ddp_baseline: error: --batches needs one batch >= 1 per rank, this rank's equal to --batch",
              file=sys.stderr)
        return 2
    if args.epochs < 0 or not 0 <= args.eval_rank < args.world or args.budget < 0 or not 0 <= args.target <= 1:
        print("benchmarks.ddp_baseline: error: need --epochs >= 0, 0 <= --eval-rank < --world, --budget >= 0, "
              "0 <= --target <= 1", file=sys.stderr)
        return 2
    if not tune_like_a_worker("benchmarks.ddp_baseline"):  # the workers' allocator settings
        return 2
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(args.threads)
    timeout = datetime.timedelta(seconds=INIT_TIMEOUT_S)
    store = dist.TCPStore(args.store_host, args.store_port, args.world, args.rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world, timeout=timeout)
    try:
        model, dataset = build(args)
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
        ddp.train()
        if args.epochs > 0:
            result = train_to_target(args, ddp, optimizer, dataset, batches)
            if args.rank == args.eval_rank:
                print(json.dumps(result), flush=True)
        else:
            result = time_steps(args, ddp, optimizer, dataset, batches)
            if args.rank == 0:
                print(json.dumps(result), flush=True)
        dist.barrier()  # every rank is done with the group (and rank 0's store)
    except BaseException:
        dist.destroy_process_group()
        raise
    return 0  # the group is left to the process's exit (see below)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no gloo teardown once every rank is done: it aborted a finished rank now and then
    # ("terminate called without an active exception"), after its result was printed
    os._exit(code)
