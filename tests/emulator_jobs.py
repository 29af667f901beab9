"""What `ps-cluster run` tests start from: a job whose epochs take well under a second, and a
profile file of given worker shares."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

TINY_JOB = [
    "--model", "mlp", "--model-arg", "hidden=32", "--dataset", "synthetic", "--dataset-arg", "size=512",
    "--dataset-arg", "image_size=8", "--dataset-arg", "channels=1", "--global-batch", "64", "--lr", "0.05",
]
"""A job whose epochs take well under a second (and whose processes need not import scikit-learn)."""


def write_profile(path: Path, workers: Sequence[float]) -> Path:
    path.write_text(json.dumps({"kind": "profile", "name": path.stem, "bsp": {"workers": workers}}))
    return path
