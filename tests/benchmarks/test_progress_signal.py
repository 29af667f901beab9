"""benchmarks.progress_signal: the loss's scatter and a window's signal-to-noise, and a small run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks import progress_signal

TINY = ["--model-arg", "width=4", "--dataset-arg", "size=600", "--dataset-arg", "image_size=8"]


def test_the_residual_scatter_is_the_noise_about_a_curved_trend() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(2000, dtype=float)
    losses = 2.3 * np.exp(-steps / 700) + 0.5 + rng.normal(0, 0.2, len(steps))
    assert progress_signal.residual_sd(losses.tolist()) == pytest.approx(0.2, rel=0.08)
    with pytest.raises(ValueError, match="41 steps"):
        progress_signal.residual_sd([1.0] * 40)


def test_a_window_measures_a_straight_fall_to_its_standard_error() -> None:
    rng = np.random.default_rng(1)
    batch, window, sd, slope = 64, 16, 0.2, -0.15  # slope per thousand samples
    x = np.arange(window * 400) * batch / 1000
    each = progress_signal.window_snrs((1.0 + slope * x + rng.normal(0, sd, len(x))).tolist(), batch, window, sd)
    assert len(each) == 400
    error = sd / math.sqrt(sum((i * batch / 1000 - (window - 1) / 2 * batch / 1000) ** 2 for i in range(window)))
    assert all(e["error"] == pytest.approx(error) for e in each)
    slopes = np.array([e["slope_per_1k"] for e in each])
    assert slopes.mean() == pytest.approx(slope, abs=3 * error / 20)  # unbiased
    assert slopes.std() == pytest.approx(error, rel=0.12)  # its error is the slope's spread
    assert np.median([e["snr"] for e in each]) == pytest.approx(-slope / error, abs=0.3)


def test_two_windows_need_their_snr_for_a_gap_at_so_many_errors() -> None:
    assert progress_signal.needed_snr(0.25, 2.0) == pytest.approx(2 * math.sqrt(2) / 0.25)
    assert progress_signal.needed_snr(0.5, 1.0) == pytest.approx(math.sqrt(2) / 0.5)


def test_a_small_run_reports_every_batch_seed_and_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert progress_signal.main([*TINY, "--batches", "4,8", "--seeds", "0", "--epochs", "1", "--windows", "4,8",
                                 "--json"]) == 0
    out = capsys.readouterr().out
    report, end = json.JSONDecoder().raw_decode(out)
    assert [(r["batch"], r["seed"]) for r in report["runs"]] == [(4, 0), (8, 0)]
    assert [r["steps"] for r in report["runs"]] == [120, 60]  # 480 training samples an epoch
    for run in report["runs"]:
        assert run["loss_sd"] > 0 and len(run["accuracy_by_epoch"]) == 1
        assert set(run["by_window"]) == {"4", "8"}
        assert run["by_window"]["8"]["windows"] == run["steps"] // 8
    assert "| 4 | 0 |" in out[end:] and "needs an SNR of 11.3" in out[end:]
    targets = report["targets"]
    assert [t["threshold"] for t in targets] == [11.31, 11.31] and "over 4 rounds at B = 8" in targets[1]["name"]
    assert targets[0]["value"] == pytest.approx(report["runs"][0]["by_window"]["4"]["median_snr"], abs=1e-4)


def test_a_window_longer_than_the_run_has_no_snr_and_its_target_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert progress_signal.main([*TINY, "--batches", "8", "--seeds", "0", "--epochs", "1", "--windows", "100",
                                 "--json"]) == 0
    report, _ = json.JSONDecoder().raw_decode(capsys.readouterr().out)
    assert report["runs"][0]["by_window"]["100"]["median_snr"] is None
    assert report["targets"][0]["value"] is None and report["targets"][0]["pass"] is None


@pytest.mark.parametrize("argv, said", [
    (["--batches", "0"], "integers >= 1"),
    (["--windows", "2"], "windows of 3"),
    (["--gap", "1.5"], "--gap"),
    (["--epochs", "0"], "--epochs"),
])
def test_bad_flags_are_refused_with_the_flag_named(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        progress_signal.main(argv)
    assert exit_info.value.code == 2 and said in capsys.readouterr().err


def test_a_batch_above_the_training_set_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert progress_signal.main([*TINY, "--batches", "1000", "--seeds", "0", "--epochs", "1"]) == 2
    assert "exceeds the 480 training samples" in capsys.readouterr().err
