"""`--profile N`: a one-worker push+pull with py-spy attached to ps-server, summarized as hot spots."""

from __future__ import annotations

import re
import signal
import sys
import time
from typing import Any

from benchmarks.transport.job import server_argv
from benchmarks.transport.processes import Processes, child_argv, read_result, server_process
from benchmarks.transport.stats import rate, stats


_PY_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*\.py):(?P<line>\d+)\)$")


def summarize_profile(raw_text: str, top: int = 12) -> dict[str, Any]:
    """Collapsed py-spy stacks (``--threads --native``) to hot spots.

    Per thread, the share of samples; for the thread running the event loop (MainThread), the share
    by innermost Python function (``<idle: epoll>`` when the leaf is an epoll wait), each with its
    hottest native leaves, and the hottest Python source lines.
    """
    threads: dict[str, int] = {}
    by_function: dict[str, int] = {}
    leaves: dict[str, dict[str, int]] = {}
    by_line: dict[str, int] = {}
    main = 0
    for line in raw_text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith("thread (") else "?"
        thread_name = thread.split(": ", 1)[-1]
        threads[thread_name] = threads.get(thread_name, 0) + count
        if thread_name != "MainThread":
            continue
        main += count
        leaf = frames[-1]
        python = [m for m in map(_PY_FRAME.match, frames) if m]
        if "epoll" in leaf.split(" ", 1)[0]:
            key = "<idle: epoll>"
        elif python:
            key = f"{python[-1]['func']} ({python[-1]['file']})"
            where = f"{python[-1]['func']} ({python[-1]['file']}:{python[-1]['line']})"
            by_line[where] = by_line.get(where, 0) + count
        else:
            key = "<no Python frame>"
        by_function[key] = by_function.get(key, 0) + count
        native = leaf if not _PY_FRAME.match(leaf) else "(Python)"
        native = re.sub(r"^0x[0-9a-f]+ \((.*)\)$", r"\1 (unnamed: memcpy-like)", native)
        short = native if len(native) <= 110 else native[:107] + "..."
        leaves.setdefault(key, {})
        leaves[key][short] = leaves[key].get(short, 0) + count

    def pct(n: int, total: int) -> float:
        return round(100.0 * n / max(1, total), 1)

    total = sum(threads.values())
    return {
        "samples": total,
        "threads_pct": {name: pct(n, total) for name, n in sorted(threads.items(), key=lambda kv: -kv[1])},
        "main_thread_samples": main,
        "main_thread_by_function": [
            {"function": name, "pct": pct(n, main),
             "native_leaves": [{"leaf": leaf, "pct": pct(m, main)}
                               for leaf, m in sorted(leaves[name].items(), key=lambda kv: -kv[1])[:3]]}
            for name, n in sorted(by_function.items(), key=lambda kv: -kv[1])[:top]
        ],
        "main_thread_by_line": [{"line": name, "pct": pct(n, main)}
                                for name, n in sorted(by_line.items(), key=lambda kv: -kv[1])[:top]],
    }


def profile_server(procs: Processes, numel: int, wire_dtype: str, steps: int) -> dict[str, Any]:
    """A one-worker push+pull with py-spy attached to the ps-server (``--native --threads``).

    py-spy attaches once the server listens (startup is not in the profile) and stops with SIGINT
    (it then writes its collapsed stacks) after the client's last step.
    """
    import shutil

    pyspy = shutil.which("py-spy")
    if pyspy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    raw = procs.workdir / f"profile-{numel}-{wire_dtype}.txt"
    result = procs.workdir / f"profile-client-{numel}.json"
    argv = [sys.executable, "-m", "ps.server", *server_argv(numel, 1, wire_dtype)]
    with server_process(procs, "ps-server-profiled", argv) as target:
        server = procs.find("ps-server-profiled")
        spy = procs.start("py-spy", [pyspy, "record", "--pid", str(server.pid), "--rate", "200", "--native",
                                     "--threads", "--format", "raw", "--output", str(raw)])
        time.sleep(1.0)  # let py-spy attach
        if spy.poll() is not None:
            return {"error": f"py-spy exited {spy.returncode}: {procs.log_tail(spy)}"}
        client = procs.start("ps-client-profiled", child_argv("ps-client", result, "--target", target,
                                                              "--wire-dtype", wire_dtype, "--steps", str(steps),
                                                              "--warmup", "1"))
        try:
            procs.wait_all([client], 900, "profiled push+pull")
        finally:
            procs.stop(client)
        spy.send_signal(signal.SIGINT)  # py-spy writes the profile on Ctrl-C
        try:
            spy.wait(timeout=60)
        finally:
            procs.stop(spy)
    if not raw.exists():
        return {"error": f"py-spy wrote no profile: {procs.log_tail(spy)}"}
    times = read_result(result)["times"]
    from common.transport.wire import itemsize

    return {
        "tool": "py-spy record --native --threads --rate 200, attached to ps-server (1 worker) after it listens",
        "numel": numel, "wire_dtype": wire_dtype, "workers": 1, "steps": len(times), **stats(times),
        "mb_per_s_while_profiled": rate(2 * numel * itemsize(wire_dtype) * len(times), sum(times)),
        **summarize_profile(raw.read_text(encoding="utf-8", errors="replace")),
        "raw": str(raw),
    }
