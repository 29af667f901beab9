"""The bound on a push's norm (common/params/norm_clip.py): a fixed ceiling, a multiple of the recent
median once there is one, clipping (never refusing) down to the lower of them, a history an outlier
cannot raise, and the norm of a push as it arrived (chunks, narrow dtypes, values whose squares
overflow fp32)."""

from __future__ import annotations

import math

import pytest
import torch

from common.params.norm_clip import HISTORY, MIN_HISTORY, NormClip, NormLimits, scaled, vector_norm
from common.transport.chunked import ChunkedVector


def test_both_rules_are_off_unless_asked_for() -> None:
    clip = NormClip(NormLimits())
    assert not clip.limits.on and clip.limit() is None
    assert clip.factor(1e30) == 1.0


@pytest.mark.parametrize(("fields", "flag"), [({"max_norm": 0.0}, "--max-update-norm"),
                                              ({"max_norm": math.inf}, "--max-update-norm"),
                                              ({"outlier_ratio": 0.5}, "--clip-outliers")])
def test_a_limit_that_bounds_everything_or_nothing_is_refused(fields: dict[str, float], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        NormLimits(**fields)


def test_a_fixed_ceiling_clips_from_the_first_push() -> None:
    clip = NormClip(NormLimits(max_norm=10.0))
    assert clip.factor(4.0) == 1.0
    assert clip.factor(1e31) == pytest.approx(1e-30)
    assert clip.factor(10.0) == 1.0  # at the ceiling: unchanged


def test_the_outlier_rule_waits_for_a_median_then_clips_to_k_times_it() -> None:
    clip = NormClip(NormLimits(outlier_ratio=10.0))
    for norm in (1.0, 2.0, 3.0, 1e6)[: MIN_HISTORY - 1]:  # no median yet: even 1e6 passes
        assert clip.limit() is None and clip.factor(norm) == 1.0
    clip.factor(2.0)  # the fifth: the median (2.0) is known from now on
    assert clip.limit() == 20.0
    assert clip.factor(40.0) == 0.5
    assert clip.factor(19.0) == 1.0


def test_a_minority_pushing_huge_values_every_time_cannot_raise_the_limit() -> None:
    """Each outlier enters the history as clipped, and while it is fewer than half the pushes the
    median stays an honest norm: one member of three pushing 1e30 every round stays at K x that."""
    clip = NormClip(NormLimits(outlier_ratio=10.0))
    for _ in range(MIN_HISTORY):
        clip.factor(1.0)
    for _ in range(3 * HISTORY):
        assert clip.factor(1.0) == 1.0 and clip.factor(1.0) == 1.0
        assert clip.factor(1e30) == pytest.approx(1e-29)
    assert clip.limit() == 10.0


def test_with_both_rules_the_lower_limit_applies() -> None:
    clip = NormClip(NormLimits(max_norm=5.0, outlier_ratio=10.0))
    for _ in range(MIN_HISTORY):
        clip.factor(0.1)
    assert clip.limit() == pytest.approx(1.0)
    clip = NormClip(NormLimits(max_norm=5.0, outlier_ratio=10.0))
    for _ in range(MIN_HISTORY):
        clip.factor(3.0)
    assert clip.limit() == 5.0


def test_a_norm_that_is_not_finite_is_left_to_the_overflow_checks() -> None:
    clip = NormClip(NormLimits(max_norm=1.0))
    assert clip.factor(math.inf) == 1.0 and clip.factor(math.nan) == 1.0 and not clip.recent


def test_the_norm_of_a_push_as_it_arrived() -> None:
    values = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    exact = float(torch.linalg.vector_norm(values.double()))
    chunks = ChunkedVector([values[:1234], values[1234:4000], values[4000:]])
    assert vector_norm(values) == pytest.approx(exact, rel=1e-5)
    assert vector_norm(chunks) == pytest.approx(exact, rel=1e-5)
    assert vector_norm(ChunkedVector([values.bfloat16()])) == pytest.approx(exact, rel=1e-2)
    huge = torch.full((1000,), 1e30)  # its squares overflow fp32: widened
    assert vector_norm(ChunkedVector([huge[:500], huge[500:]])) == pytest.approx(1e30 * math.sqrt(1000), rel=1e-6)


def test_a_clipped_push_is_a_new_fp32_vector_and_the_received_one_is_untouched() -> None:
    values = torch.full((10,), 3.0)
    received = ChunkedVector([values[:4].bfloat16(), values[4:]])
    out = scaled(received, 0.5)
    assert out.dtype == torch.float32 and torch.equal(out, torch.full((10,), 1.5))
    assert torch.equal(values, torch.full((10,), 3.0))
