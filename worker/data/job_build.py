"""The job's data and model as this worker builds them: once per join, whether the memory probe
(worker/data/memory_probe.py) needs them before joining or the session (worker/runtime.py) after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from common.job.datasets import TrainingData, build_dataset
from common.job.models import build_model
from common.job.spec import JobSpec
from common.ops.available_memory import available_cpu_bytes


class JobSetupError(ValueError):
    """The job the server runs names a model or dataset this worker cannot build (a module it
    cannot import, options outside their ranges or that its builder refuses, a model or data set
    larger than its memory), or one whose micro-batch its memory cannot hold."""


@dataclass
class BuiltJob:
    """A job's data set and freshly built model, for the spec they were built for."""

    spec: JobSpec
    dataset: TrainingData
    model: nn.Module


def build_job(spec: JobSpec, allowed_imports: Sequence[str] = ()) -> BuiltJob:
    """Build `spec`'s data and model (JobSetupError if this worker cannot). A model or dataset given
    as a `module:function` path is imported only from a module under one of `allowed_imports`
    (the worker's own choice, never its server's: importing runs the module's code). A built-in's
    options are checked against their ranges and its size against this process's memory before it
    is built (common.job.memory_bounds): a server cannot make the worker build for minutes or swap."""
    allowed = tuple(allowed_imports)
    try:
        dataset = build_dataset(spec.dataset, spec.dataset_options, spec.seed, allowed, available_cpu_bytes())
        model = build_model(spec.model, dataset.input_shape, dataset.num_classes, spec.model_options, spec.seed, allowed,
                            available_cpu_bytes())
    except ValueError as exc:
        raise JobSetupError(f"this worker cannot build the job's data and model: {exc}") from exc
    return BuiltJob(spec, dataset, model)
