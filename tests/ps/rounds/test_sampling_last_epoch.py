"""--sampling exact: how far the slices go. BSP's last round wraps into π_E (E = --epochs) to keep its
planned size; ASP hands out nothing past the job's last epoch, π_(E-1), so a worker that stalls on an
earlier epoch's slice cannot let the others train an epoch the job never asked for."""

from __future__ import annotations

import pytest

from ps.rounds.sampling import Sampling
from ps.server_job import build_job
from tests.conftest import job_args


def sampling(mode: str, epochs: int = 2) -> Sampling:
    job = build_job(job_args("--mode", mode, "--workers", "2", "--global-batch", "64", "--epochs", str(epochs)))
    return job.coordinator.sampling


@pytest.mark.parametrize(("mode", "last"), [("asp", 1), ("bsp", 2)])
def test_the_slices_stop_at_the_last_epoch_the_mode_trains(mode: str, last: int) -> None:
    slices = sampling(mode).slices
    n = slices.num_samples
    taken = slices.take(10 * n)  # a worker asking on while another holds an earlier slice
    assert max(r.epoch for r in taken) == last
    assert sum(r.count for r in taken) == (last + 1) * n
    assert slices.take(1) == ()


def test_an_asp_checkpoint_with_its_cursor_in_the_wrapped_epoch_still_loads() -> None:
    s = sampling("asp")
    n = s.slices.num_samples
    s.restore({"epoch": 1, "slice_epoch": 2, "slice_cursor": 5, "slices_put_back": [[1, 0, 3]]})
    assert s.slices.epoch == 2 and s.slices.returned[0].epoch == 1
    assert sum(r.count for r in s.slices.take(2 * n)) == 3 + n - 5
