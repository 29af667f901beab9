"""A hostile parameter server against a real ps-worker process: the worker refuses, in one line, every
reply it should not act on, leaves, runs no code that the server names, and waits on no call past
its bound (a Join never answered, a reply whose values stop after the header).

The fake server is written against protos/ alone (grpc and the generated messages), not against our
server: it answers Status, Join, Pull, Push, Heartbeat and Leave as a scenario says. The baseline
scenario is a job the worker completes, so each refusal below is the worker's check at work.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos import ps_pb2, ps_pb2_grpc
from tests.repo import ROOT
from tests.processes import ENV

# mlp(hidden=16, layers=1) on digits (8x8 images, 10 classes): the worker builds this model itself
LAYOUT = [("1.weight", (16, 64)), ("1.bias", (16,)), ("3.weight", (10, 16)), ("3.bias", (10,))]
NUMEL = sum(math.prod(shape) for _, shape in LAYOUT)
GOOD_SPEC = {"workers": 1, "model": "mlp", "model_options": {"hidden": 16, "layers": 1}, "dataset": "digits",
             "global_batch": 16, "epochs": 1, "overlap": False}
WORKER_TIMEOUT_S = 90
MARKER_MODULE = '''
from pathlib import Path
Path({marker!r}).write_text("imported")

def make(*args, **kwargs):
    Path({marker!r}).write_text("called")
    raise RuntimeError("a factory the server named")
'''


@dataclass
class Scenario:
    """What the fake server says: the job spec, and fields of its replies that override good ones."""

    spec: dict[str, Any] = field(default_factory=lambda: dict(GOOD_SPEC))
    join: dict[str, Any] = field(default_factory=dict)
    pull: dict[str, Any] = field(default_factory=dict)
    values: list[float] | None = None  # the parameters a Pull sends (default NUMEL zeros)
    shards: list[tuple[str, int, int]] = field(default_factory=list)
    hang: str = ""  # "Join": never answered; "Pull-body", "Push-body": the first such reply stops after its header
    expected_workers: int = 1  # what Status says
    status_hangs_after: float | None = None  # seconds after the first Join from which Status is never answered


class FakeServer(ps_pb2_grpc.ParameterServerServicer):
    """Serves `scenario`; records the calls it got."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.calls: list[str] = []
        self.times: dict[str, float] = {}  # each call's first arrival (time.monotonic)
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def _spec_json(self) -> str:
        return json.dumps(self.scenario.spec)

    def _record(self, name: str) -> int:
        """Record a call; how many of its kind came before it."""
        with self.lock:
            self.calls.append(name)
            self.times.setdefault(name, time.monotonic())
            return self.calls.count(name) - 1

    def _hang(self, context: Any) -> None:
        """Answer nothing until the caller gives up or the test ends."""
        while context.is_active() and not self.stopped.wait(0.05):
            pass

    def Status(self, request: Any, context: Any) -> ps_pb2.StatusReply:
        self._record("Status")
        after = self.scenario.status_hangs_after
        if after is not None and "Join" in self.times and time.monotonic() - self.times["Join"] > after:
            self._hang(context)
        return ps_pb2.StatusReply(mode="bsp", job_json=self._spec_json(), global_batch=16,
                                  expected_workers=self.scenario.expected_workers)

    def Join(self, request: Any, context: Any) -> ps_pb2.JoinReply:
        self._record("Join")
        if self.scenario.hang == "Join":
            self._hang(context)
        fields: dict[str, Any] = {
            "worker_id": "w0", "job_json": self._spec_json(), "num_params": NUMEL, "batch_size": 8,
            "heartbeat_interval_s": 1.0, "secret": "s" * 32,
            "layout": [ps_pb2.TensorSpec(name=n, shape=list(s), dtype="float32") for n, s in LAYOUT],
            "shards": [ps_pb2.ShardInfo(address=a, start=b, stop=c) for a, b, c in self.scenario.shards],
        }
        return ps_pb2.JoinReply(**{**fields, **self.scenario.join})

    def _params(self, done: bool) -> Iterator[ps_pb2.ParamsChunk]:
        values = [0.0] * NUMEL if self.scenario.values is None else self.scenario.values
        header = {"round": 0, "batch_size": 8, "global_batch": 16, "wire_dtype": "float32", "num_values": len(values),
                  "lr": 0.1, "done": done, "reason": "finished" if done else ""}
        if not done:
            header.update(self.scenario.pull)
        yield ps_pb2.ParamsChunk(header=ps_pb2.ParamsHeader(**header), seq=0)
        yield ps_pb2.ParamsChunk(seq=1, data=struct.pack(f"<{len(values)}f", *values))

    def _reply(self, name: str, number: int, done: bool, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        """The parameters; the first reply of `name` stops after its header where the scenario says so."""
        chunks = self._params(done)
        yield next(chunks)
        if self.scenario.hang == f"{name}-body" and number == 0:
            self._hang(context)
            return
        yield from chunks

    def Pull(self, request: Any, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        yield from self._reply("Pull", self._record("Pull"), False, context)

    def Push(self, request_iterator: Any, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        for _ in request_iterator:
            pass
        yield from self._reply("Push", self._record("Push"), True, context)

    def Heartbeat(self, request: Any, context: Any) -> ps_pb2.HeartbeatReply:
        self._record("Heartbeat")
        return ps_pb2.HeartbeatReply()

    def Leave(self, request: Any, context: Any) -> ps_pb2.LeaveReply:
        self._record("Leave")
        return ps_pb2.LeaveReply()


@dataclass
class Run:
    code: int
    stderr: str
    calls: list[str]
    times: dict[str, float]  # each call's first arrival at the fake server (time.monotonic)
    ended: float  # when the worker exited (time.monotonic)


def run_worker(scenario: Scenario, tmp_path: Path, *flags: str, timeout: str = "30", retry_for: str = "0") -> Run:
    """A real ps-worker against a fake server serving `scenario`, to its exit (`timeout`, `retry_for`:
    its --timeout and --retry-for)."""
    fake = FakeServer(scenario)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    ps_pb2_grpc.add_ParameterServerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {**ENV, "PYTHONPATH": f"{tmp_path}:{ENV.get('PYTHONPATH', '')}".rstrip(":")}
        proc = subprocess.run(
            [sys.executable, "-m", "worker.cli", "--server", f"127.0.0.1:{port}", "--name", "w", "--quiet",
             "--timeout", timeout, "--retry-for", retry_for, *flags],
            capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT_S, cwd=ROOT,
        )
        ended = time.monotonic()
    finally:
        fake.stopped.set()
        server.stop(grace=None)
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
    assert not marker.exists() and "Leave" in run.calls and run.code == 3
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
    assert run.code == 3 and "Leave" in run.calls and "Push" not in run.calls


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


def test_a_push_reply_that_stalls_after_its_header_is_given_up_and_the_worker_rejoins(tmp_path: Path) -> None:
    """Mid-job: the values of a push's reply stop coming; at --timeout the worker says so, rejoins
    within --retry-for and goes on (the fake's next push reply ends the job)."""
    run = run_worker(Scenario(hang="Push-body"), tmp_path, "--max-batch", "16", timeout="3", retry_for="30")
    assert run.code == 0, run.stderr
    assert "w: the server did not answer in time (the reply to a push from 127.0.0.1:" in run.stderr, run.stderr
    assert "stalled: no data for 3 s after 1 chunk(s) (--timeout)); rejoining, for up to 30 s" in run.stderr
    assert run.calls.count("Join") == 2 and run.calls.count("Push") == 2 and "Leave" in run.calls
