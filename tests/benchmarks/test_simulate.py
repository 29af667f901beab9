"""benchmarks.simulate, the CLI: a small grid's JSON report, table and result file; a policy's own
settings given as ps-server's flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import simulate
from benchmarks.simulation.engine import Scenario, simulate as run_scenario
from ps.control.registry import POLICIES


def test_a_small_grid_writes_its_report_and_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workers", "4,8", "--policies", "dynamic,model", "--rounds", "30", "--join", "20:2",
            "--json", "--out", str(tmp_path / "out"), "--save-result", str(tmp_path / "results"), "--machine", "test"]
    assert simulate.main(argv) == 0
    report = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert (tmp_path / "out" / "simulate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the curves against N
    assert [(r["policy"], r["workers"]) for r in report["rows"]] == [("dynamic", 4), ("model", 4), ("dynamic", 8), ("model", 8)]
    assert len(report["runs"]) == 8 and all(r["scenario"]["events"] for r in report["runs"])
    (result,) = (tmp_path / "results").glob("simulate-*.json")
    record = json.loads(result.read_text())
    assert record["benchmark"] == "simulate" and record["machine"] == "test" and record["targets"] == report["targets"]
    assert "| model | 8 |" in capsys.readouterr().out


def test_unknown_policies_and_sizes_are_refused() -> None:
    with pytest.raises(SystemExit):
        simulate.main(["--policies", "nonesuch"])
    with pytest.raises(SystemExit):
        simulate.main(["--workers", "0"])


def test_a_policys_own_setting_is_a_flag_that_reaches_the_simulated_policy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICIES, "toy", "tests.toy_policy:ToyPolicy")  # tests/toy_policy.py, `share` its setting
    argv = ["--workers", "4", "--policies", "toy", "--rounds", "10", "--change", "no", "--toy-share", "5",
            "--json", "--out", str(tmp_path)]
    assert simulate.main(argv) == 0
    (run,) = json.loads((tmp_path / "simulate.json").read_text())["runs"]
    assert run["scenario"]["options"] == {"share": 5.0}
    trace = run_scenario(Scenario(policy="toy", workers=4, global_batch=64, rounds=1,
                                  policy_options={"toy": {"share": 5.0}}))
    assert trace.plans[0][2].tolist() == [40, 8, 8, 8]  # the first worker's 5 shares of B, one each for the others
    with pytest.raises(SystemExit):
        simulate.main(["--workers", "4", "--policies", "dynamic", "--toy-share", "5"])  # not a simulated policy
    with pytest.raises(SystemExit):
        simulate.main(["--workers", "4", "--policies", "toy", "--toy-share", "17"])  # out of its bounds


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line usage error `argv` ends in (exit 2, no traceback, nothing simulated)."""
    with pytest.raises(SystemExit) as stop:
        simulate.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("python -m benchmarks.simulate: error: ")]
    return line


@pytest.mark.parametrize(("flags", "says"), [
    (["--join=3:-2"], "a join event's count of workers must be >= 1, got -2"),
    (["--leave=3:-1"], "a leave event's count of workers must be >= 1, got -1"),
    (["--fail", "x"], "expected ROUND:COUNT, got 'x'"),
    (["--classes", "a:1"], "a device class is name:q_ms:s_ms[:weight], got 'a:1'"),
    (["--classes", "a:0:1"], "device class 'a' needs finite q_ms > 0"),
])
def test_a_bad_event_or_device_class_says_why(flags: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert says in refused(["--workers", "2", "--rounds", "4", *flags], capsys)
