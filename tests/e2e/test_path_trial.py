"""--allreduce auto on CPU workers with real processes: the job tries both paths at one plan and keeps
the faster (ps/rounds/path_trial.py). One worker is slowed (the stall hook, pulsed) on one path only,
so which path wins is known: keeping the PS path switches the job back from the fast path."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import tests.processes as processes
from tests.processes import start_server
from worker.probes.stall_hook import STALL_DIR_ENV

JOB = ["--mode", "bsp", "--workers", "2", "--dataset", "digits", "--model-arg", "hidden=16", "--global-batch", "32",
       "--epochs", "3", "--lr", "0.1", "--momentum", "0.9", "--controller", "uniform", "--sampling", "independent",
       "--evict-after", "60"]
SWITCHED = "--allreduce auto: the collective fast path (trying the collective fast path"


class Pulses:
    """While on, the stall file of worker `name` exists 60 of every 85 ms: each step waits for it (the
    period is not a multiple of the hook's 50 ms poll, which would otherwise keep meeting the file)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.flag = folder / name
        self.on = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            if self.on.is_set():
                self.flag.touch()
                time.sleep(0.06)
            self.flag.unlink(missing_ok=True)
            time.sleep(0.025)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.flag.unlink(missing_ok=True)


@pytest.mark.parametrize("slow_on", ["ps", "allreduce"])
def test_auto_tries_both_paths_and_keeps_the_faster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_on: str) -> None:
    """The trial's path events, the decision and the summary agree with the path that was not slowed; the
    job learns through the switches (parameters and momentum carried), and every process exits 0."""
    stall = tmp_path / "stall"
    stall.mkdir()
    monkeypatch.setitem(processes.ENV, STALL_DIR_ENV, str(stall))
    cluster = start_server(tmp_path, JOB)
    pulses = Pulses(stall, "w1")
    try:
        if slow_on == "ps":
            pulses.on.set()
        for name in ("w0", "w1"):
            cluster.start_worker(name)
        deadline = time.monotonic() + 240
        while SWITCHED not in cluster.server_log() and cluster.server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if slow_on == "ps":
            pulses.on.clear()
        else:
            pulses.on.set()
            while "(kept the" not in cluster.server_log() and cluster.server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            pulses.on.clear()  # the trial has decided: the rest of the job at full speed
        code = cluster.wait(300)
    finally:
        pulses.stop()
        cluster.stop()
    log = cluster.server_log()
    assert code == 0, log
    assert "allreduce if every worker has a GPU of its own, else the faster path after a trial of both" in log
    for name, proc in zip(("w0", "w1"), cluster.workers):
        assert proc.returncode == 0, cluster.worker_log(name)
    paths = cluster.events("path")
    assert "trying both paths, the PS path first" in paths[0]["why"] and not paths[0]["allreduce"], paths
    assert paths[1]["allreduce"] and paths[1]["switched"], paths
    decision = paths[-1]
    assert set(decision["rates"]) == {"ps", "allreduce"}, decision
    kept = "allreduce" if slow_on == "ps" else "ps"
    assert decision["allreduce"] == (kept == "allreduce"), (decision, log)
    assert decision["rates"][kept] > decision["rates"][slow_on], decision
    assert f"kept the {'collective fast' if kept == 'allreduce' else 'PS'} path" in decision["why"]
    assert f"--allreduce auto: the {'collective fast' if kept == 'allreduce' else 'PS'} path (kept the" in log
    (summary,) = cluster.events("summary")
    assert summary["allreduce"] == (kept == "allreduce"), summary
    assert summary["accuracy"] >= 0.85, summary  # the parameters and momentum carried across each switch
    assert summary["epochs"] == 3, summary
    if kept == "ps":  # the switch back: one snapshot became the server's parameters, gradients came after it
        assert len(cluster.events("snapshot")) >= 1
