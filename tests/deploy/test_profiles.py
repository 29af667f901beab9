"""Heterogeneity profiles and schedules: Table I and Fig. 10 as data, scaling, the CFS period rule."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deploy import profiles
from deploy.profiles import (
    Allocation,
    Profile,
    builtin_profiles,
    builtin_schedules,
    default_cpu_budget,
    load_profile,
    load_schedule,
    quota_period_us,
    scale,
    scale_phases,
    scale_server,
)
from worker.probes.resources import MAX_STEP_OVERHEAD_MS

TABLE_I = {
    "hl1": ((12, 12, 12, 12), (10, 10, 10, 10)),
    "hl2": ((12, 12, 8, 16), (8, 8, 8, 16)),
    "hl4": ((9, 9, 6, 24), (10, 10, 4, 16)),
    "hl8": ((6, 6, 4, 32), (4, 4, 4, 28)),
}


def write(tmp_path: Path, text: str, name: str = "custom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_builtins_are_table_i_and_fig_10() -> None:
    assert builtin_profiles() == ["hl1", "hl2", "hl4", "hl8"]
    assert builtin_schedules() == ["dynamic", "swap", "tenant"]


@pytest.mark.parametrize("name", sorted(TABLE_I))
def test_every_builtin_profile_matches_table_i(name: str) -> None:
    profile = load_profile(name)
    bsp, asp = TABLE_I[name]
    assert profile.name == name
    assert profile.allocation("bsp").workers == bsp
    assert profile.allocation("asp").workers == asp
    assert profile.allocation("asp").server == 8
    assert profile.allocation("bsp").server is None
    assert sum(bsp) == 48
    assert sum(asp) + 8 == 48


@pytest.mark.parametrize(
    ("name", "bsp_hl", "asp_hl"),
    # ASP HL8 is 28/4 = 7 as published in Table I.
    [("hl1", 1, 1), ("hl2", 2, 2), ("hl4", 4, 4), ("hl8", 8, 7)],
)
def test_heterogeneity_levels(name: str, bsp_hl: float, asp_hl: float) -> None:
    profile = load_profile(name)
    assert profile.allocation("bsp").heterogeneity == bsp_hl
    assert profile.allocation("asp").heterogeneity == asp_hl


def test_names_are_case_insensitive_and_paths_work(tmp_path: Path) -> None:
    assert load_profile("HL8") == load_profile("hl8")
    copy = tmp_path / "mine.yaml"
    shutil.copy(profiles.PROFILE_DIR / "hl4.yaml", copy)
    assert load_profile(copy).modes == load_profile("hl4").modes
    assert load_profile(str(copy)).source == copy


def test_copied_profile_can_have_any_workers_and_one_mode(tmp_path: Path) -> None:
    path = write(tmp_path, "name: six\nbsp:\n  workers: [1, 2, 3, 0.5, 4, 1.25]\n")
    profile = load_profile(path)
    assert profile.name == "six"
    assert profile.allocation("bsp").workers == (1, 2, 3, 0.5, 4, 1.25)
    with pytest.raises(ValueError, match="defines no asp allocation"):
        profile.allocation("asp")
    with pytest.raises(ValueError) as error:
        profile.allocation("asp")
    assert str(error.value) == (f"profile 'six' ({path}) defines no asp allocation (it has: bsp; "
                                "pass --mode bsp or add the asp section)")


def test_gpus_per_worker(tmp_path: Path) -> None:
    path = write(tmp_path, "bsp:\n  workers: [8, 8]\n  gpus: [0, 2]\n")
    assert load_profile(path).allocation("bsp").gpus == (0, 2)
    assert load_profile("hl8").allocation("bsp").gpus is None


def test_hl8_on_this_kind_of_machine_matches_the_design_numbers() -> None:
    shares = scale(load_profile("hl8"), "bsp", 1.5)
    assert shares == pytest.approx([0.1875, 0.1875, 0.125, 1.0])
    assert quota_period_us(shares) == 8000


@pytest.mark.parametrize("name", sorted(TABLE_I))
@pytest.mark.parametrize("mode", ["bsp", "asp"])
def test_scale_every_builtin(name: str, mode: str) -> None:
    profile = load_profile(name)
    shares = scale(profile, mode, 1.5)
    workers = profile.allocation(mode).workers
    assert math.fsum(shares) == pytest.approx(1.5)
    assert [s / shares[0] for s in shares] == pytest.approx([w / workers[0] for w in workers])


@given(
    workers=st.lists(st.floats(0.01, 1000), min_size=1, max_size=16),
    budget=st.floats(0.01, 1000),
)
def test_scale_sums_to_budget_and_keeps_ratios(workers: list[float], budget: float) -> None:
    profile = Profile("p", "", {"asp": Allocation(tuple(workers))})
    shares = scale(profile, "asp", budget)
    assert math.fsum(shares) == pytest.approx(budget, rel=1e-9)
    for share, worker in zip(shares, workers, strict=True):
        assert share / budget == pytest.approx(worker / math.fsum(workers), rel=1e-9)


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf")])
def test_scale_rejects_bad_budgets(budget: float) -> None:
    with pytest.raises(ValueError, match="cpu_budget"):
        scale(load_profile("hl1"), "bsp", budget)


@pytest.mark.parametrize("mode", ["ssp", "", "bsp2"])
def test_mode_must_be_bsp_or_asp(mode: str) -> None:
    with pytest.raises(ValueError, match="bsp, asp"):
        scale(load_profile("hl1"), mode, 1.0)


def test_mode_is_case_insensitive() -> None:
    assert scale(load_profile("hl1"), "ASP", 2.0) == [0.5] * 4


@pytest.mark.parametrize(
    ("shares", "period"),
    [([1 / 8], 8000), ([0.2, 0.8], 5000), ([1.0], 1000), ([3.0, 7.5], 1000), ([0.05], 20000), ([0.3], 3334)],
)
def test_period_examples(shares: list[float], period: int) -> None:
    assert quota_period_us(shares) == period


@given(st.lists(st.floats(0.001, 64), min_size=1, max_size=8))
def test_period_is_the_shortest_the_kernel_accepts(shares: list[float]) -> None:
    period = quota_period_us(shares)
    assert 1000 <= period <= 1_000_000
    assert all(s * period >= 1000 - 1e-6 for s in shares)
    assert all(round(s * period) >= 1000 for s in shares)
    if period > 1000:
        assert min(shares) * (period - 1) < 1000


@pytest.mark.parametrize("shares", [[], [0.0], [-1.0], [0.0005], [float("nan")], [1.5e-308, 1.0], [5e-324]])
def test_period_rejects_bad_shares(shares: list[float]) -> None:
    with pytest.raises(ValueError):
        quota_period_us(shares)


@pytest.mark.parametrize(("cpus", "budget"), [(1, 0.5), (2, 1.5), (16, 15.5)])
def test_default_cpu_budget(monkeypatch: pytest.MonkeyPatch, cpus: int, budget: float) -> None:
    monkeypatch.setattr(profiles.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert default_cpu_budget() == budget


def test_default_cpu_budget_here() -> None:
    assert default_cpu_budget() >= 0.5


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown profile 'hl3'; known profiles: hl1, hl2, hl4, hl8"):
        load_profile("hl3")
    with pytest.raises(ValueError, match="known schedules: dynamic"):
        load_schedule("fig10")
    with pytest.raises(ValueError, match="'dynamic' is a schedule"):
        load_profile("dynamic")
    with pytest.raises(ValueError, match="'hl8' is a profile"):
        load_schedule("hl8")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bsp: [workers: 1\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("", "expected a mapping"),
        ("name: x\n", "define at least one of bsp, asp"),
        ("bsp: [1, 2]\n", "bsp must be a mapping"),
        ("bsp:\n  workers: []\n", "non-empty list"),
        ("bsp:\n  workers: 4\n", "non-empty list"),
        ("bsp:\n  workers: [1, 0]\n", r"bsp.workers\[1\] must be a number of CPU cores > 0, got 0"),
        ("bsp:\n  workers: [1, -2]\n", r"workers\[1\].*> 0"),
        ("bsp:\n  workers: [1, two]\n", r"workers\[1\].*'two'"),
        ("bsp:\n  workers: [true]\n", r"workers\[0\]"),
        ("asp:\n  workers: [1]\n  server: 0\n", "asp.server"),
        ("bsp:\n  worker: [1]\n", "unknown key.*worker.*allowed: gpus, server, step_overhead_ms, workers"),
        ("ssp:\n  workers: [1]\n", "unknown key.*ssp"),
        ("kind: schedule\nbsp:\n  workers: [1]\n", "kind is 'schedule', expected 'profile'"),
        ("bsp:\n  workers: [1, 2]\n  1: 2\n  null: 3\n", "unknown key.*1, None; allowed: gpus, server, step_overhead_ms, workers"),
        ("bsp:\n  workers: [1, 2]\n  gpus: [1]\n", r"bsp.gpus must be a list of GPU counts, one per worker \(2\)"),
        ("bsp:\n  workers: [1, 2]\n  gpus: [1, -1]\n", r"bsp.gpus\[1\] must be a whole number of GPUs >= 0, got -1"),
        ("bsp:\n  workers: [1, 2]\n  gpus: [1, 0.5]\n", r"bsp.gpus\[1\] must be a whole number"),
        ("bsp:\n  workers: [1, 2]\n  gpus: [true, 1]\n", r"bsp.gpus\[0\] must be a whole number"),
        ("bsp:\n  workers: [1, 1" + "0" * 400 + "]\n", r"workers\[1\] must be a number of CPU cores > 0, got 10+\.\.\.$"),
        ("asp:\n  workers: [1]\n  server: 1" + "0" * 400 + "\n", "asp.server must be a number of CPU cores"),
        ("bsp:\n  workers: [1, 2]\n  step_overhead_ms: [5]\n", r"bsp.step_overhead_ms must be one number or a list of one per worker \(2\)"),
        ("bsp:\n  workers: [1, 2]\n  step_overhead_ms: [5, -1]\n", r"bsp.step_overhead_ms\[1\] must be a number of ms in \[0, 60000\], got -1"),
        ("bsp:\n  workers: [1, 2]\n  step_overhead_ms: lots\n", r"bsp.step_overhead_ms\[0\] must be a number of ms in \[0, 60000\], got 'lots'"),
        ("bsp:\n  workers: [1, 2]\n  step_overhead_ms: 1.0e+308\n", r"bsp.step_overhead_ms\[0\] must be a number of ms in \[0, 60000\], got 1e\+308"),
        ("bsp:\n  workers: [1, 2]\n  step_overhead_ms: [1, 60000.5]\n", r"bsp.step_overhead_ms\[1\] must be .* got 60000.5"),
        ("bsp:\n  workers: [1.0e+308, 1.0e+308]\n", "bsp.workers add up to more cores than a float holds"),
        ("bsp:\n  workers: [1e-2, 1]\n", r"workers\[0\].*got '1e-2' \(text: YAML reads an exponent as a number only with a dot and a sign"),
        ("asp:\n  workers: [1]\n  server: 2E3\n", r"asp.server .*got '2E3' \(text: YAML reads"),
    ],
)
def test_bad_profile_files_give_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_profile(tmp_path / "nope.yaml")
    with pytest.raises(ValueError) as error:  # it said a folder "does not exist"
        load_schedule(tmp_path / "sub/")
    assert str(error.value) == f"schedule file {tmp_path / 'sub'} does not exist"
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError) as error:
        load_schedule(f"{tmp_path / 'sub'}/")
    assert str(error.value) == f"schedule file {tmp_path / 'sub'} is a folder, not a YAML file"
    with pytest.raises(ValueError, match="profile file /dev/null is not a file"):
        load_profile("/dev/null")  # it exists: "does not exist" would send a person looking for it


def test_dynamic_schedule_has_the_fig_10_phases() -> None:
    schedule = load_schedule("dynamic")
    assert [p.name for p in schedule.phases] == ["hl1", "hl2", "hl4", "hl8", "hl8", "hl4", "hl2", "hl1"]
    assert (schedule.every_epochs, schedule.every_seconds, schedule.unit) == (5, None, "epochs")
    assert schedule.phases[3] == load_profile("hl8")
    assert [schedule.phase_at(e).name for e in (0, 4, 5, 14, 15, 24, 25, 39, 40, 1000)] == [
        "hl1", "hl1", "hl2", "hl4", "hl8", "hl8", "hl4", "hl1", "hl1", "hl1",
    ]


def test_swap_and_tenant_change_hl8_on_the_wall_clock() -> None:
    """swap: HL8, its fastest worker (w3) and a slow one (w2) swapped, all even, HL8; tenant: HL8 with w3's
    cores halved between two HL8 phases. Both count seconds."""
    swap, tenant = load_schedule("swap"), load_schedule("tenant")
    assert [p.name for p in swap.phases] == ["hl8", "hl8-swap", "hl1", "hl8"]
    assert [p.name for p in tenant.phases] == ["hl8", "hl8-tenant", "hl8"]
    assert (swap.unit, swap.every_seconds, tenant.unit, tenant.every_seconds) == ("seconds", 20.0, "seconds", 20.0)
    for mode in ("bsp", "asp"):
        hl8 = list(load_profile("hl8").allocation(mode).workers)
        swapped, halved = list(swap.phases[1].allocation(mode).workers), list(tenant.phases[1].allocation(mode).workers)
        assert swapped == [*hl8[:2], hl8[3], hl8[2]] and max(hl8) == hl8[3] and hl8[2] == min(hl8)
        assert halved == [*hl8[:3], hl8[3] / 2]
        assert swap.phases[1].allocation(mode).server == tenant.phases[1].allocation(mode).server == (8 if mode == "asp" else None)


def test_a_schedules_phases_share_one_scale() -> None:
    """The phase with the most cores sums to the budget and the others keep their ratio to it: the tenant's
    worker runs at half its HL8 share, nobody else moves. One phase alone: scale()'s shares exactly."""
    tenant = load_schedule("tenant")
    shares = scale_phases(tenant.phases, "bsp", 1.5)
    assert shares[0] == shares[2] == scale(load_profile("hl8"), "bsp", 1.5)
    assert shares[1] == pytest.approx([0.1875, 0.1875, 0.125, 0.5])
    assert scale_phases(load_schedule("dynamic").phases, "asp", 1.5)[3] == scale(load_profile("hl8"), "asp", 1.5)
    assert scale_server(tenant.phases, "asp", 1.5) == pytest.approx([0.3] * 3)
    assert scale_server(tenant.phases, "bsp", 1.5) == [None] * 3
    with pytest.raises(ValueError, match="at least one phase"):
        scale_phases([], "bsp", 1.5)


def test_schedule_interval_override() -> None:
    schedule = load_schedule("dynamic").every(seconds=30)
    assert (schedule.every_epochs, schedule.every_seconds, schedule.unit) == (None, 30.0, "seconds")
    assert schedule.phase_index(59.9) == 1
    assert [schedule.every(seconds=0.1).phase_index(t) for t in (0.3, 0.6, 0.7, 0.29999)] == [3, 6, 7, 2]
    with pytest.raises(ValueError, match="exactly one"):
        schedule.every(seconds=30, epochs=2)
    with pytest.raises(ValueError, match="progress"):
        schedule.phase_index(-1)
    assert load_schedule("dynamic").every(epochs=125_000).every_epochs == 125_000  # 8 phases: 10**6 epochs
    with pytest.raises(ValueError, match="schedule dynamic: 8 phases of 125001 epochs are more than the 1000000"):
        load_schedule("dynamic").every(epochs=125_001)



def test_user_schedule_with_relative_profile_paths(tmp_path: Path) -> None:
    write(tmp_path, "bsp:\n  workers: [1, 3]\n", "slow.yaml")
    write(tmp_path, "bsp:\n  workers: [3, 1]\n", "fast.yaml")
    path = write(tmp_path, "kind: schedule\nevery_seconds: 2.5\nphases: [slow.yaml, fast.yaml, slow.yaml]\n", "s.yaml")
    schedule = load_schedule(path)
    assert [p.allocation("bsp").workers for p in schedule.phases] == [(1, 3), (3, 1), (1, 3)]
    assert schedule.interval == 2.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("phases: [hl1]\n", "exactly one of every_epochs or every_seconds"),
        ("every_epochs: 1\nevery_seconds: 1\nphases: [hl1]\n", "exactly one"),
        ("every_epochs: 0\nphases: [hl1]\n", "every_epochs must be a whole number > 0"),
        ("every_epochs: 1.5\nphases: [hl1]\n", "every_epochs must be a whole number"),
        ("every_seconds: -3\nphases: [hl1]\n", "every_seconds must be a number > 0"),
        ("every_seconds: 1" + "0" * 400 + "\nphases: [hl1]\n", "every_seconds must be a number > 0, got 10+\\.\\.\\.$"),
        ("every_epochs: 1\nphases: []\n", "phases must be a non-empty list"),
        ("every_epochs: 1\nphases: hl1\n", "phases must be a non-empty list"),
        ("every_epochs: 1\nphases: [hl1, hl3]\n", "phase 'hl3': unknown profile 'hl3'; known profiles"),
        ("every_epochs: 1\nphases: [hl1, six.yaml]\n", "same number of bsp workers"),
        ("every_epochs: 1\nphase: [hl1]\n", "unknown key.*phase"),
        ("every_epochs: 100000000000000000000\nphases: [hl8, hl4]\n",
         "schedule bad: 2 phases of 100000000000000000000 epochs are more than the 1000000 epochs a job may train"),
        ("every_epochs: 500001\nphases: [hl8, hl4]\n", "2 phases of 500001 epochs are more than the 1000000"),
    ],
)
def test_bad_schedule_files_give_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    write(tmp_path, "bsp:\n  workers: [1, 1, 1, 1, 1, 1]\n", "six.yaml")
    with pytest.raises(ValueError, match=message):
        load_schedule(write(tmp_path, text, "bad.yaml"))


def test_a_fixed_step_cost_becomes_the_workers_flag(tmp_path: Path) -> None:
    """step_overhead_ms: one number for every worker or one per worker; a worker at 0 gets no flag."""
    every = load_profile(write(tmp_path, "bsp:\n  workers: [1, 2]\n  step_overhead_ms: 20\n")).allocation("bsp")
    assert [every.worker_args(i) for i in range(2)] == [("--step-overhead-ms", "20.0")] * 2
    each = load_profile(write(tmp_path, "bsp:\n  workers: [1, 2]\n  step_overhead_ms: [0, 7.5]\n")).allocation("bsp")
    assert [each.worker_args(i) for i in range(2)] == [(), ("--step-overhead-ms", "7.5")]
    assert load_profile("hl8").allocation("bsp").worker_args(0) == ()
    most = load_profile(write(tmp_path, f"bsp:\n  workers: [1]\n  step_overhead_ms: {MAX_STEP_OVERHEAD_MS}\n"))
    assert most.allocation("bsp").worker_args(0) == ("--step-overhead-ms", repr(MAX_STEP_OVERHEAD_MS))


def test_a_many_line_name_or_description_is_read_as_one_line(tmp_path: Path) -> None:
    """A YAML block (`description: |`) heads the files written from the profile as one comment line: its
    second line was a line of its own in compose-env's env file (`W0_CPUS=99` set, ` (BSP), HL = 4` not
    KEY=value), and so in the schedule's and the Slurm script's header."""
    from deploy.compose_env import parse_env, render_env

    path = write(tmp_path, "name: |\n  mine\n  two\ndescription: |\n  four workers\n  W0_CPUS=99\n"
                           "bsp:\n  workers: [1, 2, 3, 4]\n")
    profile = load_profile(path)
    assert (profile.name, profile.description) == ("mine two", "four workers W0_CPUS=99")
    assert parse_env(render_env(profile, "bsp"))["W0_CPUS"] == "1"
    assert load_profile(write(tmp_path, "name: ' '\nbsp:\n  workers: [1]\n")).name == "custom"
    schedule = tmp_path / "s.yaml"
    schedule.write_text("kind: schedule\nname: |\n  a\n  b\ndescription: |\n  c\n  d\nevery_epochs: 1\nphases: [hl1]\n")
    assert (load_schedule(schedule).name, load_schedule(schedule).description) == ("a b", "c d")
    schedule.write_text("kind: schedule\nname: ' '\nevery_epochs: 1\nphases: [hl1]\n")
    assert (load_schedule(schedule).name, load_schedule(schedule).description) == ("s", "")


def test_a_profile_given_as_a_schedule_says_to_pass_it_as_a_profile(tmp_path: Path) -> None:
    path = tmp_path / "hl2.yaml"
    path.write_text("name: hl2\nbsp:\n  workers: [1, 2]\n")
    with pytest.raises(ValueError, match=r"kind is 'profile', expected 'schedule' \(pass a profile with --profile\)$"):
        load_schedule(path)  # it read "unknown key(s) bsp", as if the file were a schedule with a typo
    assert load_profile(path).name == "hl2"
