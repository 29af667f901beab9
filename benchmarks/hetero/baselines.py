"""The baselines, each child in its own CPU-quota cgroup: every worker alone (the ideal), the same solo
runs all at once, and equal-batch PyTorch DDP."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.hetero.settings import Emulation, Settings, log, static_split
from benchmarks.workload import spawn, stop
from deploy.cgroups import CpuLimiter


@contextlib.contextmanager
def limiters(emu: Emulation, prefix: str) -> Any:
    """One reserved cgroup per worker (None each under the slowdown fallback); all closed on exit."""
    made: list[CpuLimiter] = []
    try:
        if emu.backend is not None:
            for name, share in zip(emu.names, emu.shares, strict=True):
                made.append(CpuLimiter.create(f"{prefix}-{name}", share, emu.period_us, run_id="hetero-bench",
                                              backend=emu.backend, reserve=True))
            yield made
        else:
            yield [None] * len(emu.names)
    finally:
        for limiter in made:
            with contextlib.suppress(Exception):
                limiter.close()


def with_death_signal(preexec: Callable[[], None] | None) -> Callable[[], None]:
    """Add 'SIGKILL me when my parent dies' (Linux) to a child's preexec step."""
    import ctypes
    import ctypes.util
    import signal

    name = ctypes.util.find_library("c")
    prctl = ctypes.CDLL(name, use_errno=True).prctl if name else None

    def run() -> None:
        if prctl is not None:
            prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if preexec is not None:
            preexec()

    return run


def _solo_argv(s: Settings, batches: Sequence[int], slowdowns: Sequence[float]) -> list[str]:
    w = s.workload
    return [
        "-m", "benchmarks.solo", *w.cli_args(), "--lr", str(w.lr), "--momentum", str(w.momentum),
        "--batch", ",".join(str(b) for b in batches), "--slowdown", ",".join(repr(f) for f in slowdowns),
        "--warmup", str(s.solo_warmup), "--seconds", str(s.solo_seconds), "--min-steps", str(s.solo_min_steps),
    ]


def _run_child(argv: list[str], preexec: Callable[[], None] | None, logfile: Path, timeout: float) -> list[dict]:
    """Run one benchmark child to completion; its JSON stdout lines (RuntimeError on failure)."""
    return _run_children([(argv, preexec, logfile)], timeout)[0]


def _run_children(
    children: Sequence[tuple[list[str], Callable[[], None] | None, Path]], timeout: float
) -> list[list[dict]]:
    """Start benchmark children (argv, preexec, log file) at once and run them to completion; each
    one's JSON stdout lines. On any failure every child is stopped and RuntimeError raised."""
    procs = [spawn(argv, preexec=with_death_signal(preexec), log=logfile) for argv, preexec, logfile in children]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc, (argv, _, logfile) in zip(procs, children, strict=True):
            try:
                out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{argv[1]} did not finish within {timeout:.0f} s (log: {logfile})") from None
            if proc.returncode != 0:
                tail = logfile.read_text(encoding="utf-8", errors="replace")[-1500:]
                raise RuntimeError(f"{argv[1]} exited with {proc.returncode}:\n{tail}")
            results.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    finally:
        stop(procs)
        for proc in procs:
            if proc.stdout:
                proc.stdout.close()
    return results


def measure_ideal(s: Settings, emu: Emulation) -> dict[str, Any]:
    """Each worker alone under its quota, one after another, at its share of B (the static split)."""
    batches = static_split(emu.shares, s.workload.global_batch)
    per_worker: dict[str, Any] = {}
    workdir = s.workdir / "ideal"
    workdir.mkdir(parents=True, exist_ok=True)
    if emu.backend is None:
        log(f"ideal: solo runs of {', '.join(emu.names)} in one process (software slowdowns {emu.slowdowns})")
        results = _run_child(_solo_argv(s, batches, emu.slowdowns), None, workdir / "solo.log", s.run_timeout)
        for name, share, result in zip(emu.names, emu.shares, results, strict=True):
            per_worker[name] = {"share": share, **result}
    else:
        with limiters(emu, "solo") as groups:
            for name, share, batch, group in zip(emu.names, emu.shares, batches, groups, strict=True):
                log(f"ideal: {name} alone, {share:.4g} core, batch {batch} ...")
                (result,) = _run_child(_solo_argv(s, [batch], [1.0]), group.preexec, workdir / f"solo-{name}.log",
                                       s.run_timeout)
                per_worker[name] = {"share": share, **result}
                group.close()  # done with this worker's group; the next solo gets its own
    for name, r in per_worker.items():
        log(f"ideal: {name}: {r['samples_per_s']:.1f} samples/s (batch {r['batch']}, {r['step_ms']:.1f} ms/step)")
    total = sum(r["samples_per_s"] for r in per_worker.values())
    log(f"ideal: sum {total:.1f} samples/s")
    ideal: dict[str, Any] = {
        "samples_per_s": round(total, 2), "per_worker": per_worker,
        "note": "each worker alone under its quota at its static share of the global batch; sum = perfect balance",
    }
    together = measure_ideal_together(s, emu, batches)
    if together is not None:
        ideal["together"] = together
    return ideal


def measure_ideal_together(s: Settings, emu: Emulation, batches: Sequence[int]) -> dict[str, Any] | None:
    """The same solo runs started all at once, each in its own cgroup: still no server and no waiting,
    but the workers slow each other down as they do in a cluster on this machine (shared cores,
    caches, memory bandwidth), which the one-at-a-time ideal leaves out. A diagnostic beside the
    ideal, not a replacement. None under the slowdown fallback, whose solos share one process."""
    if emu.backend is None:
        return None
    workdir = s.workdir / "ideal"
    log(f"ideal, all at once: {', '.join(emu.names)} ...")
    with limiters(emu, "together") as groups:
        children = [(_solo_argv(s, [batch], [1.0]), group.preexec, workdir / f"together-{name}.log")
                    for name, batch, group in zip(emu.names, batches, groups, strict=True)]
        results = _run_children(children, s.run_timeout)
    per_worker = {name: result["samples_per_s"] for name, (result,) in zip(emu.names, results, strict=True)}
    total = sum(per_worker.values())
    log(f"ideal, all at once: sum {total:.1f} samples/s ({', '.join(f'{n} {r:.1f}' for n, r in per_worker.items())})")
    return {"samples_per_s": round(total, 2), "per_worker": per_worker,
            "note": "the solo runs started together, each under its quota: co-running processes share the machine"}


def measure_ddp(s: Settings, emu: Emulation, ideal: dict[str, Any] | None,
                split: Mapping[str, int] | None = None, name: str = "",
                rates: Mapping[str, float] | None = None) -> dict[str, Any]:
    """DDP, one rank per worker cgroup, with equal batches B/K (`ddp_uniform`) or with `split`'s
    per-worker batches (`ddp_split`: set by hand, as DDP users do for mixed hardware, here to our
    controller's final plan); steps sized to last about ddp_seconds, from each worker's samples/s
    alone (the ideal's) or `rates`. `name`: what the log and the work folder call it (default:
    ddp_uniform or ddp_split)."""
    from benchmarks.ddp_baseline import run_ddp

    k = len(emu.names)
    name = name or ("ddp_uniform" if split is None else "ddp_split")
    batches = [max(1, s.workload.global_batch // k)] * k if split is None else [max(1, split[n]) for n in emu.names]
    steps = s.ddp_min_steps
    if rates is None and ideal is not None:
        rates = {n: ideal["per_worker"][n]["samples_per_s"] for n in emu.names}
    if rates is not None and not s.tiny:
        # the slowest rank sets the pace; its rate predicts the step time
        step_s = max((b / rates[n] for n, b in zip(emu.names, batches, strict=True) if rates.get(n)), default=0.0)
        if step_s > 0:
            steps = max(s.ddp_min_steps, min(200, math.ceil(s.ddp_seconds / step_s)))
    log(f"{name}: {k} ranks, batches {batches}, {s.ddp_warmup} warm-up + {steps} timed steps ...")
    with limiters(emu, "ddp") as groups:
        preexecs = [with_death_signal(g.preexec if g is not None else None) for g in groups]
        slowdowns = emu.slowdowns if emu.backend is None else [1.0] * k
        result = run_ddp(s.workload, batches[0] if split is None else batches, preexecs, slowdowns,
                         warmup=s.ddp_warmup, steps=steps, workdir=s.workdir / name, timeout_s=s.run_timeout)
    log(f"{name}: {result['samples_per_s']:.1f} samples/s ({result['step_ms']:.1f} ms/step)")
    return result
