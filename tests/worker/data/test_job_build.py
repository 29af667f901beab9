"""The worker's build of the job its server names: options outside their ranges and a model larger
than the worker's memory are refused as the worker's set-up error, before anything is built."""

from __future__ import annotations

import time

import pytest

from common.job.spec import JobSpec
from worker.data import job_build
from worker.data.job_build import JobSetupError, build_job


def test_the_servers_options_out_of_range_are_refused_in_milliseconds() -> None:
    for options, needle in (({"layers": 3000000}, "layers must be in [0, 64], got 3000000"),
                            ({"hidden": 60000}, "hidden must be in [1, 16384], got 60000")):
        start = time.process_time()
        with pytest.raises(JobSetupError, match="this worker cannot build the job's data and model") as caught:
            build_job(JobSpec(model_options=options))
        assert needle in str(caught.value) and time.process_time() - start < 0.5


def test_a_model_beyond_the_workers_memory_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_build, "available_cpu_bytes", lambda: float(4 << 30))
    with pytest.raises(JobSetupError, match=r"model 'mlp' with options .* more than 80% of the 4.0 GiB"):
        build_job(JobSpec(model_options={"hidden": 16384, "layers": 8}))
    with pytest.raises(JobSetupError, match=r"dataset 'synthetic' .* more than 80% of the 4.0 GiB"):
        build_job(JobSpec(model="cnn", dataset="synthetic", dataset_options={"size": 2**24, "image_size": 64}))
    built = build_job(JobSpec(model_options={"hidden": 16}))
    assert built.dataset.num_classes == 10
