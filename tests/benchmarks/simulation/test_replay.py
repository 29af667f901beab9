"""benchmarks.simulation.replay and `python -m benchmarks.simulation_check`: the simulator against real
runs. The pieces recover what they are fitted from (laws, noise, the round's overhead) on traces made
from known laws; the check of the committed HL8 results (dynamic, 11 runs) meets its targets, leave
one out; input that is not such a report is refused with a clear error."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks import simulation_check
from benchmarks.simulation.replay import Epoch, RealRun, fit_laws, overhead_ms, read_runs, scale_run, step_noise

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
HL8_DYNAMIC = [RESULTS / f"hetero-2026-11-27{suffix}.json" for suffix in ("", "-2", "-3", "-4", "-5", "-6")]
LAWS = {"w0": (2.0, 30.0), "w1": (4.0, 60.0), "w2": (0.5, 15.0)}


def made_run(plans: list[dict[str, int]], noise: float = 0.0, gap: float = 20.0, seed: int = 0) -> RealRun:
    """A run whose epochs' mean times lie on LAWS (times `noise` of an epoch's mean) and whose rounds
    are `gap` past the slowest."""
    rnd = random.Random(seed)
    epochs = []
    for plan in plans:
        times = {k: (LAWS[k][0] * b + LAWS[k][1]) * math.exp(noise * rnd.gauss(0.0, 1.0)) for k, b in plan.items()}
        epochs.append(Epoch(plan, times, max(times.values()) + gap))
    return RealRun("made", "dynamic", sum(plans[0].values()), 8, epochs)


PLANS = [{"w0": 100, "w1": 100, "w2": 100}, {"w0": 60, "w1": 30, "w2": 210}, {"w0": 55, "w1": 28, "w2": 217},
         *[{"w0": 55, "w1": 28, "w2": 217}] * 5]


def test_the_laws_and_the_overhead_are_recovered_from_exact_traces() -> None:
    run = made_run(PLANS)
    laws = fit_laws([run])
    assert all(math.isclose(laws[k][0], LAWS[k][0], rel_tol=1e-6) and math.isclose(laws[k][1], LAWS[k][1], abs_tol=1e-4)
               for k in LAWS), laws
    assert step_noise([run]) == 0.02  # no spread at all: the floor
    # the overhead as the simulator counts it: the gap less what its noise adds to the slowest step
    assert overhead_ms([run], 0.0) == pytest.approx(20.0)
    assert overhead_ms([run], 0.05) < 20.0


def test_noise_within_a_run_is_measured_and_a_runs_own_load_is_not() -> None:
    noisy = made_run(PLANS, noise=0.03, seed=1)
    assert 0.03 < step_noise([noisy]) < 0.03 * math.sqrt(8) * 1.5
    # one run slower than the other throughout (another tenant) adds no noise
    slow = RealRun("slow", "dynamic", 300, 8, [Epoch(e.batches, {k: 1.2 * t for k, t in e.compute_ms.items()}, e.round_ms)
                                               for e in made_run(PLANS).epochs])
    assert step_noise([made_run(PLANS), slow]) == 0.02


def test_the_committed_hl8_runs_meet_the_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*map(str, HL8_DYNAMIC), "--json", "--out", str(tmp_path)]
    assert simulation_check.main(argv) == 0
    report = json.loads((tmp_path / "simulation_check.json").read_text())
    assert len(report["rows"]) == len(HL8_DYNAMIC)
    assert all(t["pass"] for t in report["targets"]), report["targets"]
    assert "| hetero-2026-11-27-2.json:dynamic |" in capsys.readouterr().out


def _write(path: Path, report: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"report": report}))
    return path


def test_reports_that_are_not_one_setups_throughput_runs_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = _write(tmp_path / "schedule.json", {"kind": "schedule", "mode": "bsp"})
    other = _write(tmp_path / "schedule-2.json", {"kind": "schedule", "mode": "bsp"})
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    cases = [([str(schedule), str(other)], "not a benchmarks.hetero BSP throughput report"),
             ([str(garbage)], "cannot read it as JSON"),
             ([str(HL8_DYNAMIC[0])], "two real runs"),
             ([str(HL8_DYNAMIC[0]), str(HL8_DYNAMIC[1]), str(HL8_DYNAMIC[0])], "is given twice")]
    for argv, needle in cases:
        with pytest.raises(SystemExit) as exit_info:
            simulation_check.main(argv)
        assert exit_info.value.code == 2 and needle in capsys.readouterr().err, argv
    with pytest.raises(ValueError, match="synthetic dataset"):
        read_runs({"kind": "throughput", "mode": "bsp", "workload": {"global_batch": 8, "dataset_args": []}, "runs": {}}, "x")


def scale_report(seed: int) -> dict[str, Any]:
    """A benchmarks.scale BSP report whose trace lies on LAWS (3% noise), a decision every 5 rounds."""
    run = made_run(PLANS, noise=0.03, seed=seed)
    trace = [{"step": 5 * (i + 1), "batch_sizes": e.batches, "compute_ms": e.compute_ms, "round_ms": e.round_ms}
             for i, e in enumerate(run.epochs)]
    return {"workers": 3, "mode": "bsp", "global_batch": 300, "adjust_every": 5, "trace": trace}


def test_a_scale_runs_decisions_are_replayed_like_a_hetero_runs_epochs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = scale_run(scale_report(0), "scale.json")
    assert (run.policy, run.global_batch, run.rounds_per_epoch, len(run.epochs)) == ("dynamic", 300, 5, len(PLANS))
    paths = [_write(tmp_path / f"scale-{seed}.json", scale_report(seed)) for seed in range(2)]
    assert simulation_check.main([*map(str, paths), "--json", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "simulation_check.json").read_text())
    assert [r["run"] for r in report["rows"]] == ["scale-0.json:dynamic", "scale-1.json:dynamic"]
    assert all(r["simulated"]["round_ms"] > 0 and set(r["laws"]) == set(LAWS) for r in report["rows"]), report["rows"]
    with pytest.raises(ValueError, match="two decisions"):
        read_runs({**scale_report(0), "trace": []}, "short.json")
