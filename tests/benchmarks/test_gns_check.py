"""benchmarks.gns_check (the GNS estimator against brute force) and benchmarks.batch_sweep, run small."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from benchmarks import batch_sweep, gns_check

SMALL = ["--dataset-arg", "size=2048", "--model-arg", "hidden=32"]


def test_brute_force_truth_is_the_per_sample_gradients_mean_and_variance() -> None:
    trainer = gns_check.Trainer(gns_check.build_parser().parse_args([*SMALL, "--dataset-arg", "size=200"]))
    grads = []
    for x, y in zip(trainer.data.train_x, trainer.data.train_y):  # one backward per sample, no vmap
        trainer.model.zero_grad()
        F.cross_entropy(trainer.model(x[None]), y[None]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in trainer.params]).double())
    stacked = torch.stack(grads)
    mean = stacked.mean(0)
    signal, noise = float(mean @ mean), float(((stacked - mean) ** 2).sum(1).mean())
    truth = trainer.true_noise_scale(chunk=64)
    assert truth["signal"] == pytest.approx(signal, rel=1e-4) and truth["noise"] == pytest.approx(noise, rel=1e-4)
    assert trainer.full_signal(chunk=64) == pytest.approx(signal, rel=1e-4)


def test_a_small_check_reports_every_point_and_the_frozen_estimates_find_the_truth(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--global-batch", "64", "--points", "1,3", "--frozen-rounds", "100", "--json"]
    assert gns_check.main(argv) == 0
    out = capsys.readouterr().out
    report, end = json.JSONDecoder().raw_decode(out)
    assert "| 1 |" in out[end:] and "| 3 |" in out[end:]  # the table, a row per point
    assert report["split"] == [8, 8, 5, 43] and report["equal_split"] == [16, 16, 16, 16]
    assert [p["epoch"] for p in report["points"]] == [1, 3]
    first = report["points"][0]
    assert first["true_window"]["rounds"] == first["step"] == 25  # the first window holds every round so far
    for point in report["points"]:
        assert point["online"]["phi"] is not None
        assert 0.5 < point["frozen_split_ratio"] < 1.5 and 0.5 < point["frozen_equal_ratio"] < 1.5
        assert point["within_tolerance"] == (abs(point["online_ratio"] - 1) <= 0.25)


def test_a_point_within_the_first_epoch_is_compared_after_that_part_of_its_steps(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--global-batch", "64", "--points", "0.2,1", "--frozen-rounds", "20", "--json"]
    assert gns_check.main(argv) == 0
    report, _ = json.JSONDecoder().raw_decode(capsys.readouterr().out)
    assert [(p["epoch"], p["step"]) for p in report["points"]] == [(0.2, 5), (1, 25)]
    assert report["points"][0]["true_window"]["rounds"] == 5


def test_points_are_epochs_above_zero() -> None:
    assert gns_check.point_steps([2, 0.01, 0.5], 25) == {1: 0.01, 12: 0.5, 50: 2}
    for text in ("0,1", "-1", "x", "", "inf"):
        with pytest.raises(Exception, match="epochs"):
            gns_check.epochs(text)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--smoothing", "1"], "--smoothing must be in [0, 1)"),
        (["--shares", "4"], "--shares needs two or more workers"),
        (["--frozen-rounds", "0"], "need --frozen-rounds >= 1"),
        (["--global-batch", "100000"], "exceeds the 1638 training samples"),
        (["--global-batch", "3"], "leaves a worker no sample"),
        (["--dataset-arg", "label_noise=2"], "label_noise must be in [0, 1]"),
    ],
)
def test_check_refuses_bad_arguments_with_one_line(argv: list[str], needle: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = gns_check.main([*SMALL, "--points", "1", *argv])
    except SystemExit as exc:  # argparse's parser.error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.strip().splitlines()[-1].startswith("python -m benchmarks.gns_check")


def test_batch_sweep_reports_accuracy_per_epoch_and_time_to_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert batch_sweep.main([*SMALL, "--batch", "32,256", "--epochs", "3", "--target", "0.01,1.0", "--json"]) == 0
    out = capsys.readouterr().out
    report, end = json.JSONDecoder().raw_decode(out)
    assert [r["batch"] for r in report["results"]] == [32, 256]
    for r in report["results"]:
        assert len(r["accuracy"]) == len(r["seconds"]) == 3 and r["seconds"] == sorted(r["seconds"])
        assert r["reached"]["0.01"] == {"epoch": 1, "seconds": r["seconds"][0]} and r["reached"]["1.0"] is None
    assert "| 32 |" in out[end:] and "not reached" in out[end:]
    assert batch_sweep.main([*SMALL, "--batch", "100000", "--epochs", "1"]) == 2
    assert "exceeds the 1638 training samples" in capsys.readouterr().err


def test_the_server_check_takes_whole_epochs_only(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import gns_server

    with pytest.raises(SystemExit):
        gns_server.main(["--points", "0.5"])
    assert "--points must be whole epochs here" in capsys.readouterr().err
