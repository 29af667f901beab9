"""benchmarks.simulation.plots: a simulate report's curves against N, drawn from its rows or from a
saved result file, and a file that is no such report refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.simulation import plots

PNG = b"\x89PNG\r\n\x1a\n"


def rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for n, steady, again in ((16, 3, 2), (256, 18, 9), (1024, 13, None), (10_000, None, None)):
        for policy, scale in (("auto", 1.0), ("uniform", 3.0)):
            out.append({"policy": policy, "workers": n, "decisions_to_steady": steady, "steady_again": again,
                        "round_over_optimum": 1.03 * scale, "compute_over_optimum": 1.05 * scale,
                        "decision_ms_median": 0.03 * n / scale, "decision_ms_max": 0.07 * n / scale})
    return out


def test_the_rows_are_drawn_with_not_steady_as_gaps_and_marks(tmp_path: Path) -> None:
    fig = plots.plot_rows(rows(), tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == PNG
    steady, optimum, cpu = fig.axes
    legend = steady.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["auto", "uniform"]
    assert steady.get_xscale() == optimum.get_yscale() == cpu.get_yscale() == "log"
    # auto's "never steady" marks: after the change at 1,024 and 10,000, and both at 10,000
    marks = [line for line in steady.get_lines() if line.get_marker() == "x" and line.get_color() == "C0"]
    assert np.asarray(marks[0].get_xdata()).tolist() == [1024, 10_000]
    with pytest.raises(ValueError):
        plots.plot_rows([])


def test_a_saved_result_is_drawn_from_the_command_line(tmp_path: Path) -> None:
    result = tmp_path / "simulate-2026-01-01.json"
    result.write_text(json.dumps({"benchmark": "simulate", "report": {"rows": rows(), "targets": [], "runs": []}}))
    assert plots.main([str(result), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / plots.FILE).read_bytes()[:8] == PNG
    assert plots.rows_of({"rows": rows()}) == rows()  # a bare report, as --out's simulate.json


@pytest.mark.parametrize("text", ["not json", json.dumps({"report": {"rows": [{"workers": 4}]}}), json.dumps([1])])
def test_a_file_that_is_no_simulate_report_is_refused(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        plots.main([str(bad), "--out", str(tmp_path / "plots")])
    assert exit_.value.code == 2 and not (tmp_path / "plots").exists()


def test_rows_without_a_round_over_the_optimum_are_drawn(tmp_path: Path) -> None:
    """--rounds 1 --change yes: the change comes at round 0, so no row has a phase before it, and no
    value for the log axis of the round over the optimum (matplotlib refuses a log axis of none)."""
    empty = [{**row, "round_over_optimum": None, "compute_over_optimum": None} for row in rows()]
    fig = plots.plot_rows(empty, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == PNG and fig.axes[1].get_xscale() == "linear"
