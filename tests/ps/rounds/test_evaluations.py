"""--eval-every 1/K: the global model is evaluated at each K-th of an epoch's samples as well as at its
end, the `eval` record's epoch the epochs trained (0.25, 0.5, ...), so that a time to a test accuracy
resolves a fraction of an epoch. Other values are whole epochs or 1/K."""

from __future__ import annotations

import argparse
import asyncio
import pytest

from common.ops.arg_types import eval_interval
from tests.coordinator_rounds import close_round, joined_job


@pytest.mark.parametrize(("every", "expected"), [("0.25", [0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2]), ("1", [1, 2]),
                                              ("2", [2])])
def test_an_epoch_is_evaluated_at_each_kth_of_its_samples(every: str, expected: list[float]) -> None:
    async def run() -> None:
        # digits: 1,438 training samples, 6 rounds of 240 an epoch (the K-ths passed after rounds 2, 3, 5)
        async with joined_job("--global-batch", "240", "--eval-every", every, "--epochs", "2", events=("eval",)) as job:
            while not job.c.done:
                await close_round(job.c, job.joined)
            job.evaluator.drain()
            assert [r["epoch"] for r in job.records] == expected
            walls = [r["wall_s"] for r in job.records]
            assert walls == sorted(walls) and all(0.0 <= r["accuracy"] <= 1.0 for r in job.records)

    asyncio.run(run())


@pytest.mark.parametrize(("text", "read"), [("1", (1, 1)), ("3", (3, 1)), ("0.5", (1, 2)), ("0.25", (1, 4)),
                                          (repr(1 / 3), (1, 3)), ("0.1", (1, 10))])
def test_an_interval_is_whole_epochs_or_a_kth_of_one(text: str, read: tuple[int, int]) -> None:
    interval = eval_interval(text)
    assert interval == read and (interval.every, interval.per_epoch) == read and eval_interval(interval.flag()) == read


@pytest.mark.parametrize("text", ["1.5", "0.3", "0", "-1", "nan", "2/3"])
def test_any_other_interval_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        eval_interval(text)
