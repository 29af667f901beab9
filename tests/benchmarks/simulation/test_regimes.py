"""benchmarks/simulation/regimes.py and `python -m benchmarks.regimes`: clusters drawn the same from
a seed, every policy meeting the same workers and the same change, and the report's judgement."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import regimes as cli
from benchmarks.simulation.engine import Event, Scenario, simulate
from benchmarks.simulation.population import SpeedLaw
from benchmarks.simulation.regimes import REGIMES, draw, judge


def test_the_same_seed_draws_the_same_clusters_and_the_regimes_in_turn() -> None:
    first, again, other = draw(8, 3, 60), draw(8, 3, 60), draw(8, 4, 60)
    assert first == again and first != other
    assert [c.regime for c in first] == [*REGIMES, *REGIMES]
    for c in first:
        assert (c.events == ()) == (c.change is None) == (not c.regime.startswith("changing"))
        assert all(s == 0.0 for _, s in c.laws) == ("fixed cost" not in c.regime)
        assert c.global_batch % c.workers == 0


def test_a_change_hits_the_same_workers_whatever_the_policy_did() -> None:
    """The drawn change names its workers: two policies that park differently (and so draw noise for
    different workers) still see the same speeds after it."""
    (cluster,) = [c for c in draw(40, 0, 60) if c.change == "shift"][:1]
    speeds = []
    for policy in ("uniform", "auto"):
        trace = simulate(cluster.scenario(policy, 60, 5, seed=1))
        speeds.append(trace.speeds_at[max(trace.speeds_at)])
    assert all(np.array_equal(a, b) for a, b in zip(*speeds, strict=True))


def test_a_named_speed_change_scales_those_workers_and_a_wrong_name_is_refused() -> None:
    law = SpeedLaw(noise=0.0, given=((1.0, 2.0), (1.0, 2.0)))
    trace = simulate(Scenario(policy="uniform", workers=2, global_batch=8, rounds=4, law=law,
                              events=(Event(2, "speed", scaled=(("w1", 3.0),)),)))
    q, s, _ = trace.speeds_at[2]
    assert q.tolist() == [1.0, 3.0] and s.tolist() == [2.0, 6.0]
    assert trace.round_ms[1:3] == [pytest.approx(6.0 + 1.04), pytest.approx(18.0 + 1.04)]
    with pytest.raises(ValueError, match="names w2, not among the run's workers"):
        Scenario(policy="uniform", workers=2, global_batch=8, events=(Event(2, "speed", scaled=(("w2", 3.0),)),))
    joining = Event(2, "join", count=1)  # w2, drawn at round 2's end: a speed change names it from round 3 on
    with pytest.raises(ValueError, match=r"names w2, not among the run's workers by then \(w0 to w1\)"):
        Scenario(policy="uniform", workers=2, global_batch=8, events=(joining, Event(2, "speed", scaled=(("w2", 3.0),))))
    later = simulate(Scenario(policy="uniform", workers=2, global_batch=8, rounds=5, law=law,
                              events=(joining, Event(3, "speed", scaled=(("w2", 3.0),)))))
    assert later.speeds_at[3][0].tolist() == [1.0, 1.0, 3.0]
    with pytest.raises(ValueError, match=r"factor must be in \[1e-06, 1e\+06\]"):
        Event(2, "speed", scaled=(("w1", 0.0),))
    with pytest.raises(ValueError, match="only a speed event"):
        Event(2, "leave", count=1, scaled=(("w1", 2.0),))


def test_judge_puts_the_default_over_the_better_of_the_others() -> None:
    (cluster,) = draw(1, 0, 30)
    record = judge(cluster, {"auto": 90.0, "dynamic": 100.0, "model": 120.0}, 80.0, "auto")
    assert record["default_over_better"] == 0.9 and record["over_optimum"]["model"] == 1.5


def test_the_cli_reports_every_regime_and_its_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--clusters", "4", "--rounds", "30", "--json", "--out", str(tmp_path),
            "--save-result", str(tmp_path / "results"), "--machine", "test"]
    assert cli.main(argv) == 0
    report = json.loads((tmp_path / "regimes.json").read_text())
    assert [r["regime"] for r in report["rows"]] == [*REGIMES, "all"]
    assert report["policies"] == ["auto", "dynamic", "model"] and len(report["clusters"]) == 4
    assert {t["name"].split(",")[0] for t in report["targets"]} == {
        "simulated auto over the better of the others"}
    (result,) = (tmp_path / "results").glob("regimes-*.json")
    assert json.loads(result.read_text())["targets"] == report["targets"]
    assert "| all | 4 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--against", "auto"], ["--against", "nonesuch"], ["--clusters", "0"],
                                  ["--rounds", "5"]])
def test_bad_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err
