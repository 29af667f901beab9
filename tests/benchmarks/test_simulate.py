"""benchmarks.simulate, the CLI: a small grid's JSON report, table and result file; a policy's own
settings given as ps-server's flags."""

from __future__ import annotations

import gc
import re
import json
from pathlib import Path

import pytest

from benchmarks import simulate
from benchmarks.simulation.engine import Scenario, simulate as run_scenario
from ps.control.registry import POLICIES
from tests.cli_checks import PYTHON_INTERNALS

FIELDS = [name for name in Scenario.__dataclass_fields__ if "_" in name]  # global_batch, min_batch, ...


def test_a_small_grid_writes_its_report_and_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workers", "4,8", "--policies", "dynamic,model", "--rounds", "30", "--join", "20:2",
            "--json", "--out", str(tmp_path / "out"), "--save-result", str(tmp_path / "results"), "--machine", "test"]
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert simulate.main(argv) == 0
    # the collector is tuned where it runs as a program, not in a caller's process
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)
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


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The one-line usage error `argv` ends in (exit 2, no traceback), before anything is simulated."""
    monkeypatch.setattr(simulate, "grid", lambda *_, **__: pytest.fail("a refused grid was simulated"))
    with pytest.raises(SystemExit) as stop:
        simulate.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and not any(internal in err for internal in PYTHON_INTERNALS), err
    (line,) = [x for x in err.splitlines() if x.startswith("python -m benchmarks.simulate: error: ")]
    assert not re.search(rf"\b({'|'.join(FIELDS)})\b", line), line  # the flags, not the scenario's fields
    return line


@pytest.mark.parametrize(("flags", "says"), [
    (["--join=3:-2"], "a join event's count of workers must be >= 1, got -2"),
    (["--leave=3:-1"], "a leave event's count of workers must be >= 1, got -1"),
    (["--fail", "x"], "expected ROUND:COUNT, got 'x'"),
    (["--classes", "a:1"], "a device class is name:q_ms:s_ms[:weight], got 'a:1'"),
    (["--classes", "a:0:1"], "device class 'a' needs q_ms in [1e-12, 1e+12], s_ms in [0, 1e+12]"),
    (["--classes", "a:1e-300:0,b:1e300:0"], "device class 'a' needs q_ms in [1e-12, 1e+12]"),
    (["--q-ms", "1e306"], "argument --q-ms: expected a number in [1e-12, 1e+12]"),
    (["--s-ms", "1e308"], "argument --s-ms: expected a number in [0, 1e+12]"),
    (["--change-factor", "1e200"], "argument --change-factor: expected a number in [1e-06, 1e+06]"),
    (["--server-fixed-ms", "1.7e308"], "argument --server-fixed-ms: expected a number in [0, 1e+12]"),
    (["--evict-ms", "1.7e308"], "argument --evict-ms: expected a number in (0, 1e+12]"),
    (["--batch-per-worker", str(2**62)], "B 18446744073709551616 (--batch-per-worker 4611686018427387904 x 4 workers) "
                                         "is above 2**53; use --batch-per-worker 2251799813685248 at most"),
    (["--sigma", "-1"], "argument --sigma: expected a number in [0, 3]"),
    (["--noise", "1000"], "argument --noise: expected a number in [0, 3]"),
    (["--s-ms", "nan"], "argument --s-ms: expected a finite number"),
    (["--change-fraction", "2"], "argument --change-fraction: expected a number in [0, 1]"),
    (["--deadband", "nan"], "argument --deadband: expected a finite number"),
    (["--server-per-worker-ms", "-5"], "argument --server-per-worker-ms: expected a number in [0, 1e+12]"),
    (["--seed", "-1"], "argument --seed: expected a whole number >= 0"),
    (["--min-batch", "100"], "4 workers (from round 0 on) need 400 samples at the least (100 each), more than B = 256"),
    (["--max-batch", "10"], "4 workers (from round 0 on) take 40 samples at most (10 each), less than B = 256"),
    (["--min-batch", "100", "--max-batch", "10"], "--max-batch 10 is below --min-batch 100"),
    (["--micro-batch", "7"], "B 256 (--batch-per-worker 64 x 4 workers) is not a multiple of --micro-batch 7"),
    (["--micro-batch", "64", "--max-batch", "32"], "--max-batch 32 is below --micro-batch 64"),
    (["--batch-per-worker", "1", "--min-batch", "2"], "need 8 samples at the least (2 each), more than B = 4; lower --min-batch"),
    (["--join", "4:1"], "--join 4:1: round 4 is past the run's last (rounds 0 to 3 with --rounds 4)"),
    (["--leave", "2:1", "--leave", "9:1"], "--leave 9:1: round 9 is past the run's last (rounds 0 to 3 with --rounds 4)"),
    (["--fail", "4:2"], "--fail 4:2: round 4 is past the run's last (rounds 0 to 3 with --rounds 4)"),
    (["--batch-per-worker", "1", "--join", "3:5"], "9 workers (from round 4 on) need 9 samples at the least"),
    (["--leave", "2:4"], "the events leave no worker from round 2 on"),
    (["--fail", "2:1", "--fail", "2:3"], "the events leave no worker from round 3 on"),
])
def test_a_bad_value_is_a_one_line_usage_error_before_any_run(
        flags: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert says in refused(["--workers", "4", "--rounds", "4", *flags], capsys, monkeypatch)


@pytest.mark.parametrize(("flags", "says"), [
    (["--workers", "4", "--micro-batch", "7"],
     "B 256 (--batch-per-worker 64 x 4 workers) is not a multiple of --micro-batch 7; use --batch-per-worker 63 or 70, "
     "or --micro-batch 4 or 8"),
    (["--workers", "4,6", "--batch-per-worker", "10", "--micro-batch", "8"],
     "B 60 (--batch-per-worker 10 x 6 workers) is not a multiple of --micro-batch 8; use --batch-per-worker 8 or 12, "
     "or --micro-batch 5 or 10"),
    (["--workers", "4", "--micro-batch", "300"],
     "B 256 (--batch-per-worker 64 x 4 workers) is not a multiple of --micro-batch 300; use --batch-per-worker 300, "
     "or --micro-batch 64"),
    (["--workers", "4", "--batch-per-worker", "1", "--min-batch", "2"],
     "4 workers (from round 0 on) need 8 samples at the least (2 each), more than B = 4; lower --min-batch or "
     "--micro-batch, or raise --batch-per-worker"),
    (["--workers", "4", "--max-batch", "10"],
     "4 workers (from round 0 on) take 40 samples at most (10 each), less than B = 256; raise --max-batch or lower "
     "--batch-per-worker"),
])
def test_a_refusal_says_what_to_change_in_the_simulators_own_flags(
        flags: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """B is --batch-per-worker x N here (no global batch flag): a refused --micro-batch, --min-batch or
    --max-batch names the values of --batch-per-worker and --micro-batch that make every run whole."""
    line = refused(["--rounds", "4", *flags], capsys, monkeypatch)
    assert line == f"python -m benchmarks.simulate: error: {says}"


def test_an_out_that_is_a_file_is_refused_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "afile").touch()
    line = refused(["--workers", "2", "--rounds", "4", "--out", str(tmp_path / "afile")], capsys, monkeypatch)
    assert line.endswith("afile exists and is not a folder")
