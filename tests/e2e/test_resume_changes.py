"""A server killed and resumed with the settings a resume may change (common.job.spec.RESUMABLE_FIELDS)
changed, while its workers keep retrying: they rejoin under the new settings and the job runs to its
end. Before, each worker took the changed spec for another job and left, and the resumed server
waited for workers that never came."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from common.job.epoch_order import slice_indices
from common.transport.messages import SliceRange
from tests.fault_jobs import resume_after_kill, status, wait_for
from tests.processes import start_server

N = 1438  # the digits training split
JOB = ["--workers", "2", "--model-arg", "hidden=64", "--dataset", "digits", "--global-batch", "128", "--lr", "0.1",
       "--allreduce", "off", "--evict-after", "3", "--grace", "5"]
FIRST = ["--sampling", "independent", "--no-overlap", "--balance", "compute"]


def test_workers_rejoin_a_resume_that_changes_sampling_overlap_and_balance(tmp_path: Path) -> None:
    """Resumed under --sampling exact, with the buckets during backward and busy time balanced: the
    running workers rejoin, draw the server's slices from then on (the audit hook: every sample of the
    resumed epochs trained once, each step on its slice) and the job ends at its last epoch."""
    ckpt, audit = tmp_path / "ckpt", tmp_path / "audit"
    (tmp_path / "first").mkdir()
    audit.mkdir()
    cluster = start_server(tmp_path / "first", [*JOB, *FIRST, "--epochs", "40", "--checkpoint-dir", str(ckpt)])
    try:
        for name in ("w0", "w1"):
            cluster.start_worker(name, "--retry-for", "60", "--slowdown", "5",
                                 prefix=("env", f"PS_TRAINED_INDICES={audit / name}.jsonl"))
        wait_for(lambda: status(cluster.target)["epoch"] >= 1, 120, "epoch 1")
        resumed, epochs = resume_after_kill(cluster, ckpt, tmp_path / "second", JOB, ("w0", "w1"))
    finally:
        cluster.stop()
    assert ("the job's settings differ from the checkpoint's (--balance compute -> busy, --epochs 40 -> "
            f"{epochs}, --no-overlap on -> off, --sampling independent -> exact)") in resumed.server_log()
    (summary,) = resumed.events("summary")
    assert summary["epochs"] == epochs and summary["reason"] == "finished", summary
    seen: Counter = Counter()
    for path in sorted(audit.glob("*.jsonl")):  # only the resumed job's steps: the first job drew its own
        for line in map(json.loads, path.read_text().splitlines()):
            ranges = [SliceRange(*r) for r in line["ranges"]]
            assert line["indices"] == slice_indices(0, N, ranges).tolist(), line
            seen.update((r.epoch, p) for r in ranges for p in range(r.offset, r.stop))
    assert max(seen.values()) == 1, [key for key, count in seen.items() if count > 1][:10]
    per_epoch = Counter(epoch for epoch, _ in seen)
    resumed_at = epochs - 2  # the checkpoint's epoch: resume_after_kill runs two more
    assert all(per_epoch[e] == N for e in range(resumed_at, epochs)), per_epoch
