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


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile", "hl3"], "unknown profile 'hl3'"),
        (["--every-epochs", "2"], "need --schedule"),
        (["--server-arg=--workers 3"], "set by the emulator"),
        (["--server-arg", "--deadband 0.2 --epochs 3"], "use ps-cluster run --epochs"),
        (["--cpu-budget", "0"], "expected a number > 0"),
        (["--epochs", "1000001"], "argument --epochs: expected a whole number in [1, 1000000]"),
        (["--server-arg=--epoch=3"], "--server-arg --epoch (that is --epochs): use ps-cluster run --epochs"),
        (["--server-arg=--work 2"], "--server-arg --work (that is --workers) is set by the emulator"),
        (["--server-arg=--bogus"], "ps-server would refuse these arguments: unrecognized arguments: --bogus"),
        (["--mode", "asp", "--server-arg=--adaptive-batch=gns"], "ps-server would refuse these arguments: --adaptive-batch gns"),
        (["--server-arg=--shard-addresses=10.0.0.7"],
         "ps-server would refuse these arguments: --shard-addresses: expected HOST:PORT with a port in 1-65535, got '10.0.0.7'"),
        (["--server-arg=--shards=2 --tls-cert=/nonexistent/server.crt --tls-key=/nonexistent/server.key --shard-tls-ca=/nonexistent/ca.crt"],
         "ps-server would refuse these arguments: --tls-cert /nonexistent/server.crt: cannot read (No such file or directory)"),
        (["--adjust-every", "foo"], "argument --adjust-every: expected 'epoch' or a whole number of steps > 0, got 'foo'"),
        (["--model", "resnet9000", "--quick"], "unknown model 'resnet9000'"),
        (["--policy", "uniform", "--server-arg=--no-park"],
         "ps-server would refuse these arguments: --no-park is for --policy model or auto"),
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


def test_a_worker_the_server_evicts_and_an_early_end_are_lines(tmp_path: Path) -> None:
    """A worker whose quota is too small for a round's deadline is evicted and the job goes on without it:
    ps-cluster run says so (and why a job ended early), where its epoch lines only showed `w3 b=   -`."""
    import io

    from deploy.emulator import Emulation, RunConfig, resolve

    out = io.StringIO()
    emulation = Emulation(resolve(RunConfig(out=tmp_path / "x", quick=True)), out)
    reason = "evicted at round 3's deadline (5.0 s) without its push"
    emulation._on_event({"event": "evict", "worker": "w3", "reason": reason, "step": 3, "epoch": 0,
                         "workers_left": 3, "done": False})
    emulation._on_event({"event": "end", "reason": "the workers left cannot split --global-batch", "step": 9, "epoch": 1})
    emulation._on_event({"event": "end", "reason": "finished", "step": 9, "epoch": 1})
    emulation._on_event({"event": "leave", "worker": "w0", "reason": "left", "step": 9, "epoch": 1, "workers_left": 2,
                         "done": True})  # a finished job's workers going: no line
    assert out.getvalue().splitlines() == [
        f"  w3: {reason}", "  job ended at epoch 1, step 9: the workers left cannot split --global-batch"]


def test_a_job_that_ends_early_exits_3_with_its_report(tmp_path: Path, emulators: Callable[..., Emulator]) -> None:
    """One of two workers leaves (SIGTERM: it leaves and exits 0) and the other's --max-batch cannot hold
    B: ps-server ends the job early and exits 3; ps-cluster run writes the report and exits 3 as well,
    with one stderr line (before: both exited 0, as after a finished job). The other worker hears the
    end and exits 3 too, while the server waits out its --grace: no worker failure for the run."""
    profile = write_profile(tmp_path / "two.yaml", [1, 1])
    emulator = emulators(tmp_path / "early", "--profile", str(profile), "--limiter", "slowdown", *TINY_JOB,
                         "--epochs", "200", "--policy", "uniform", "--server-arg=--max-batch=32")
    emulator.wait_for(lambda: bool(emulator.events("epoch")), "the first epoch")
    os.kill(worker_pid(emulator.pid, "w0"), signal.SIGTERM)
    assert emulator.wait(timeout=60) == 3, emulator.stderr
    (end,) = emulator.events("end")
    assert "cannot split --global-batch" in end["reason"]
    assert f"job ended at epoch {end['epoch']}, step {end['step']}: {end['reason']}" in emulator.stdout
    errors = [line for line in emulator.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "the job ended early" in errors[0], errors
    assert json.loads((tmp_path / "early" / "summary.json").read_text())["summary"]["reason"] == end["reason"]
    assert children(emulator.pid) == []
