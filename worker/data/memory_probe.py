"""How large a batch this worker's memory holds (b_max, OmniLearn's Eq. 9 bound), measured once before
it joins: one forward and backward of the job's model at two batch sizes, a straight line through the
two memory figures (bytes = fixed + per_sample · b), and the memory free for it.

- CUDA: the peak allocated by torch at each size (`torch.cuda.max_memory_allocated`), against
  `CUDA_FRACTION` of the device's free memory plus what this process already holds there.
- CPU: a process's peak RSS is a high-water mark since it started (the dataset and model usually
  exceed a small probe), so the figure is an estimate from the same two-point measurement of the
  allocations a step makes: the bytes of the tensors autograd saves for backward, doubled (backward
  holds about as much again in activation gradients), against the memory available to the process
  (MemAvailable, or the cgroup's limit less its usage when that is lower), of which
  `CPU_FRACTION` is used. On a CPU the bound is rarely the one that binds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common.job.spec import JobSpec
from common.job.splits import sample_batch
from common.ops.available_memory import available_cpu_bytes
from worker.data.job_build import BuiltJob, JobSetupError, build_job


CPU_FRACTION = 0.8
"""The share of available memory a CPU worker plans to use for a step's activations."""
CUDA_RESERVE_BYTES = 256 << 20
"""Device memory kept back for the gradients' flat copy."""
CUDA_PROBE_BATCH = 256
"""The smallest of a GPU probe's two batches: CUDA's allocator rounds every block up to 512 bytes, so
at a few samples a small model's per-sample bytes are lost in the rounding."""
CUDA_FRACTION = 0.85
"""The share of the rest a GPU worker plans to use: the allocator's blocks at a large batch hold more
than the line through two small steps says (on an H200 at 90%, `cnn-bn` planned 1.5% under the largest
batch that fit and an MLP 1.6% over it)."""


@dataclass(frozen=True)
class MemoryProbe:
    """The two-point line and the bound it gives."""

    per_sample_bytes: float
    fixed_bytes: float
    available_bytes: float
    max_batch: int


def _step_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    """The memory one forward and backward of (x, y) takes: CUDA's peak allocated, on a CPU twice the
    bytes of the tensors autograd saves."""
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        F.cross_entropy(model(x), y).backward()
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return 2.0 * saved


def probe_max_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, small: int = 2,
                    available_bytes: float | None = None) -> MemoryProbe:
    """Measure a step at `small` and `2·small` samples of (x, y) (on a GPU at least `CUDA_PROBE_BATCH`)
    with `model` and return the line and the largest batch that fits in `available_bytes` (None:
    measured, see the module). The model is
    left as it was: on a CPU the steps run on it and its buffers (BatchNorm's running statistics),
    gradients and mode are put back; on a GPU they run on a copy there."""
    in_place = device.type == "cpu"
    small = max(2, small) if in_place else max(CUDA_PROBE_BATCH, small)  # BatchNorm needs two samples
    if in_place and len(x) < 2 * small:
        raise ValueError(f"the probe needs {2 * small} samples, the data has {len(x)}")
    if len(x) == 0:
        raise ValueError("the probe needs samples, the data has none")
    probe = model if in_place else copy.deepcopy(model).to(device)
    buffers = [(b, b.clone()) for b in model.buffers()] if in_place else []
    training = model.training
    rows = torch.arange(2 * small) % len(x)  # on a GPU the data's samples repeat when it has fewer
    xs, ys = x[rows].to(device), y[rows].to(device)
    try:
        probe.train()
        at_small = _step_bytes(probe, xs[:small], ys[:small], device)
        at_large = _step_bytes(probe, xs, ys, device)
    finally:
        for buffer, saved in buffers:
            buffer.copy_(saved)
        model.zero_grad(set_to_none=True)
        model.train(training)
    per_sample = max(1.0, (at_large - at_small) / small)
    fixed = max(0.0, at_small - per_sample * small)
    if available_bytes is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            available_bytes = (float(free + torch.cuda.memory_reserved(device)) - CUDA_RESERVE_BYTES) * CUDA_FRACTION
        else:
            available_bytes = available_cpu_bytes() * CPU_FRACTION
            fixed = 0.0  # the parameters and gradients are already in the process's usage
    del probe
    if device.type == "cuda":
        torch.cuda.empty_cache()
    room = available_bytes - fixed
    best = int(min(room / per_sample, 2**31 - 1)) if math.isfinite(room) and room > 0 else (0 if room <= 0 else 2**31 - 1)
    return MemoryProbe(per_sample, fixed, available_bytes, best)


INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Declared:
    """What a worker tells the server at Join and how it computes: its max batch (0: no bound of its
    own), the most samples one forward pass may take (None: any; worker/accumulate.py), and the job
    it built to measure them (None: none built), for the session to use instead of building it again."""

    max_batch: int
    pass_samples: int | None = None
    built: BuiltJob | None = None


def declared_max_batch(job: Callable[[], JobSpec], device: torch.device | None, given: int | None,
                       allowed_imports: Sequence[str] = ()) -> Declared:
    """The max batch this worker declares at Join and the size of its passes.

    `given` (ps-worker --max-batch) wins. Otherwise the model of the `job` (asked only then) is built
    and probed on `device` (None: the CPU; `probe_max_batch`), and handed on in `Declared.built`.
    With --micro-batch m the worker computes one micro-batch at a time, so its memory bounds m and not
    its whole batch: it declares no bound and computes its batch in passes of as many micro-batches
    as fit, or raises JobSetupError if one does not (or the job's data and model cannot be built here)."""
    if given is not None:
        return Declared(given)
    built, device = build_job(job(), allowed_imports), device or torch.device("cpu")
    spec, data = built.spec, built.dataset
    small = max(2, spec.micro_batch)
    try:
        x, y = sample_batch(data.train, list(range(min(len(data.train), 2 * small))))  # type: ignore[arg-type]  # the probe's samples only (Splits checks __len__)
    except (ValueError, OSError) as exc:  # a dataset's own error names the file or row it cannot read
        raise JobSetupError(f"reading the job's first training samples to measure this worker's memory: {exc}") from exc
    found = probe_max_batch(built.model, x, y, device, small=small)
    if spec.micro_batch > 1:
        if found.max_batch < spec.micro_batch:
            raise JobSetupError(f"this worker's memory holds about {found.max_batch} samples of the model at once, "
                                f"below the job's --micro-batch {spec.micro_batch}")
        return Declared(0, found.max_batch // spec.micro_batch * spec.micro_batch, built)
    return Declared(max(1, min(found.max_batch, INT32_MAX)), None, built)
