"""Scale benchmark: one real ``ps-server`` and N real ``ps-worker`` processes on loopback.

``python -m benchmarks.scale --workers 32 --mode bsp --rounds 50 --json`` starts the server (a small
mlp on digits, ``--controller dynamic --adjust-every 5``, global batch ``8 N`` unless given; with
``--shards K``, BSP only, the server starts K-1 ``ps-shard`` processes and holds the first range itself) and N
workers (one torch thread each), waits until every worker is training, measures ``--rounds`` more BSP rounds or ASP updates (the
target is the count Status shows then, plus ``--rounds``; in ASP the first workers to finish
starting up run thousands of updates before the last one pushes), then stops the server with SIGTERM (it tells every worker the job is stopping, writes a summary
with reason "stopping" and exits 0) and checks that nothing failed: every exit code 0, no errors in
the workers' logs, no evictions or leaves in the server's metrics log.

stdout gets the JSON report with ``--json`` (a short table on stderr), else the table; progress
goes to stderr. The exit code is 0 when the run had no errors. Every process this starts is
stopped on every exit path (Ctrl-C and SIGTERM included; the children also die with this process).

Reported: ``wall_s`` is the measured window, from the first Status poll that shows every worker
training (BSP: a closed round, which needs all of them; ASP: every worker has an accepted update)
to the first that shows the target; ``window_start`` is the round/update count at its start and
``measured_steps`` the count in it (>= ``--rounds``), so ``rounds_per_s`` / ``updates_per_s`` = measured_steps /
wall_s (Status is polled every ``--poll`` seconds: both ends are within one poll of the true
times). ``startup_s`` is from launching the server to the window (imports, joins, data, first
steps); ``shutdown_s`` from SIGTERM until the server and every worker exited.
``server_peak_rss_mb`` is the server's VmHWM just before SIGTERM (``shard_peak_rss_mb`` each shard's).

The server's CPU: ``server_cpu_s`` is the user + system CPU the server process and its shard
processes used over the window (each read from /proc/PID/stat at both ends; ``shard_cpu_s`` the
shards' part, one per shard), ``server_cpu_ms_per_round`` that over the window's rounds (BSP) and
``server_cpu_ms_per_push`` over its pushes (BSP: rounds x workers; ASP: updates). It includes the
Status calls this driver makes every ``--poll`` seconds. The workers' memory, read just before
SIGTERM: ``worker_peak_rss_mb`` (mean and max of their VmHWM; shared library pages count in
each) and ``worker_pss_mb_mean`` (proportional set size: shared pages split between the processes
that map them, what one more worker adds to one machine). ``targets``: nothing failed (errors and
evictions, 0 needed).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from protos import ps_pb2_grpc
from benchmarks.analysis import decision_trace, target
from benchmarks.process_usage import cpu_fields, cpu_seconds, mean_max, peak_rss_mb, pss_mb
from benchmarks.report_output import add_result_options, save_result
from common.ops.arg_types import int_between, positive_float, positive_int
from common.transport.proto_convert import status_request
from deploy.proc_stat import child_pids
from ps.ops.metrics import read_metrics

MAX_SHARDS = 16
"""The most --shards: every shard is a process on this one machine, beside the workers (and the mlp,
87 values at the least, still splits into ranges of several values each)."""
CHILD_ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYTHONWARNINGS": "ignore",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "GRPC_VERBOSITY": "ERROR",
}


def log(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


def _death_signal() -> Callable[[], None]:
    """preexec_fn: SIGKILL the child when this process dies (Linux), so nothing outlives a crash."""
    name = ctypes.util.find_library("c")
    prctl = ctypes.CDLL(name, use_errno=True).prctl if name else None

    def run() -> None:
        if prctl is not None:
            prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG

    return run


@dataclass
class Settings:
    workers: int
    mode: str
    rounds: int
    global_batch: int
    hidden: int
    adjust_every: int
    evict_after: float
    startup_timeout: float
    run_timeout: float
    poll: float
    workdir: Path
    shards: int = 1


@dataclass
class Processes:
    """The server and workers this run started; stop() ends whatever still runs, each by its pid."""

    server: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)

    def all(self) -> list[subprocess.Popen]:
        return [*self.workers, *([self.server] if self.server is not None else [])]

    def stop(self, grace_s: float = 5.0) -> None:
        procs = [p for p in self.all() if p.poll() is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()


def spawn(argv: Sequence[str], logfile: Path) -> subprocess.Popen:
    with open(logfile, "w", encoding="utf-8") as out:
        return subprocess.Popen(
            [sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV,
            start_new_session=True,  # a Ctrl-C in the terminal reaches only this driver, which stops them in order
            preexec_fn=_death_signal(),  # noqa: PLW1509 - prctl before exec
        )


def server_argv(s: Settings, port_file: Path, metrics: Path) -> list[str]:
    epochs = 100_000  # never the end (ASP's start-up alone may take many epochs): SIGTERM is
    argv = [
        "-m", "ps.server", "--mode", s.mode, "--workers", str(s.workers),
        "--model", "mlp", "--model-arg", f"hidden={s.hidden}", "--dataset", "digits",
        "--global-batch", str(s.global_batch), "--epochs", str(epochs),
        "--controller", "dynamic", "--adjust-every", str(s.adjust_every), "--evict-after", str(s.evict_after),
        "--port", "0", "--port-file", str(port_file), "--metrics-log", str(metrics), "--quiet",
    ]
    if s.mode == "asp":
        argv += ["--lr", "0.5"]  # README: ASP applies plain SGD updates and wants a larger lr
    if s.shards > 1:
        argv += ["--shards", str(s.shards)]
    return argv


def worker_argv(target: str, name: str, s: Settings) -> list[str]:
    return ["-m", "worker.cli", "--server", target, "--name", name, "--threads", "1", "--quiet", "--device", "cpu",
            "--timeout", str(s.startup_timeout)]


def failure_target(report: dict[str, Any]) -> dict[str, Any]:
    """The run's one target: no errors and no evictions."""
    failures = len(report["errors"]) + (report["evictions"] or 0)
    return target("nothing failed: errors + evictions in a run (BSP/ASP, 4-64 workers, dense and sharded)",
                  failures, "<=", 0, "scale")


def wait_port(proc: subprocess.Popen, port_file: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"ps-server exited with {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise RuntimeError(f"ps-server did not listen within {timeout:.0f}s")
        time.sleep(0.05)
    return int(port_file.read_text())


def worker_errors(workdir: Path, names: Sequence[str]) -> list[str]:
    """Error lines in the workers' logs (they run --quiet: a clean worker writes nothing)."""
    errors = []
    for name in names:
        text = (workdir / f"{name}.log").read_text(encoding="utf-8", errors="replace")
        bad = [line for line in text.splitlines() if "Traceback" in line or "error" in line.lower()]
        if bad:
            errors.append(f"{name}: {bad[0].strip()[:200]}")
    return errors


def run(s: Settings) -> dict[str, Any]:
    """One measured run; returns the report (errors listed in it rather than raised)."""
    s.workdir.mkdir(parents=True, exist_ok=True)
    port_file, metrics = s.workdir / "port", s.workdir / "metrics.jsonl"
    for stale in (port_file, metrics):  # a reused --workdir: the server appends to its metrics log
        stale.unlink(missing_ok=True)
    step_name = "rounds" if s.mode == "bsp" else "updates"
    names = [f"w{i:02d}" for i in range(s.workers)]
    procs = Processes()
    errors: list[str] = []
    report: dict[str, Any] = {
        "workers": s.workers, "mode": s.mode, step_name: s.rounds, "wall_s": None, f"{step_name}_per_s": None,
        "evictions": None, "errors": errors, "server_peak_rss_mb": None, "startup_s": None, "shards": s.shards,
        "server_cpu_s": None, "shard_cpu_s": [], "server_cpu_ms_per_round": None, "server_cpu_ms_per_push": None,
        "shard_peak_rss_mb": [], "worker_peak_rss_mb": {"mean": None, "max": None}, "worker_pss_mb_mean": None,
        "global_batch": s.global_batch, "model": f"mlp hidden={s.hidden} on digits",
        "controller": f"dynamic, adjust every {s.adjust_every}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    launched = time.monotonic()
    channel = None
    try:
        server = procs.server = spawn(server_argv(s, port_file, metrics), s.workdir / "server.log")
        address = f"127.0.0.1:{wait_port(server, port_file, s.startup_timeout)}"
        log(f"server on {address}; starting {s.workers} workers")
        for name in names:
            procs.workers.append(spawn(worker_argv(address, name, s), s.workdir / f"{name}.log"))
        channel = grpc.insecure_channel(address)
        stub = ps_pb2_grpc.ParameterServerStub(channel)

        def step() -> tuple[int, int, bool]:
            """(rounds or updates done, workers in the job, whether every worker is training)."""
            st = stub.Status(status_request(), timeout=10)
            if s.mode == "bsp":  # a closed round had every worker in it
                return st.round, len(st.workers), st.round >= 1
            training = len(st.workers) == s.workers and all(w.updates >= 1 for w in st.workers)
            return st.version, len(st.workers), training

        def check_alive() -> None:
            if server.poll() is not None:
                raise RuntimeError(f"ps-server exited with {server.returncode} during the run")
            dead = [n for n, p in zip(names, procs.workers) if p.poll() is not None]
            if dead:
                raise RuntimeError(f"workers exited early: {', '.join(dead[:5])}{' ...' if len(dead) > 5 else ''}")

        deadline = launched + s.startup_timeout
        last_note = 0.0
        while True:
            check_alive()
            done_steps, joined, training = step()
            if training:
                t0, s0 = time.monotonic(), done_steps
                shard_pids = child_pids(server.pid)  # --shards K: its K-1 ps-shard processes
                cpu0 = cpu_seconds([server.pid, *shard_pids])
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every worker trained within --startup-timeout {s.startup_timeout:.0f}s ({joined} joined)")
            if time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                log(f"waiting for every worker to train: {joined}/{s.workers} in the job, {done_steps} {step_name} done")
            time.sleep(s.poll)
        report["startup_s"] = round(t0 - launched, 2)
        report["window_start"] = s0
        target = s0 + s.rounds
        log(f"every worker is training after {t0 - launched:.1f}s ({step_name} {s0}); measuring to {target}")
        deadline = t0 + s.run_timeout
        while True:
            done_steps, joined, _ = step()
            if done_steps >= target:
                t1, s1 = time.monotonic(), done_steps
                cpu1 = cpu_seconds([server.pid, *shard_pids])
                break
            check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{step_name} {done_steps}/{target} after --run-timeout {s.run_timeout:.0f}s")
            time.sleep(s.poll)
        report["wall_s"] = round(t1 - t0, 3)
        report[f"{step_name}_per_s"] = round((s1 - s0) / (t1 - t0), 2) if t1 > t0 else None
        report["measured_steps"] = s1 - s0
        report["server_peak_rss_mb"] = peak_rss_mb(procs.server.pid)
        report.update(cpu_fields(s.mode, s.workers, s1 - s0, server.pid, shard_pids, cpu0, cpu1))
        report["shard_peak_rss_mb"] = [peak_rss_mb(pid) for pid in shard_pids]
        if len(shard_pids) != s.shards - 1:
            errors.append(f"found {len(shard_pids)} shard processes of the server, not {s.shards - 1}")
        report["worker_peak_rss_mb"] = mean_max([peak_rss_mb(p.pid) for p in procs.workers])
        report["worker_pss_mb_mean"] = mean_max([pss_mb(p.pid) for p in procs.workers])["mean"]
        log(f"{step_name} {s0} -> {s1} in {t1 - t0:.2f}s; stopping the server")
        procs.server.send_signal(signal.SIGTERM)
        try:
            code = procs.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
            errors.append("ps-server did not exit within 60s of SIGTERM")
        if code not in (0, None):
            errors.append(f"ps-server exited with {code}")
        log(f"server exited {time.monotonic() - t1:.1f}s after SIGTERM")
        for name, proc in zip(names, procs.workers):
            try:
                code = proc.wait(timeout=max(1.0, 30 - (time.monotonic() - t1)))
            except subprocess.TimeoutExpired:
                errors.append(f"{name} still running 30s after the server stopped")
                continue
            if code != 0:
                errors.append(f"{name} exited with {code}")
        report["shutdown_s"] = round(time.monotonic() - t1, 2)
        log(f"server and workers exited {report['shutdown_s']:.1f}s after SIGTERM")
    except (RuntimeError, grpc.RpcError) as exc:
        errors.append(str(exc) if isinstance(exc, RuntimeError) else f"Status failed: {exc.code().name}: {exc.details()}")
    finally:
        if channel is not None:
            channel.close()
        procs.stop()
    events = read_metrics(metrics) if metrics.exists() else []
    if s.mode == "bsp" and report.get("measured_steps"):
        start = report["window_start"]
        report["trace"] = decision_trace(events, start, start + report["measured_steps"])
    report["adjust_every"] = s.adjust_every
    report["evictions"] = sum(e["event"] == "evict" for e in events)
    if report["evictions"]:
        errors.append(f"{report['evictions']} evictions in the metrics log")
    leaves = sum(e["event"] == "leave" for e in events)
    if leaves and not errors:  # after an error, the workers this driver stops leave
        errors.append(f"{leaves} workers left during the run")
    summary = [e for e in events if e["event"] == "summary"]
    if not errors and (not summary or summary[-1].get("reason") != "stopping"):
        errors.append(f"no summary with reason 'stopping' in the metrics log ({summary[-1:]})")
    errors.extend(worker_errors(s.workdir, [n for n in names if (s.workdir / f"{n}.log").exists()]))
    report["targets"] = [failure_target(report)]
    report["workdir"] = str(s.workdir)
    return report


def render_table(report: dict[str, Any]) -> str:
    step = "rounds" if report["mode"] == "bsp" else "updates"
    rows = [
        ("workers", report["workers"]), ("mode", report["mode"]), (step, report[step]),
        ("startup s", report["startup_s"]), ("wall s (measured)", report["wall_s"]),
        (f"{step}/s", report[f"{step}_per_s"]), ("evictions", report["evictions"]),
        ("errors", len(report["errors"])), ("server peak RSS MB", report["server_peak_rss_mb"]),
        ("shards", report["shards"]), ("server CPU s (window)", report["server_cpu_s"]),
        ("server CPU ms/round", report["server_cpu_ms_per_round"]), ("server CPU ms/push", report["server_cpu_ms_per_push"]),
        ("worker peak RSS MB (mean / max)", f"{report['worker_peak_rss_mb']['mean']} / {report['worker_peak_rss_mb']['max']}"),
        ("worker PSS MB (mean)", report["worker_pss_mb_mean"]),
    ]
    return "\n".join(["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", type=positive_int, default=32, help="worker processes")
    p.add_argument("--mode", choices=["bsp", "asp"], default="bsp")
    p.add_argument("--rounds", type=positive_int, default=50, help="target: BSP rounds or ASP updates")
    p.add_argument("--global-batch", type=positive_int, default=None, help="B (unset: 8 x workers)")
    p.add_argument("--hidden", type=positive_int, default=32, help="mlp width")
    p.add_argument("--shards", type=int_between(1, MAX_SHARDS), default=1, help="the server's --shards: it starts "
                   f"K-1 ps-shard processes on loopback (1: one dense server; at most {MAX_SHARDS})")
    p.add_argument("--adjust-every", type=positive_int, default=5, help="controller decision every N steps")
    p.add_argument("--evict-after", type=positive_float, default=120.0,
                   help="server's --evict-after: generous, a worker sends no heartbeat while it builds its data after Join")
    p.add_argument("--startup-timeout", type=positive_float, default=300.0, help="seconds to the first round/update")
    p.add_argument("--run-timeout", type=positive_float, default=300.0, help="seconds from the first round/update to the target")
    p.add_argument("--poll", type=positive_float, default=0.05, help="seconds between Status polls")
    p.add_argument("--workdir", type=Path, default=None, help="keep logs here (unset: a temporary directory, removed)")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout (the table goes to stderr)")
    add_result_options(p)
    return p


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    global_batch = args.global_batch or 8 * args.workers
    if global_batch < args.workers:
        parser.error(f"--global-batch {global_batch} is below --workers {args.workers}")  # exit 2
    if args.shards > 1 and args.mode != "bsp":
        parser.error(f"--shards {args.shards} needs --mode bsp (ps-server shards BSP jobs only)")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)  # run the cleanup in run()'s finally
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ps-scale-")))
        settings = Settings(args.workers, args.mode, args.rounds, global_batch, args.hidden, args.adjust_every,
                            args.evict_after, args.startup_timeout, args.run_timeout, args.poll, workdir, args.shards)
        report = run(settings)
        if args.workdir is None:
            report.pop("workdir")
    table = render_table(report)
    if args.json:
        print(json.dumps(report, indent=2))
        print(table, file=sys.stderr)
    else:
        print(table)
    save_result(args, "scale", report, argv)
    for error in report["errors"]:
        log(f"error: {error}")
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
