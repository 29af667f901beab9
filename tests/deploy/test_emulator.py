"""``ps-cluster run``: real emulator processes on loopback, with cgroup quotas where they are writable.

Each test starts ``python -m deploy.cli run`` as a process, as a user would, and checks what it
promises: the quotas the kernel holds while it runs, the phase switches of a schedule, the files it
writes, the slowdown fallback, and that no cgroup or process outlives the run on any exit path.
Tests that read quotas skip (with the reason) where no cgroup CPU controller is writable.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.cgroups import CgroupBackend, detect_backend
from deploy.profiles import load_profile, quota_period_us, scale
from ps.ops.metrics import read_metrics
from tests.processes import ENV
from tests.emulator_jobs import TINY_JOB, write_profile

BACKEND: CgroupBackend | None = detect_backend()
needs_cgroups = pytest.mark.skipif(
    BACKEND is None,
    reason="no writable cgroup CPU controller (needs root on Linux with cgroup v2 cpu.max or v1 cpu.cfs_quota_us)",
)

class Emulator:
    """A running ``ps-cluster run`` process; its stdout and stderr go to files in its out folder."""

    def __init__(self, out: Path, *args: str) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self._stdout = open(out.parent / f"{out.name}.stdout", "w")  # noqa: SIM115
        self._stderr = open(out.parent / f"{out.name}.stderr", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "run", "--out", str(out), *args],
            stdout=self._stdout, stderr=self._stderr, env=ENV,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._stdout.close()
            self._stderr.close()

    @property
    def stdout(self) -> str:
        return (self.out.parent / f"{self.out.name}.stdout").read_text()

    @property
    def stderr(self) -> str:
        return (self.out.parent / f"{self.out.name}.stderr").read_text()

    def events(self, kind: str) -> list[dict]:
        path = self.out / "metrics.jsonl"
        return [e for e in (read_metrics(path) if path.exists() else []) if e["event"] == kind]

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"the emulator exited before {what}:\n{self.stdout}\n{self.stderr}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.stdout}"
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def emulators() -> Iterator[Callable[..., Emulator]]:
    started: list[Emulator] = []

    def start(out: Path, *args: str) -> Emulator:
        emulator = Emulator(out, *args)
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.kill()


def run_dirs(pid: int) -> list[Path]:
    """The emulator's cgroup run directories (``hetero-ps/emulator.<pid>.<start>``)."""
    if BACKEND is None or not BACKEND.parent.is_dir():
        return []
    return sorted(BACKEND.parent.glob(f"emulator.{pid}.*"))


def quotas(pid: int) -> dict[str, tuple[int | None, int]]:
    """``{worker: (quota_us, period_us)}`` read from the kernel's files (cpu.cfs_* or cpu.max)."""
    assert BACKEND is not None
    found = {}
    for run_dir in run_dirs(pid):
        try:
            groups = sorted(p for p in run_dir.iterdir() if p.is_dir())
        except FileNotFoundError:  # the run ended and removed its groups meanwhile
            continue
        for group in groups:
            try:
                found[group.name] = BACKEND.read_limit(group)
            except ValueError:
                continue
            except OSError as exc:
                # a group removed while it is read: ENOENT, or ENODEV from a control file of a group
                # the kernel is tearing down
                if exc.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
    return found


def children(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the live child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append((int(entry.name), cmdline))
    return found


def worker_pid(pid: int, name: str) -> int:
    for child, cmdline in children(pid):
        if "worker.cli" in cmdline and f"--name {name} " in cmdline:
            return child
    raise AssertionError(f"no worker {name} among the children of {pid}: {children(pid)}")


def expected_limits(shares: list[float], period: int) -> dict[str, tuple[int, int]]:
    return {f"w{k}": (round(s * period), period) for k, s in enumerate(shares)}


@pytest.mark.slow  # a whole job on the emulator
def test_main_job_quick_runs_end_to_end_with_quotas(tmp_path: Path, emulators: Callable[..., Emulator]) -> None:
    """The main job (--quick): quotas held while it runs (where cgroups work), summary and plots, no group left."""
    shares = scale(load_profile("hl8"), "bsp", 1.5)
    period = quota_period_us(shares)
    emulator = emulators(tmp_path / "quick", "--profile", "hl8", "--quick", "--cpu-budget", "1.5")
    seen: dict[str, tuple[int | None, int]] = {}
    if BACKEND is not None:
        emulator.wait_for(lambda: bool(emulator.events("epoch")), "the first epoch")
        seen = quotas(emulator.pid)
    assert emulator.wait() == 0, emulator.stderr
    out = emulator.stdout
    assert run_dirs(emulator.pid) == []
    if BACKEND is not None:
        assert seen == expected_limits(shares, period)
        assert f"cgroup-v{BACKEND.version} CPU quotas" in out and "period 8 ms" in out
    # BSP on the PS path balances busy time by default (--balance auto); the summary says so
    for line in ("epoch  1/4 |", "test accuracy after epoch 4", "final batch", "busy ms, last epoch", "controller adjustments"):
        assert line in out, out
    summary = json.loads((tmp_path / "quick" / "summary.json").read_text())
    assert summary["summary"]["balance"] == "busy"
    assert [w["worker"] for w in summary["workers"]] == ["w0", "w1", "w2", "w3"]
    assert summary["epochs"] == 4 and summary["accuracy"] > 0.3
    batches = [w["final_batch"] for w in summary["workers"]]
    assert batches[3] > 2 * max(batches[:3]), f"the 1-core worker should get the largest batch: {batches}"
    for name in ("batch_sizes.png", "compute_times.png", "accuracy.png"):
        path = tmp_path / "quick" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(path) in out


@pytest.mark.slow  # a whole job on the emulator
@needs_cgroups
def test_dynamic_schedule_switches_quotas_at_epoch_boundaries(tmp_path: Path, emulators: Callable[..., Emulator]) -> None:
    """Three phases, one epoch each: phases.jsonl and the kernel's quotas follow the epochs."""
    profiles = [write_profile(tmp_path / f"p{k}.yaml", w) for k, w in enumerate([[1, 1], [1, 3], [3, 1]])]
    schedule = tmp_path / "three.yaml"
    schedule.write_text(json.dumps({"kind": "schedule", "every_epochs": 1, "phases": [str(p) for p in profiles]}))
    emulator = emulators(
        tmp_path / "sched", "--schedule", str(schedule), "--cpu-budget", "1", *TINY_JOB, "--global-batch", "16",
        "--dataset-arg", "size=1024",
    )
    phase_shares = [[0.25, 0.25], [0.25, 0.75], [0.75, 0.25]]  # one scale: the largest phase (4 cores) is the budget
    period = quota_period_us([s for shares in phase_shares for s in shares])
    expected = [expected_limits(shares, period) for shares in phase_shares]
    observed: list[dict] = []
    while emulator.proc.poll() is None:
        now = quotas(emulator.pid)
        if now and len(now) == 2 and (not observed or observed[-1] != now):
            observed.append(now)
        time.sleep(0.005)
    assert emulator.wait() == 0, emulator.stderr
    assert run_dirs(emulator.pid) == []
    assert [o for o in observed if o in expected] == expected, observed
    phases = [json.loads(line) for line in (tmp_path / "sched" / "phases.jsonl").read_text().splitlines()]
    assert [(p["phase"], p["epoch"], p["profile"]) for p in phases] == [(0, 0, "p0"), (1, 1, "p1"), (2, 2, "p2")]
    assert [p["shares"] for p in phases] == phase_shares
    ends = {e["epoch"]: e["time"] for e in emulator.events("epoch")}
    for phase in phases[1:]:
        assert ends[phase["epoch"]] <= phase["time"] < ends[phase["epoch"] + 1], (phase, ends)
    assert "phase 3/3 p2 (HL 3) after epoch 2" in emulator.stdout


def test_killed_worker_stops_the_run_and_leaves_nothing(tmp_path: Path, emulators: Callable[..., Emulator]) -> None:
    """SIGKILL to a worker mid-run: exit 1 with a line naming it; no process or cgroup is left."""
    profile = write_profile(tmp_path / "two.yaml", [1, 2])
    emulator = emulators(tmp_path / "killed", "--profile", str(profile), "--cpu-budget", "1", *TINY_JOB, "--epochs", "200")
    emulator.wait_for(lambda: bool(emulator.events("epoch")), "the first epoch")
    if BACKEND is not None:
        assert len(quotas(emulator.pid)) == 2
    os.kill(worker_pid(emulator.pid, "w0"), signal.SIGKILL)
    assert emulator.wait(timeout=30) == 1
    errors = [line for line in emulator.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "run failed" in errors[0] and "w0 (killed by SIGKILL)" in errors[0], errors
    assert run_dirs(emulator.pid) == []
    assert children(emulator.pid) == []


@pytest.mark.parametrize(("signum", "code", "message"), [
    (signal.SIGTERM, 128 + signal.SIGTERM, "terminated by SIGTERM"),
    (signal.SIGINT, 130, "interrupted"),
])
def test_signal_to_the_emulator_removes_everything(
    tmp_path: Path, emulators: Callable[..., Emulator], signum: int, code: int, message: str
) -> None:
    """SIGTERM or Ctrl-C to the emulator while its cluster starts: every process and cgroup is gone after."""
    profile = write_profile(tmp_path / "two.yaml", [1, 2])
    emulator = emulators(tmp_path / "sig", "--profile", str(profile), "--cpu-budget", "1", *TINY_JOB, "--epochs", "200")
    emulator.wait_for(lambda: len(children(emulator.pid)) == 3, "the server and both workers")
    if BACKEND is not None:
        emulator.wait_for(lambda: len(quotas(emulator.pid)) == 2, "both workers' groups")
    pids = [child for child, _ in children(emulator.pid)]
    emulator.proc.send_signal(signum)
    assert emulator.wait(timeout=30) == code
    assert message in emulator.stderr and "cgroups removed" in emulator.stderr
    assert run_dirs(emulator.pid) == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} outlived the emulator"


@pytest.mark.slow  # a whole job on the emulator
def test_slowdown_fallback_when_forced(tmp_path: Path, emulators: Callable[..., Emulator]) -> None:
    """--limiter slowdown: no cgroup, workers slowed by max_share/share, the run completes."""
    profile = write_profile(tmp_path / "two.yaml", [1, 3])
    emulator = emulators(
        tmp_path / "slow", "--profile", str(profile), "--limiter", "slowdown", *TINY_JOB, "--epochs", "2"
    )
    emulator.wait_for(lambda: bool(emulator.events("adjust")), "the job start")
    assert run_dirs(emulator.pid) == []
    w0 = next(cmd for _, cmd in children(emulator.pid) if "--name w0 " in cmd)
    w1 = next(cmd for _, cmd in children(emulator.pid) if "--name w1 " in cmd)
    assert "--slowdown 3.0" in w0 and "--slowdown" not in w1
    assert emulator.wait() == 0, emulator.stderr
    assert "emulating with --slowdown (forced by the slowdown limiter)" in emulator.stdout
    assert "w0=x3" in emulator.stdout
    assert (tmp_path / "slow" / "summary.json").exists()


def test_schedule_under_slowdown_is_refused(tmp_path: Path) -> None:
    """The slowdown fallback cannot change speeds live: a schedule is refused before anything starts,
    and the output folder of an earlier run is left as it was."""
    earlier = tmp_path / "x"
    earlier.mkdir()
    (earlier / "phases.jsonl").write_text('{"phase": 0}\n')
    result = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "run", "--schedule", "dynamic", "--limiter", "slowdown", "--out", str(earlier)],
        capture_output=True, text=True, env=ENV, timeout=60, check=False,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "cannot change a worker's speed while it runs" in errors[0], result.stderr
    assert [p.name for p in earlier.iterdir()] == ["phases.jsonl"]
    assert (earlier / "phases.jsonl").read_text() == '{"phase": 0}\n'


def test_the_default_policy_is_auto_on_a_profile_and_on_a_schedule(tmp_path: Path) -> None:
    """Without --policy: the auto policy (ps-server's default), for fixed speeds and where a schedule
    changes them; a named one is kept either way, and is what the server is started with."""
    from deploy.emulator import RunConfig, resolve

    def policy(**config: object) -> str:
        plan = resolve(RunConfig(out=tmp_path / f"run{len(list(tmp_path.iterdir()))}", quick=True, **config))  # type: ignore[arg-type]
        args = plan.server_args
        assert args[args.index("--controller") + 1] == plan.config.policy
        return str(plan.config.policy)

    assert policy() == "auto"
    assert policy(schedule="dynamic") == "auto"
    assert policy(schedule="dynamic", policy="model") == "model"
    assert policy(policy="uniform") == "uniform"


def test_a_schedule_keeps_a_halved_worker_halved(tmp_path: Path) -> None:
    """ps-cluster run scales every phase of a schedule alike: the tenant's w3 gets half its HL8 quota;
    swap in epochs (--every-epochs 2) trains 2 epochs a phase."""
    from deploy.emulator import RunConfig, resolve

    plan = resolve(RunConfig(schedule="tenant", cpu_budget=1.5, mode="asp", out=tmp_path / "a"))
    assert [phase[3] for phase in plan.shares] == pytest.approx([1.05, 0.525, 1.05])
    assert plan.server_shares == pytest.approx([0.3] * 3)
    swap = resolve(RunConfig(schedule="swap", every_epochs=2, quick=True, cpu_budget=1.5, out=tmp_path / "b"))
    assert swap.epochs == 8 and swap.shares[1] == pytest.approx([0.1875, 0.1875, 1.0, 0.125])


def test_bad_output_folder_and_mixed_server_shares_are_refused_when_planned(tmp_path: Path) -> None:
    from deploy.emulator import RunConfig, resolve

    afile = tmp_path / "afile"
    afile.write_text("keep")
    with pytest.raises(ValueError, match="--out .*afile exists and is not a folder"):
        resolve(RunConfig(out=afile, quick=True))
    assert afile.read_text() == "keep"
    (tmp_path / "plain-asp.yaml").write_text("bsp:\n  workers: [6, 6, 4, 32]\nasp:\n  workers: [4, 4, 4, 28]\n")  # no server share
    (tmp_path / "mixed.yaml").write_text("kind: schedule\nevery_epochs: 1\nphases: [plain-asp.yaml, hl8]\n")
    with pytest.raises(ValueError, match="in asp every phase must give the server a share of cores, or none must: plain-asp give none"):
        resolve(RunConfig(schedule=str(tmp_path / "mixed.yaml"), mode="asp", out=tmp_path / "y"))
    assert not (tmp_path / "y").exists()
    assert resolve(RunConfig(schedule=str(tmp_path / "mixed.yaml"), mode="bsp", out=tmp_path / "y")).server_shares == [None, None]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile", "hl3"], "unknown profile 'hl3'"),
        (["--every-epochs", "2"], "need --schedule"),
        (["--server-arg=--workers 3"], "set by the emulator"),
        (["--server-arg", "--deadband 0.2 --epochs 3"], "use ps-cluster run --epochs"),
        (["--cpu-budget", "0"], "expected a number > 0"),
        (["--server-arg=--epoch=3"], "--server-arg --epoch (that is --epochs): use ps-cluster run --epochs"),
        (["--server-arg=--work 2"], "--server-arg --work (that is --workers) is set by the emulator"),
        (["--server-arg=--bogus"], "ps-server would refuse these arguments: unrecognized arguments: --bogus"),
        (["--adjust-every", "foo"], "argument --adjust-every: expected 'epoch' or a whole number of steps > 0, got 'foo'"),
        (["--model", "resnet9000", "--quick"], "unknown model 'resnet9000'"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "run", "--out", str(tmp_path / "x"), *args],
            stdout=subprocess.DEVNULL, stderr=stderr, env=ENV,
        )
        code = proc.wait(timeout=60)
    text = (tmp_path / "stderr").read_text()
    assert code == 2, text
    errors = [line for line in text.splitlines() if line.strip()]
    assert len(errors) == 1 and needle in errors[0], text
    assert run_dirs(proc.pid) == []


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


def test_a_signal_another_thread_takes_is_still_held_until_the_block_ends() -> None:
    """A process-directed SIGTERM goes to a thread that does not block it (here: a waiting helper
    thread, as the cluster-settle thread is), and CPython then runs the handler in the main thread at
    its next bytecode. The deferral still holds it until the block ends, then it raises."""
    import threading

    from deploy import signals

    sigint_before = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    reached = []
    try:
        with signals.signals_as_exceptions(), pytest.raises(signals.Terminated):
            with signals.signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:  # bytecodes at which an undeferred handler would run
                    time.sleep(0.001)
                reached.append(True)
        assert reached == [True]
        assert signal.getsignal(signal.SIGINT) is sigint_before  # the deferral's handlers are gone again
    finally:
        stop.set()
        helper.join()


def test_a_ctrl_c_that_a_finalizer_swallows_still_stops_the_run() -> None:
    """Ctrl-C landing while a finalizer runs: Python prints "Exception ignored" and goes on, and the
    emulator ran its job to the end and exited 0. The signal is recorded, and the loop's check()
    raises it again."""
    import gc

    from deploy import signals

    class Finalized:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the finalizer

    sigint_before = signal.getsignal(signal.SIGINT)
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with signals.signals_as_exceptions() as received:
            Finalized()
            gc.collect()
            assert len(unraisable) == 1  # the KeyboardInterrupt was swallowed...
            with pytest.raises(KeyboardInterrupt):
                received.check()  # ...and comes back at the check
    finally:
        sys.unraisablehook = hook
    assert signal.getsignal(signal.SIGINT) is sigint_before


def test_arming_the_parent_death_signal_starts_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """ctypes.util.find_library ran ldconfig for every spawn: a short-lived extra child of the emulator."""
    from deploy import signals

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr("subprocess.Popen", no_process)
    arm = signals.parent_death_signal()
    assert callable(arm)


def test_a_signal_right_after_a_fork_still_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arriving just after the launcher forked a process (here: the instant Popen returns) is
    held until the process is recorded, so close() stops it. It used to raise before the record: under
    load, a signal to ps-cluster while its cluster started left a worker running after it."""
    import subprocess as real_subprocess
    import threading

    from deploy import launcher, signals

    started: list[real_subprocess.Popen[bytes]] = []
    real_popen = real_subprocess.Popen

    def popen_then_sigterm(*args: object, **kwargs: object) -> real_subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        if "preexec_fn" in kwargs:  # the launcher's spawn (not ctypes' ldconfig lookup)
            started.append(proc)
            # to this (the main) thread: a process-directed signal may go to another thread of the test
            # process, whose handler can run late (test_a_signal_another_thread_takes_... covers that)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return proc

    monkeypatch.setattr(real_subprocess, "Popen", popen_then_sigterm)  # the module cluster_processes spawns with
    cluster = launcher.LocalCluster([], [launcher.WorkerSpec("w0", 1.0)], tmp_path, limiter="slowdown")
    try:
        with signals.signals_as_exceptions(), pytest.raises(signals.Terminated):
            cluster.procs.spawn("w0", [sys.executable, "-c", "import time; time.sleep(60)"], None,
                                lambda proc: cluster.processes.__setitem__("w0", proc))
        assert [*cluster.processes.values()] == started  # recorded before the signal was let through
        assert started[0].poll() is None  # the child did not inherit the held signals' block...
        started[0].terminate()  # ...so SIGTERM ends it at once, as close() relies on
        assert started[0].wait(timeout=10) == -signal.SIGTERM
    finally:
        cluster.close()
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


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
