"""Where a worker computes (`ps-worker --device`): parsing, and what it declares at Join."""

from __future__ import annotations

import pytest
import torch

from worker.device import gpu_uuid, resolve_device, synchronize

HAS_CUDA = torch.cuda.is_available()


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu") == resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert gpu_uuid(torch.device("cpu")) is None
    synchronize(torch.device("cpu"))  # nothing to wait for


@pytest.mark.parametrize("name", ["", "gpu", "cpu:0", "auto:1", "cuda:", "cuda:x", "cuda:-1", "cuda0"])
def test_malformed_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="--device must be auto, cpu, cuda or cuda:N"):
        resolve_device(name)


def test_a_gpu_this_process_cannot_see_is_refused() -> None:
    count = torch.cuda.device_count() if HAS_CUDA else 0
    with pytest.raises(ValueError, match="no CUDA device" if count == 0 else f"there are {count} CUDA devices"):
        resolve_device(f"cuda:{count}")
    if count == 0:
        with pytest.raises(ValueError, match="use --device cpu"):
            resolve_device("cuda")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_a_gpu_declares_its_uuid() -> None:
    device = resolve_device("cuda:0")
    assert device == torch.device("cuda", 0) == resolve_device("auto")
    uuid = gpu_uuid(device)
    assert uuid and uuid == gpu_uuid(resolve_device("cuda"))
