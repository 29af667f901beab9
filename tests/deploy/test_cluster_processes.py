"""A local cluster's processes (deploy/cluster_processes.py): which worker exits stop a running job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from common.job.endings import ENDED_EARLY
from deploy.cluster_exits import WorkerFailedError
from deploy.cluster_processes import ClusterProcesses


def test_a_workers_early_end_status_is_a_failure_unless_the_server_ended_the_job_early(tmp_path: Path) -> None:
    """A worker that exits 3 while the server runs heard the job end early, if the server's metrics log
    says so (the server exits 3 after its --grace): no failure then. Without that end, 3 is a worker
    gone from a running job like any other status, and so is 1 in either case."""
    procs = ClusterProcesses(tmp_path)
    try:
        procs.spawn("server", [sys.executable, "-c", "import time; time.sleep(60)"], None,
                    lambda proc: setattr(procs, "server", proc))
        for name, code in (("early", ENDED_EARLY), ("crashed", 1)):
            procs.start_worker(name, [sys.executable, "-c", f"raise SystemExit({code})"], None)
            procs.processes[name].wait(timeout=30)
        assert procs.failed_workers() == [("early", ENDED_EARLY), ("crashed", 1)]
        assert procs.failed_workers(lambda: False) == [("early", ENDED_EARLY), ("crashed", 1)]
        assert procs.failed_workers(lambda: True) == [("crashed", 1)]
        with pytest.raises(WorkerFailedError, match=r"worker crashed \(exit 1\) exited"):
            procs.check_workers(lambda: True)
    finally:
        procs.stop()
