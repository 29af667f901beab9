"""A job that trains on an image folder on disk, with real server and worker processes."""

from __future__ import annotations

from pathlib import Path

from deploy.make_data import make_data
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
