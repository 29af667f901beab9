"""Exactly-once epochs with real processes: an HL4 job whose plan changes, with one worker evicted in
mid-epoch and rejoining, records every sample each worker trained on (the PS_TRAINED_INDICES audit
hook, worker/data/slices.py) and checks that each training sample was trained once in every epoch; in BSP,
in ASP, and across a server killed and restarted with --resume. The server's summary says the same.

Each test prints one `EXACT {...}` JSON line; run with `pytest -s tests/test_exact_epochs.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from common.job.epoch_order import slice_indices
from common.transport.messages import SliceRange
from ps.checkpoint import checkpoint_files, read_checkpoint
from tests.processes import Cluster, start_server
from tests.fault_jobs import status, wait_for, wait_for_events
from worker import connect
from worker.transport.client import PSClient, ServerError

N = 1438  # the digits training split (the summary says it: check_summary)
EPOCHS = 5
JOB = ["--workers", "4", "--dataset", "digits", "--global-batch", "96", "--epochs", str(EPOCHS), "--lr", "0.1",
       "--evict-after", "2", "--grace", "5", "--controller", "dynamic", "--adjust-every", "3", "--deadband", "0.05"]
SLOWDOWNS = {"w0": 24 / 9, "w1": 24 / 9, "w2": 24 / 6, "w3": 1.0}  # HL4: speeds 9, 9, 6, 24
BASE_SLOWDOWN = 12.0


def start_workers(cluster: Cluster, audit: Path, base: float = BASE_SLOWDOWN) -> dict[str, subprocess.Popen]:
    audit.mkdir(exist_ok=True)
    return {name: cluster.start_worker(name, "--retry-for", "60", "--slowdown", f"{base * s:.2f}",
                                       prefix=("env", f"PS_TRAINED_INDICES={audit / name}.jsonl"))
            for name, s in SLOWDOWNS.items()}


def audit_lines(audit: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(audit.glob("*.jsonl")) for line in path.read_text().splitlines()]


def check_exactly_once(lines: list[dict], seed: int = 0, epochs: int = EPOCHS) -> Counter:
    """Every line trained on exactly its slice's indices; each position of the epochs 0..epochs-1 was
    trained once (and none of the epoch the last round wrapped into twice). The samples per epoch."""
    seen: Counter = Counter()
    for line in lines:
        ranges = [SliceRange(*r) for r in line["ranges"]]
        assert line["indices"] == slice_indices(seed, N, ranges).tolist(), line
        seen.update((r.epoch, p) for r in ranges for p in range(r.offset, r.stop))
    twice = [key for key, count in seen.items() if count > 1]
    assert twice == [], f"trained more than once: {twice[:10]} ..."
    per_epoch = Counter(epoch for epoch, _ in seen)
    assert all(per_epoch[e] == N for e in range(epochs)), per_epoch
    assert set(per_epoch) <= set(range(epochs + 1)), per_epoch
    return per_epoch


def check_summary(cluster: Cluster, first: int = 0, epochs: int = EPOCHS) -> dict:
    """The server's own count: every epoch from `first` (a resumed job's) trained whole, nothing twice."""
    (summary,) = cluster.events("summary")
    exact = summary["exactly_once"]
    assert summary["sampling"] == "exact" and summary["epochs"] == epochs, summary
    assert exact["exact_epochs"] == list(range(first, epochs)) and exact["overlaps"] == 0, exact
    assert exact["samples_per_epoch"] == N and all(exact["trained"][str(e)] == N for e in range(first, epochs)), exact
    return summary


def plans(cluster: Cluster) -> set[tuple]:
    return {tuple(sorted(e["batch_sizes"].items())) for e in cluster.events("adjust")}


def steps(target: str) -> int:
    """BSP rounds or ASP updates so far."""
    client = PSClient(target)
    try:
        return client.status().version
    finally:
        client.close()


def freeze_and_thaw(cluster: Cluster, workers: dict[str, subprocess.Popen], name: str) -> None:
    """SIGSTOP `name` in mid-epoch until the server evicts it, let the others go on, then SIGCONT: it rejoins."""
    os.kill(workers[name].pid, signal.SIGSTOP)
    wait_for(lambda: name not in status(cluster.target)["workers"], 30, f"eviction of {name}")
    at = steps(cluster.target)
    wait_for(lambda: steps(cluster.target) > at + 2, 60, f"progress without {name}")
    os.kill(workers[name].pid, signal.SIGCONT)
    wait_for(lambda: name in status(cluster.target)["workers"], 60, f"{name} to rejoin")


def report(**fields: object) -> None:
    print("EXACT " + json.dumps(fields), flush=True)


def run_with_an_eviction(tmp_path: Path, mode: str, base: float = BASE_SLOWDOWN, epochs: int = EPOCHS) -> None:
    job = [*JOB]
    job[job.index("--epochs") + 1] = str(epochs)
    cluster = start_server(tmp_path, ["--mode", mode, *job])
    try:
        workers = start_workers(cluster, tmp_path / "audit", base)
        wait_for(lambda: status(cluster.target)["epoch"] >= 1, 120, "epoch 1")
        freeze_and_thaw(cluster, workers, "w1")
        assert cluster.wait(300) == 0, cluster.server_log()
        per_epoch = check_exactly_once(audit_lines(tmp_path / "audit"), epochs=epochs)
        summary = check_summary(cluster, epochs=epochs)
        assert [e["worker"] for e in cluster.events("evict")] == ["w1"]
        assert len(plans(cluster)) >= 3, plans(cluster)  # the split changed: adjustments, the eviction, the rejoin
        report(mode=mode, samples_per_epoch=dict(per_epoch), plans=len(plans(cluster)),
               put_back=summary["exactly_once"]["put_back_samples"])
    finally:
        cluster.stop()


def test_bsp_trains_every_sample_once_per_epoch_through_plan_changes_an_eviction_and_a_rejoin(tmp_path: Path) -> None:
    run_with_an_eviction(tmp_path, "bsp")


def test_asp_trains_every_sample_once_per_epoch_through_plan_changes_an_eviction_and_a_rejoin(tmp_path: Path) -> None:
    # the others go on while w1 is frozen (its slice holds its epoch open), up to the job's last epoch at
    # most, and wait there for the eviction to serve that slice again: slower steps and more epochs keep
    # them training through the freeze (the digits model's steps are mostly overhead, which --slowdown does
    # not stretch: on a quiet machine the others trained 3.5 epochs' samples in the 2 s before the eviction)
    run_with_an_eviction(tmp_path, "asp", base=4 * BASE_SLOWDOWN, epochs=4 * EPOCHS)


def test_a_resumed_bsp_job_goes_on_with_the_same_epoch(tmp_path: Path) -> None:
    """The server is killed in mid-epoch and restarted with --resume: the rounds after its last checkpoint
    are lost with the model, so what the workers trained in them is trained again; counting what the
    model kept (before the kill, the rounds before the checkpoint's), every sample is trained once."""
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    job = ["--mode", "bsp", *JOB, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4"]
    cluster = start_server(first, job)
    workers: dict[str, subprocess.Popen] = {}
    try:
        workers = start_workers(cluster, tmp_path / "audit")
        wait_for(lambda: status(cluster.target)["round"] >= N // 96 + 6, 120, "the middle of epoch 1")
        cluster.server.kill()
        cluster.server.wait()
        saved = read_checkpoint(checkpoint_files(ckpt)[-1])
        assert saved["slice_cursor"] > 0, {k: saved[k] for k in ("epoch", "round", "slice_epoch", "slice_cursor")}
        resumed = start_server(second, [*job, "--resume", str(ckpt)], port=cluster.port)
        resumed.workers = list(workers.values())
        (resume,) = wait_for_events(resumed, "resume")
        assert resume["round"] == saved["round"]
        assert resumed.wait(300) == 0, resumed.server_log()
        lines = audit_lines(tmp_path / "audit")
        first_ids = {}  # each worker's id before the kill: its first line's (it rejoined the new server under another)
        for line in lines:
            first_ids.setdefault(line["worker"], line["worker_id"])
        kept = [line for line in lines if line["worker_id"] != first_ids[line["worker"]] or line["round"] < saved["round"]]
        lost = len(lines) - len(kept)
        per_epoch = check_exactly_once(kept)
        check_summary(resumed, first=saved["epoch"])  # it counts the epochs it ran: from the checkpoint's
        report(mode="bsp --resume", samples_per_epoch=dict(per_epoch), resumed_at_round=saved["round"],
               slice_cursor=saved["slice_cursor"], steps_lost_with_the_model=lost)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
        cluster.stop()


class Recorded(Dataset):
    """A user's own training set of N samples that records every index read from it."""

    def __init__(self, size: int = N) -> None:
        self.x = torch.randn(size, 64, generator=torch.Generator().manual_seed(5))
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self.read.append(int(index))
        return self.x[index], int(index) % 10


def test_your_own_data_in_your_own_loop_is_read_once_per_epoch(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, ["--workers", "1", "--model-arg", "hidden=16", "--dataset", "digits",
                                      "--global-batch", "64", "--epochs", "2", "--grace", "0"])
    try:
        with pytest.raises(ServerError, match=f"FAILED_PRECONDITION: this worker's dataset has 100 samples, the job's "
                                              f"training set has {N}"):
            connect(cluster.target, name="short", timeout=60, dataset=Recorded(100))
        own = Recorded()
        with connect(cluster.target, name="own", timeout=60, dataset=own, dataset_fingerprint="v1") as session:
            for x, y in session.batches():
                loss = F.cross_entropy(session.model(x), y)
                session.model.zero_grad()
                loss.backward()
                session.step()
        assert cluster.wait(60) == 0, cluster.server_log()
        counts = Counter(own.read)
        assert set(counts) == set(range(N)) and set(counts.values()) <= {2, 3}  # the last round wraps into π_2
        assert sum(counts.values()) - 2 * N < 64, counts
        (summary,) = cluster.events("summary")
        assert summary["exactly_once"]["exact_epochs"] == [0, 1], summary
    finally:
        cluster.stop()
