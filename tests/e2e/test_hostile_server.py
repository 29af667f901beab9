"""A hostile parameter server against a real ps-worker process: the worker refuses, in one line, every
reply it should not act on, leaves, runs no code that the server names, and waits on no call past
its bound (a Join never answered, a reply whose values stop after the header).

The fake server (tests/hostile_server.py) is written against protos/ alone, not against our server:
it answers Status, Join, Pull, Push, Heartbeat and Leave as a scenario says. The baseline scenario is
a job the worker completes, so each refusal below is the worker's check at work.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common.job.endings import ENDED_EARLY
from tests.hostile_server import GOOD_SPEC, NUMEL, Scenario, serving
from tests.repo import ROOT
from tests.processes import ENV
from worker.flags import UNTRUSTED_SERVER

WORKER_TIMEOUT_S = 90
MARKER_MODULE = '''
from pathlib import Path
Path({marker!r}).write_text("imported")

def make(*args, **kwargs):
    Path({marker!r}).write_text("called")
    raise RuntimeError("a factory the server named")
'''


@dataclass
class Run:
    code: int
    stderr: str
    calls: list[str]
    times: dict[str, float]  # each call's first arrival at the fake server (time.monotonic)
    ended: float  # when the worker exited (time.monotonic)


def run_worker(scenario: Scenario, tmp_path: Path, *flags: str, timeout: str = "30", retry_for: str = "0",
               quiet: bool = True) -> Run:
    """A real ps-worker against a fake server serving `scenario`, to its exit (`timeout`, `retry_for`:
    its --timeout and --retry-for; `quiet`: with --quiet)."""
    with serving(scenario) as (fake, target):
        env = {**ENV, "PYTHONPATH": f"{tmp_path}:{ENV.get('PYTHONPATH', '')}".rstrip(":")}
        proc = subprocess.run(
            [sys.executable, "-m", "worker.cli", "--server", target, "--name", "w", *(["--quiet"] if quiet else []),
             "--timeout", timeout, "--retry-for", retry_for, *flags],
            capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT_S, cwd=ROOT,
        )
        ended = time.monotonic()
    return Run(proc.returncode, proc.stderr, list(fake.calls), dict(fake.times), ended)


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """A module `hostile_factory` on the worker's path that writes `marker` if anything of it runs."""
    path = tmp_path / "marker"
    (tmp_path / "hostile_factory.py").write_text(MARKER_MODULE.format(marker=str(path)))
    return path


def refused(run: Run, needle: str) -> str:
    """The worker's one error line, checked to hold `needle`; no traceback."""
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("ps-worker: error:")]
    assert len(errors) == 1 and needle in errors[0], run.stderr
    return errors[0]


def test_a_good_fake_server_runs_a_job_to_its_end(tmp_path: Path) -> None:
    run = run_worker(Scenario(), tmp_path, "--max-batch", "16")
    assert run.code == 0, run.stderr
    assert {"Join", "Pull", "Push"} <= set(run.calls)


def test_a_join_batch_above_the_specs_global_batch_is_taken_within_the_one_in_force(tmp_path: Path) -> None:
    """--adaptive-batch moves B from the spec's (a resumed job starts at the checkpoint's): the Join
    reply says the B in force, and the first batch is bounded by it."""
    run = run_worker(Scenario(join={"batch_size": 24, "global_batch": 48}), tmp_path, "--max-batch", "32")
    assert run.code == 0, run.stderr
    assert {"Join", "Pull", "Push"} <= set(run.calls) and "Leave" not in run.calls


def test_a_factory_the_server_names_is_not_imported_unless_the_worker_allows_it(tmp_path: Path, marker: Path) -> None:
    spec = {**GOOD_SPEC, "dataset": "hostile_factory:make"}
    run = run_worker(Scenario(spec=spec), tmp_path)  # no --max-batch: the memory probe builds the job from Status
    line = refused(run, "'hostile_factory:make'")
    assert "--allow-import hostile_factory" in line and run.code == 2
    assert not marker.exists() and "Join" not in run.calls
    run = run_worker(Scenario(spec=spec), tmp_path, "--max-batch", "16")  # built after Join: left again
    refused(run, "--allow-import hostile_factory")
    assert not marker.exists() and "Leave" in run.calls
    run = run_worker(Scenario(spec=spec), tmp_path, "--allow-import", "hostile_factory")  # the worker's own choice
    assert marker.exists() and run.code == 2, run.stderr


def test_a_spec_with_wrong_field_types_is_refused_before_anything_runs(tmp_path: Path, marker: Path) -> None:
    exec_spec = {**GOOD_SPEC, "dataset": "builtins:exec", "seed": f"open({str(marker)!r}, 'w')"}
    run = run_worker(Scenario(spec=exec_spec), tmp_path, "--max-batch", "16")
    refused(run, "seed must be int")
    assert not marker.exists() and "Leave" in run.calls and run.code == UNTRUSTED_SERVER
    for wrong, needle in (({"workers": "4"}, "workers must be int"), ({"lr": "0.1"}, "lr must be float"),
                          ({"model_options": [1]}, "model_options must be dict"), ({"nesterov": 1}, "nesterov must be bool")):
        run = run_worker(Scenario(spec={**GOOD_SPEC, **wrong}), tmp_path)
        refused(run, needle)


@pytest.mark.parametrize(
    ("scenario", "needle"),
    [
        (Scenario(join={"batch_size": 2**31 - 1}), "batch of 2147483647, outside [0, the global batch 16]"),
        (Scenario(join={"batch_size": -5}), "batch of -5"),
        (Scenario(join={"batch_size": 40, "global_batch": 30}), "batch of 40, outside [0, the global batch 30]"),
        (Scenario(pull={"batch_size": 12, "global_batch": 10**9}), "above this worker's --max-batch 8"),
        (Scenario(pull={"num_values": NUMEL - 1}, values=[0.0] * (NUMEL - 1)), f"the layout expects {NUMEL}"),
        (Scenario(values=[0.0] * (NUMEL - 1) + [float("nan")]), "NaN or Inf"),
        (Scenario(pull={"lr": float("nan")}), "learning rate nan"),
        (Scenario(join={"heartbeat_interval_s": 0.001}), "heartbeat interval 0.001 s"),
    ],
    ids=["huge-batch", "negative-batch", "batch-over-joined-b", "batch-over-max", "short-reply", "nan-parameters", "nan-lr", "1ms-heartbeat"],
)
def test_numbers_beyond_the_workers_bounds_are_refused_and_the_worker_leaves(
    tmp_path: Path, scenario: Scenario, needle: str
) -> None:
    run = run_worker(scenario, tmp_path, "--max-batch", "8")
    refused(run, needle)
    assert run.code == UNTRUSTED_SERVER and "Leave" in run.calls and "Push" not in run.calls


FORGED = "\x1b[2J\nps-worker: job done after 99 steps\r"  # clears the screen, then a line of the worker's own


def test_a_servers_words_reach_the_terminal_as_one_printable_line(tmp_path: Path) -> None:
    """An error's details and the reason a job ended are the server's to choose: shown as they came, an
    escape sequence would act on the worker's terminal and a line break forge a line of its own. Each is
    shown on the worker's line, its control characters escaped, cut to a bound."""
    run = run_worker(Scenario(join_error="refused" + FORGED + "x" * 6_000), tmp_path, "--max-batch", "16")
    line = refused(run, "FAILED_PRECONDITION: refused\\x1b[2J\\nps-worker: job done after 99 steps\\r")
    assert run.code == 1 and len(line) < 4100 and line.endswith("x...")
    assert "\x1b" not in run.stderr and "\nps-worker: job done" not in run.stderr, run.stderr
    run = run_worker(Scenario(pull={"done": True, "reason": "stopping)" + FORGED}), tmp_path, "--max-batch", "16",
                     quiet=False)
    # a reason other than finished or stopping is an early end's, whatever it says: the worker exits as ps-server would
    assert run.code == ENDED_EARLY and "job ended (stopping)\\x1b[2J\\nps-worker: job done" in run.stderr, run.stderr
    assert "\x1b" not in run.stderr and "\nps-worker: job done" not in run.stderr, run.stderr


class Listener:
    """A stand-in shard server on another loopback address: counts the connections it gets and closes them."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def wait_for_connection(self, seconds: float) -> bool:
        """Whether a connection was accepted within `seconds`."""
        deadline = time.monotonic() + seconds
        while self.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.connections > 0

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def test_a_shard_on_a_host_other_than_the_servers_is_never_contacted_unless_allowed(tmp_path: Path) -> None:
    listener = Listener("127.0.0.3")
    try:
        # the server's own part of the parameters is valid, so that the shard's is what the worker pulls
        # next: with all NUMEL values the worker may refuse the server's reply before it reaches the shard
        scenario = Scenario(shards=[(listener.address, 1000, NUMEL)], values=[0.0] * 1000)
        run = run_worker(scenario, tmp_path, "--max-batch", "16")
        refused(run, f"shard at {listener.address}, not on its own host 127.0.0.1")
        assert "--allow-shard-host 127.0.0.3" in run.stderr and "Leave" in run.calls
        assert listener.connections == 0
        allowed = run_worker(scenario, tmp_path, "--max-batch", "16", "--allow-shard-host", "127.0.0.3")
        # allowed: the worker went there. A connection the kernel completed may still wait in the backlog
        # when the worker exits, so the listener gets a moment to accept it.
        assert listener.wait_for_connection(10.0), allowed.stderr[-2000:]
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"hidden": 16, "layers": 3000000}, "layers must be in [0, 64], got 3000000"),
        ({"hidden": 60000}, "hidden must be in [1, 16384], got 60000"),
        ({"hidden": 16384, "layers": 64}, "needs about"),  # in range: 17 billion parameters, beyond any worker's memory
    ],
    ids=["3M-layers", "60k-hidden", "beyond-memory"],
)
def test_a_model_beyond_the_workers_bounds_is_refused_before_it_is_built(
    tmp_path: Path, options: dict[str, Any], needle: str
) -> None:
    """No --max-batch: the worker builds the job from Status to probe its memory, before it joins."""
    start = time.monotonic()
    run = run_worker(Scenario(spec={**GOOD_SPEC, "model_options": options}), tmp_path)
    took = time.monotonic() - start
    line = refused(run, needle)
    assert "this worker cannot build the job's data and model" in line and run.code == 2
    assert "Join" not in run.calls and took < 60, (took, run.stderr)


def test_a_model_beyond_the_workers_bounds_after_join_is_refused_and_the_worker_leaves(tmp_path: Path) -> None:
    """With --max-batch the worker joins first and builds the job after: it refuses, leaves, pushes nothing."""
    run = run_worker(Scenario(spec={**GOOD_SPEC, "model_options": {"hidden": 16, "layers": 3000000}}), tmp_path,
                     "--max-batch", "16")
    refused(run, "layers must be in [0, 64], got 3000000")
    assert run.code != 0 and "Leave" in run.calls and "Pull" not in run.calls and "Push" not in run.calls


def after(run: Run, call: str) -> float:
    """Seconds from the fake server's first `call` to the worker's exit."""
    return run.ended - run.times[call]


def test_a_join_the_server_never_answers_ends_within_the_timeout(tmp_path: Path) -> None:
    """A server that takes the Join and says nothing: the worker asks Status after --timeout, which
    says the job waits for no other worker, and gives up with one line, not waiting on for ever."""
    run = run_worker(Scenario(hang="Join"), tmp_path, "--max-batch", "16", timeout="3")
    line = refused(run, "did not answer this worker's Join within 3 s (--timeout)")
    assert "DEADLINE_EXCEEDED" in line and run.code == 1, run.stderr
    assert after(run, "Join") < 3 + 10, (after(run, "Join"), run.stderr)
    assert "Pull" not in run.calls


def test_a_join_waits_while_the_server_says_the_job_waits_and_ends_once_it_goes_silent(tmp_path: Path) -> None:
    """Status says two workers are expected: a Join held for the start is legitimate, said once, and
    asked after every --timeout; once Status goes unanswered too the worker gives up within its bound."""
    scenario = Scenario(hang="Join", expected_workers=2, status_hangs_after=7.0)
    run = run_worker(scenario, tmp_path, "--max-batch", "16", timeout="2")
    assert "w: waiting for the job to start (the server expects 2 workers)" in run.stderr, run.stderr
    line = refused(run, "did not answer this worker's Join within 2 s (--timeout), nor its Status")
    assert run.code == 1 and after(run, "Join") >= 7, (after(run, "Join"), line)
    assert after(run, "Join") < 7 + 2 * 2 + 10, (after(run, "Join"), run.stderr)
    assert run.calls.count("Status") >= 3  # asked again while it waited


def test_a_pull_whose_values_stall_after_the_header_ends_within_the_timeout(tmp_path: Path) -> None:
    run = run_worker(Scenario(hang="Pull-body"), tmp_path, "--max-batch", "16", timeout="3")
    line = refused(run, "stalled: no data for 3 s after 1 chunk(s) (--timeout)")
    assert line.startswith("ps-worker: error: DEADLINE_EXCEEDED: a Pull from 127.0.0.1:") and run.code == 1, line
    assert after(run, "Pull") < 3 + 10, (after(run, "Pull"), run.stderr)
    assert "Leave" in run.calls and "Push" not in run.calls


def test_a_pull_that_sends_only_empty_chunks_after_the_header_ends_within_the_timeout(tmp_path: Path) -> None:
    """Progress is data: a chunk without values every 0.2 s restarts no pause bound (it held the worker
    for as long as the server kept sending them)."""
    run = run_worker(Scenario(hang="Pull-empty"), tmp_path, "--max-batch", "16", timeout="3")
    refused(run, "stalled: no data for 3 s after ")
    assert run.code == 1 and after(run, "Pull") < 3 + 10, (after(run, "Pull"), run.stderr)
    assert "Leave" in run.calls and "Push" not in run.calls


def test_a_pull_whose_values_trickle_ends_within_the_timeout_and_their_size(tmp_path: Path) -> None:
    """One value every 0.2 s, each well within the pause bound: the 1,210 values would take 4 minutes
    (a model of millions of values, days); their waits together are bounded by --timeout and a second
    per 256 KiB."""
    run = run_worker(Scenario(hang="Pull-trickle"), tmp_path, "--max-batch", "16", timeout="3")
    refused(run, "too slow: its values still incomplete after ")
    assert run.code == 1 and after(run, "Pull") < 3 + 10, (after(run, "Pull"), run.stderr)
    assert "Leave" in run.calls and "Push" not in run.calls


def test_a_push_reply_that_stalls_after_its_header_is_given_up_and_the_worker_rejoins(tmp_path: Path) -> None:
    """Mid-job: the values of a push's reply stop coming; at --timeout the worker says so, rejoins
    within --retry-for and goes on (the fake's next push reply ends the job)."""
    run = run_worker(Scenario(hang="Push-body"), tmp_path, "--max-batch", "16", timeout="3", retry_for="30")
    assert run.code == 0, run.stderr
    assert "w: the server did not answer in time (the reply to a push from 127.0.0.1:" in run.stderr, run.stderr
    assert "stalled: no data for 3 s after 1 chunk(s) (--timeout)); rejoining, for up to 30 s" in run.stderr
    assert run.calls.count("Join") == 2 and run.calls.count("Push") == 2 and "Leave" in run.calls
