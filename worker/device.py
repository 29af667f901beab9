"""The device a worker computes on (`ps-worker --device`), and what it tells the server about it.

The wire buffers and the server's parameters stay fp32 on the CPU; only the model, its batches and
its gradients live on the compute device. A CUDA worker declares its GPU's UUID at Join, so the
server plans NCCL for an --allreduce group only when no two ranks share a GPU.
"""

from __future__ import annotations

import re

import torch

from worker.flags import DEVICE_CHOICES

_DEVICE = re.compile(r"(auto|cpu|cuda)(?::(\d+))?")


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` (CUDA when there is a GPU, else the CPU), `cpu`, `cuda` or `cuda:N`; ValueError when
    the name is malformed or names a GPU this process cannot see."""
    match = _DEVICE.fullmatch(name.strip().lower())
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise ValueError(f"--device must be {DEVICE_CHOICES}, got {name!r}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"--device {name}: this machine has no CUDA device (torch {torch.__version__}); use --device cpu")
    i = torch.cuda.current_device() if index is None else int(index)
    if not 0 <= i < count:
        raise ValueError(f"--device {name}: there are {count} CUDA devices (0-{count - 1})")
    return torch.device("cuda", i)


def gpu_uuid(device: torch.device) -> str | None:
    """The UUID of a CUDA device ("" when torch cannot tell), None for the CPU."""
    if device.type != "cuda":
        return None
    return str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a step's compute time must include it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
