"""ps-cluster make-data (deploy/make_data.py): a folder the image dataset reads, arrays npy_arrays reads,
and nothing written when it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.job.datasets import build_dataset
from deploy.cli import main as cluster_main
from deploy.make_data import make_data


def test_make_data_writes_a_folder_the_image_dataset_reads(tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    code = cluster_main(["make-data", "--out", str(out), "--dataset-arg", "size=200", "--dataset-arg", "image_size=8",
                         "--dataset-arg", "channels=1", "--quiet"])
    assert code == 0 and "--dataset image_folder" in capsys.readouterr().out
    data = build_dataset("image_folder", {"root": str(out)}, seed=0)
    assert (len(data.train), len(data.test), data.input_shape) == (160, 40, (1, 8, 8))
    assert cluster_main(["make-data", "--out", str(out)]) == 2  # an existing folder: nothing written
    assert "exists" in capsys.readouterr().err
    assert make_data("synthetic", {"size": 30}, 0, tmp_path / "arrays", "npy") == 30
    arrays = build_dataset("npy_arrays", {"root": str(tmp_path / "arrays")}, seed=0)
    assert arrays.input_shape == (3, 32, 32)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        make_data("teacher", {"size": 30}, 0, tmp_path / "teacher", "png")
    assert not (tmp_path / "teacher").exists() and not (tmp_path / "teacher.partial").exists()
