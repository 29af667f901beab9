"""A job that trains on an image folder on disk, with real server and worker processes; workers that a
corrupt image stops say so as they leave."""

from __future__ import annotations

import time
from pathlib import Path

from common.job.datasets import build_dataset
from deploy.make_data import make_data
from ps.ops.progress import NO_WORKER_LEFT
from tests.data_files import write_folder
from tests.processes import start_server


def test_a_job_trains_on_an_image_folder_on_disk(tmp_path: Path) -> None:
    out = tmp_path / "digits"
    assert make_data("digits", {}, 0, out, "png", progress=False) == 1797
    cluster = start_server(tmp_path, ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=256", "--dataset",
                                      "image_folder", "--dataset-arg", f"root={out}", "--dataset-arg", "padding=0",
                                      "--dataset-arg", "flip=false", "--global-batch", "64", "--lr", "0.1",
                                      "--epochs", "8"])
    try:
        cluster.start_worker("w0", "--loader-workers", "1")
        cluster.start_worker("w1", "--loader-workers", "0")
        assert cluster.wait(300) == 0, cluster.server_log()
        for name, proc in zip(("w0", "w1"), cluster.workers):
            assert proc.returncode == 0, cluster.worker_log(name)
    finally:
        cluster.stop()
    (summary,) = cluster.events("summary")
    assert summary["accuracy"] >= 0.85, summary
    epochs = cluster.events("epoch")
    assert set(epochs[-1]["data_wait_ms"]) == {"w0", "w1"}
    assert "data wait ms" in cluster.server_log()


def test_workers_stopped_by_a_corrupt_image_tell_the_server_which_and_the_job_waits(tmp_path: Path) -> None:
    """A corrupt training image the normalization statistics did not read (they read NORMALIZE_SAMPLE of
    the files) passes the build; each worker that reaches it stops (exit 1, on_corrupt=stop) and its
    Leave says which file: the server's leave records (`why`) and progress lines name it, and the job,
    which no reason ends, waits for a worker to join."""
    root = write_folder(tmp_path / "images", classes=2, per_class=160)
    options = {"root": str(root), "test_fraction": 0.1}
    for bad in sorted(root.glob("c*/*.png")):  # the first file whose corruption the build does not see
        kept = bad.read_bytes()
        bad.write_bytes(b"not a png")
        try:
            data = build_dataset("image_folder", options, seed=0)
        except ValueError:  # read by the statistics: refused at the build
            bad.write_bytes(kept)
            continue
        if any(path == str(bad) for path, _ in data.train.dataset.files):
            break
        bad.write_bytes(kept)
    cluster = start_server(tmp_path, ["--workers", "2", "--dataset", "image_folder", "--dataset-arg", f"root={root}",
                                      "--dataset-arg", "test_fraction=0.1", "--global-batch", "32", "--epochs", "50"])
    try:
        for name in ("w0", "w1"):
            cluster.start_worker(name)
        for name, proc in zip(("w0", "w1"), cluster.workers):
            assert proc.wait(timeout=240) == 1, cluster.worker_log(name)
            assert f"ps-worker: error: reading the job's data: cannot decode image {bad}" in cluster.worker_log(name)
        deadline = time.monotonic() + 30
        while len(cluster.events("leave")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        leaves = cluster.events("leave")
        assert sorted((e["worker"], e["why"]) for e in leaves) == [("w0", f"corrupt sample {bad}"),
                                                                  ("w1", f"corrupt sample {bad}")], leaves
        assert cluster.server.poll() is None  # the job waits: no worker's reason ends it
        log = cluster.server_log()
        assert f"left: corrupt sample {bad} ({NO_WORKER_LEFT})" in log and f"left: corrupt sample {bad}\n" in log, log
    finally:
        cluster.stop()
