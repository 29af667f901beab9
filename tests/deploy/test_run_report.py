"""The end of a ``ps-cluster run`` (deploy/run_report.py, deploy/plots.py): the summary's word on a
schedule's phases that never ran, and the plots' phase spans, time axis and ASP panels. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_phase_spans_place_epoch_and_clock_phases_on_the_epoch_axis() -> None:
    """Pure: the shaded spans of the per-epoch plots, for phases in epochs and in seconds."""
    from deploy.plots import phase_spans

    events = [
        {"event": "adjust", "time": 100.0},
        *({"event": "epoch", "epoch": e, "time": 100.0 + 10 * e} for e in range(1, 7)),
    ]
    by_epoch = [{"phase": 0, "profile": "hl1", "epoch": 0}, {"phase": 1, "profile": "hl8", "epoch": 3}]
    assert phase_spans(events, by_epoch) == [(0.5, 3.5, "HL1"), (3.5, 6.5, "HL8")]
    by_clock = [{"phase": 0, "profile": "a", "elapsed_s": 0, "time": 100.0}, {"phase": 1, "profile": "b", "elapsed_s": 25, "time": 125.0}]
    assert phase_spans(events, by_clock) == [(0.5, 3.0, "A"), (3.0, 6.5, "B")]


@pytest.mark.parametrize("balance", ["compute", "busy", "cycle"])
def test_the_time_plot_names_the_time_the_controller_balanced(balance: str) -> None:
    """Pure: under --balance busy (cycle) the times are busy times (cycles); the axis and title say so."""
    from deploy.plots import plot_compute_times

    events = [*({"event": "epoch", "epoch": e, "time": 10.0 * e, "compute_ms": {"w0": 100.0 + e}} for e in range(1, 3)),
              {"event": "summary", "balance": balance}]
    ax = plot_compute_times(events).axes[0]
    assert ax.get_ylabel() == f"{balance} time per step (ms)"
    assert ax.get_title() == f"{balance.capitalize()} time per worker"


def test_an_asp_run_gets_a_plot_of_each_workers_updates_staleness_and_ssp_waits(tmp_path: Path) -> None:
    """Pure: write_plots adds asp.png when the epochs record staleness, its panels one line per worker."""
    from deploy.plots import write_plots

    fields = {"updates": {"w0": 9, "w1": 3}, "staleness_mean": {"w0": 1.5, "w1": 4.0}, "staleness_max": {"w0": 3, "w1": 7},
              "ssp_wait_s": {"w0": 0.4, "w1": 0.0}, "batch_sizes": {"w0": 40, "w1": 24}, "compute_ms": {"w0": 10.0, "w1": 30.0}}
    events = [{"event": "epoch", "epoch": e, "time": 10.0 * e, **fields} for e in range(1, 4)]
    paths = write_plots(events, tmp_path)
    assert [p.name for p in paths] == ["batch_sizes.png", "compute_times.png", "accuracy.png", "asp.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert write_plots([{**e, "staleness_max": None} for e in events], tmp_path)[-1].name == "accuracy.png"


def test_a_worker_that_joined_a_running_job_is_plotted(tmp_path: Path) -> None:
    """A newcomer's `probe` record carries its own compute_ms as a number: ps-cluster run's summary
    ended in "'float' object is not iterable" (exit 2, no plots) where a worker under a small quota
    joined after the job had started."""
    from deploy.plots import worker_names, write_plots

    events = [{"event": "epoch", "epoch": 1, "time": 10.0, "batch_sizes": {"w0": 64}, "compute_ms": {"w0": 10.0}},
              {"event": "probe", "worker": "w1", "batch": 1, "step": 3, "epoch": 1, "compute_ms": 668.2},
              {"event": "epoch", "epoch": 2, "time": 20.0, "batch_sizes": {"w0": 63, "w1": 1},
               "compute_ms": {"w0": 10.0, "w1": 670.0}}]
    assert worker_names(events) == ["w0", "w1"]
    assert [p.name for p in write_plots(events, tmp_path)] == ["batch_sizes.png", "compute_times.png", "accuracy.png"]


def test_a_run_that_ends_before_a_schedules_phase_says_so(tmp_path: Path) -> None:
    """A job shorter than its schedule: the summary names the phases that never ran and the flag that
    reaches them; one that went through every phase says nothing of it."""
    from deploy.emulator import RunConfig, resolve
    from deploy.run_report import phases_not_reached, print_summary

    plan = resolve(RunConfig(schedule="swap", every_seconds=30.0, quick=True, cpu_budget=1.5, out=tmp_path / "a"))
    reached = [{"event": "phase", "phase": 0, "profile": "hl8"}, {"event": "phase", "phase": 1, "profile": "hl8-swap"}]
    assert phases_not_reached(plan, reached) == ["3 hl1", "4 hl8"]
    result = {"summary": {}, "workers": [], "accuracy": None, "samples_per_s": 1.0, "train_wall_s": 1.0,
              "total_wall_s": 2.0, "adjustments": 0, "limiting": "cgroup-v1", "phases": reached,
              "phases_not_reached": phases_not_reached(plan, reached)}
    lines: list[str] = []
    print_summary(plan, result, lines.append)
    assert lines[-1] == ("the job ended before the schedule's phase(s) 3 hl1, 4 hl8: they never ran "
                         "(a shorter --every-seconds or more --epochs reaches them)")
    every = [{"event": "phase", "phase": i} for i in range(4)]
    assert phases_not_reached(plan, every) == []
    profile = resolve(RunConfig(quick=True, cpu_budget=1.5, out=tmp_path / "b"))
    assert phases_not_reached(profile, []) == []


def test_phases_a_clock_schedule_passed_over_are_called_skipped_not_unreached(tmp_path: Path) -> None:
    """--every-seconds shorter than the clock's checks jumps from the first phase to the last: the
    summary said the job "ended before" the middle phases and that a shorter --every-seconds reaches
    them, which is the wrong way round."""
    from deploy.emulator import RunConfig, resolve
    from deploy.run_report import phases_not_reached, phases_skipped, print_summary

    plan = resolve(RunConfig(schedule="swap", every_seconds=0.001, quick=True, cpu_budget=1.5, out=tmp_path / "a"))
    reached = [{"event": "phase", "phase": 0, "profile": "hl8"}, {"event": "phase", "phase": 3, "profile": "hl8"}]
    assert phases_not_reached(plan, reached) == []
    assert phases_skipped(plan, reached) == ["2 hl8-swap", "3 hl1"]
    result = {"summary": {}, "workers": [], "accuracy": None, "samples_per_s": 1.0, "train_wall_s": 1.0,
              "total_wall_s": 2.0, "adjustments": 0, "limiting": "cgroup-v1", "phases": reached,
              "phases_not_reached": [], "phases_skipped": phases_skipped(plan, reached)}
    lines: list[str] = []
    print_summary(plan, result, lines.append)
    assert lines[-1] == ("the schedule's phase(s) 2 hl8-swap, 3 hl1 were skipped: each was over before the clock's "
                         "next check, every 0.1 s or more (a longer --every-seconds runs them)")
    assert not any("ended before" in line for line in lines)


def test_the_last_phase_entered_is_the_highest_recorded_whatever_their_order() -> None:
    """The one answer phases_not_reached and phases_skipped both start from."""
    from deploy.run_report import last_entered

    assert last_entered([]) == -1
    assert last_entered([{"phase": 0}, {"phase": "3"}, {"phase": 1}]) == 3


def test_the_accuracy_plot_of_a_log_a_resume_appended_to_runs_on_in_time() -> None:
    """Pure: the resumed run's `wall_s` starts again at 0; sorted as they were, epochs 3 and 4 landed
    among epochs 1 and 2 and the line went back and forth (3, 1, 4, 2)."""
    from deploy.plots import plot_accuracy

    first = [{"event": "epoch", "epoch": 1, "wall_s": 0.22}, {"event": "eval", "epoch": 1, "wall_s": 0.22, "accuracy": 0.75},
             {"event": "epoch", "epoch": 2, "wall_s": 0.56}, {"event": "eval", "epoch": 2, "wall_s": 0.56, "accuracy": 0.84},
             {"event": "summary", "wall_s": 0.56}]
    second = [{"event": "resume", "epoch": 2, "step": 45},
              {"event": "epoch", "epoch": 3, "wall_s": 0.19}, {"event": "eval", "epoch": 3, "wall_s": 0.19, "accuracy": 0.92},
              {"event": "epoch", "epoch": 4, "wall_s": 0.37}, {"event": "eval", "epoch": 4, "wall_s": 0.37, "accuracy": 0.94}]
    ax = plot_accuracy([*first, *second]).axes[0]
    assert list(ax.lines[0].get_xdata()) == pytest.approx([0.22, 0.56, 0.75, 0.93])
    assert [t.get_text() for t in ax.texts] == ["1", "2", "3", "4"]
