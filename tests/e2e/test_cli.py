"""Bad command-line input exits non-zero with one clear line and starts nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ps.ops.port_file import PortFile
from ps.server import main as server_main
from tests.cli_checks import server_refuses
from tests.processes import ENV


TINY_SET = ["--dataset", "teacher", "--dataset-arg", "size=6"]
"""A dataset of 5 training samples (and 1 test sample)."""


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**ENV, "PS_SHARD_KEY": "a-coordinator-key-for-tests"}  # ps-shard starts only with one
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "resnet9000"], "unknown model 'resnet9000'"),
        (["--workers", "0"], "argument --workers: expected a whole number > 0, got '0'"),
        (["--deadband", "1.0"], "argument --deadband: expected a number in [0, 1), got '1.0'"),
        (["--deadband", "-0.1"], "deadband"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--model", "no_such_module_xyz:fn"], "cannot import model module"),
        (["--adjust-every", "soon"], "argument --adjust-every: expected 'epoch' or a whole number of steps > 0"),
        (["--checkpoint-every", "0"], "argument --checkpoint-every: expected 'epoch' or a whole number of steps > 0, got '0'"),
        (["--workers", "8", "--global-batch", "16", "--min-batch", "4"], "exceeds --global-batch"),
        (["--lr-milestones", "5,3"], "argument --lr-milestones: expected increasing whole numbers >= 1, got '5,3'"),
        (["--lr-milestones", "a,b"], "argument --lr-milestones: expected comma-separated whole numbers, e.g. 5,8, got 'a,b'"),
        (["--min-batch", "100", "--max-batch", "10"], "--max-batch 10 is below --min-batch 100"),
        (["--workers", "3", "--global-batch", "2"], "--global-batch 2 must be >= --workers 3"),
        (["--seed", "-1"], "argument --seed: expected a whole number >= 0, got '-1'"),
        (["--momentum", "1"], "argument --momentum: expected a number in [0, 1), got '1'"),
        (["--lr-gamma", "2"], "argument --lr-gamma: expected a number in (0, 1], got '2'"),
        (["--ewma-alpha", "1.5"], "argument --ewma-alpha: expected a number in (0, 1], got '1.5'"),
        (["--max-staleness", "-1"], "argument --max-staleness: expected a whole number >= 0, got '-1'"),
        (["--mode", "asp", "--staleness-bound", "-1"], "argument --staleness-bound: expected a whole number >= 0, got '-1'"),
        (["--mode", "asp", "--staleness-bound", "two"], "argument --staleness-bound: expected a whole number, got 'two'"),
        (["--mode", "asp", "--staleness-lr", "sqrt"], "argument --staleness-lr: invalid choice: 'sqrt'"),
        (["--staleness-bound", "2"], "--staleness-bound and --staleness-lr are for --mode asp, not --mode bsp"),
        (["--staleness-lr", "inverse"], "--staleness-bound and --staleness-lr are for --mode asp, not --mode bsp"),
        (["--max-update-norm", "0"], "argument --max-update-norm: expected a number > 0, got '0'"),
        (["--clip-outliers", "0.5"], "argument --clip-outliers: expected a number >= 1, got '0.5'"),
        (["--shards", "2", "--clip-outliers", "10"], "--max-update-norm and --clip-outliers bound the pushes this server aggregates whole"),
        (["--allreduce", "on", "--max-update-norm", "5"], "not with --shards (each shard sees a slice) or --allreduce on"),
        (["--threads", "0"], "argument --threads: expected a whole number > 0, got '0'"),
        (["--epochs", "1000001"], "argument --epochs: expected a whole number in [1, 1000000], got '1000001'"),
        (["--adaptive-batch", "gns", "--workers", "2", "--global-batch", "512", "--min-global-batch", "200"],
         "--adaptive-batch gns: --min-global-batch 200 leaves no batch to choose from: an epoch of the training set's "
         "1438 samples holds 16 rounds only up to B = 89"),
        (["--adaptive-batch", "gns", "--workers", "100", "--global-batch", "512"],
         "its smallest B, --workers 100 x --min-batch 1 = 100, leaves no batch to choose from"),
        (["--keep-checkpoints", "0"], "argument --keep-checkpoints: expected a whole number > 0, got '0'"),
        (["--rendezvous-port", "29500"], "unrecognized arguments: --rendezvous-port 29500"),  # the store is on --port
        (["--nesterov", "--momentum", "0"], "--nesterov needs --momentum > 0"),
        (["--model-arg", "hidden"], "argument --model-arg: expected K=V, got 'hidden'"),
        (["--model-arg", "depth=3"], "model 'mlp' has no option 'depth' (its options: hidden, layers)"),
        (["--port", "70000"], "--port: expected a port in 0-65535, got '70000'"),
        (["--grace", "nan"], "--grace: expected a finite number, got 'nan'"),
        (["--lr", "inf"], "--lr: expected a finite number, got 'inf'"),
        (["--weight-decay", "nan"], "--weight-decay: expected a finite number"),
        (["--workers", "2", "--global-batch", "128", "--max-batch", "10"], "--workers 2 x --max-batch 10 cannot make up --global-batch 128"),
        (["--checkpoint-dir", "/dev/null/ckpt"], "checkpoint directory /dev/null/ckpt is not writable"),
        (["--metrics-log", "/nonexistent-dir/x.jsonl"], "--metrics-log /nonexistent-dir/x.jsonl: cannot write there (No such file or directory)"),
        (["--model", "mlp", "--model-arg", "hidden=-1"], "model 'mlp' rejected its options {'hidden': -1}: hidden must be >= 1"),
        (["--model", "cnn", "--model-arg", "width=0"], "width must be >= 1, got 0"),
        (["--dataset", "synthetic", "--dataset-arg", "noise=NaN"], "noise must be a finite number, got nan"),
        (["--controller", "oracle"], "argument --controller: invalid choice: 'oracle'"),
        (["--model", "tests.common.job.test_models:narrow_input_model"],
         "model 'tests.common.job.test_models:narrow_input_model' cannot take the dataset's inputs of shape (1, 8, 8)"),
        (["--model", "tests.common.job.test_models:wrong_classes_model"], "it gave (2, 13)"),
        (["--no-park=yes"], "--no-park: ignored explicit argument 'yes'"),
        # --no-park where the policy never parks was accepted and did nothing
        (["--policy", "static", "--no-park"], "--no-park is for --policy model or auto, the policies that park a "
                                              "worker; --policy static never parks one"),
        (["--controller", "uniform", "--no-park"], "--no-park is for --policy model or auto"),
        (TINY_SET + ["--workers", "2", "--global-batch", "16"],
         "--global-batch 16 exceeds the training set's 5 samples (a step would train samples more than once and end "
         "epochs together): use --global-batch 5 or less"),
        (TINY_SET + ["--workers", "8", "--global-batch", "8"],
         "no global batch can give --workers 8 a sample each within them: use a larger dataset or --workers 5 or fewer"),
    ],
)
def test_server_rejects_bad_input(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    server_refuses(args, needle, capsys)


def test_a_global_batch_over_the_training_set_is_refused_before_the_metrics_log_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    server_refuses([*TINY_SET, "--global-batch", "6", "--metrics-log", str(log)], "--global-batch 6 exceeds", capsys)
    assert not log.exists()


def test_server_error_is_one_line_from_a_real_process() -> None:
    result = run("ps.server", "--port", "0", "--model", "resnet9000")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown model" in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--server", "127.0.0.1:1", "--slowdown", "0.5"], "--slowdown"),
        (["--server", "nohostport"], "HOST:PORT"),
        (["--server", "127.0.0.1:99999"], "expected HOST:PORT with a port in 1-65535, got '127.0.0.1:99999'"),
        (["--server", "127.0.0.1:1", "--timeout", "nan"], "--timeout: expected a finite number, got 'nan'"),
        (["--server", "127.0.0.1:1", "--slowdown", "inf"], "--slowdown: expected a finite number, got 'inf'"),
        (["--server", "127.0.0.1:1", "--retry-for", "-5"], "--retry-for: expected a number >= 0, got '-5'"),
        (["--server", "127.0.0.1:1", "--threads", "0"], "--threads"),
        (["--server", "127.0.0.1:1", "--heap-reserve", "-1"], "--heap-reserve"),
        (["--server", "127.0.0.1:1", "--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N"),
        (["--server", "127.0.0.1:1", "--device", "cuda:99"], "--device cuda:99"),
        (["--server", "127.0.0.1:1", "--step-overhead-ms", "-1"], "--step-overhead-ms: expected a number in [0, 60000], got '-1'"),
        (["--server", "127.0.0.1:1", "--step-overhead-ms", "inf"], "--step-overhead-ms: expected a finite number"),
        (["--server", "127.0.0.1:1", "--step-overhead-ms", "1e308"], "--step-overhead-ms: expected a number in [0, 60000], got '1e308'"),
    ],
)
def test_worker_rejects_bad_input(args: list[str], needle: str) -> None:
    result = run("worker.cli", *args)
    assert result.returncode == 2
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_worker_refuses_a_bad_heap_reserve_from_the_environment() -> None:
    result = subprocess.run([sys.executable, "-m", "worker.cli", "--server", "127.0.0.1:1"], capture_output=True,
                            text=True, env={**ENV, "PS_WORKER_HEAP_RESERVE_MIB": "lots"}, timeout=60)
    assert result.returncode == 2
    assert "$PS_WORKER_HEAP_RESERVE_MIB must be an integer" in result.stderr and "Traceback" not in result.stderr


def test_worker_reports_unreachable_server() -> None:
    result = run("worker.cli", "--server", "127.0.0.1:1", "--timeout", "3")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert re.search(r": server 127\.0\.0\.1:1 unreachable, retrying for [01] s \(--timeout\)$", lines[0]), result.stderr
    assert lines[-1] == "ps-worker: error: UNAVAILABLE: server 127.0.0.1:1 unreachable for 3 s (--timeout); giving up"


def test_help_lists_required_flags() -> None:
    out = run("ps.server", "--help").stdout
    for flag in ["--mode", "--workers", "--model", "--dataset", "--global-batch", "--lr", "--momentum",
                 "--weight-decay", "--epochs", "--controller", "--deadband", "--min-batch", "--max-batch",
                 "--adjust-every", "--port", "--metrics-log", "--seed"]:
        assert flag in out


def test_sigusr1_prints_a_waiting_workers_stacks_and_it_goes_on() -> None:
    """A worker waiting for a server that never answers prints every thread's stack on SIGUSR1 (what a
    test sends before it kills a worker that did not exit) and keeps waiting."""
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "--server", f"127.0.0.1:{port}", "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60  # until the handler is installed (imports take a while on a busy machine)
        while not _catches(proc.pid, signal.SIGUSR1):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        assert proc.poll() is None  # the dump does not stop it
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert "Current thread" in out or "Thread 0x" in out, out
    assert 'File "' in out and "wait_ready" in out, out


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (the SigCgt mask of /proc/PID/status)."""
    for line in open(f"/proc/{pid}/status", encoding="ascii"):
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize(("module", "prog", "args"), [("ps.server", "ps-server", ["--model-arg", "hidden=8"]),
                                                       ("ps.shards.server", "ps-shard", [])])
def test_server_on_a_port_in_use_says_so_in_one_line(module: str, prog: str, args: list[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(module, "--port", str(port), *args)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]  # gRPC's own log line may come first
    assert lines[-1].startswith(f"{prog}: error: cannot listen on 127.0.0.1:{port}: Failed to bind"), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("module", "prog"), [("ps.server", "ps-server"), ("ps.shards.server", "ps-shard")])
def test_an_unwritable_port_file_is_refused_before_anything_listens(module: str, prog: str, tmp_path: Path) -> None:
    result = run(module, "--port", "0", "--port-file", str(tmp_path / "missing" / "port"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"{prog}: error: --port-file {tmp_path / 'missing' / 'port'} cannot be written: "
                                     "No such file or directory")
    assert "listening" not in result.stdout
    result = run(module, "--port", "0", "--port-file", str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip() == f"{prog}: error: --port-file {tmp_path} is a directory"
    assert list(tmp_path.iterdir()) == []  # no probe left behind


def test_the_port_file_holds_the_bound_port(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    PortFile(port_file).write(4321)
    assert port_file.read_text() == "4321"
    PortFile(port_file).write(1234)  # replaced whole, no temporary left beside it
    assert port_file.read_text() == "1234" and [p.name for p in tmp_path.iterdir()] == ["port"]


def test_a_checkpoint_dir_holding_another_runs_checkpoints_is_refused(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A new job there would prune the earlier job's checkpoints, and --resume could pick the wrong one."""
    earlier, other = tmp_path / "earlier", tmp_path / "other"
    earlier.mkdir()
    (earlier / "ckpt-0000000040.pt").write_bytes(b"")
    for args in (["--checkpoint-dir", str(earlier)], ["--resume", str(other), "--checkpoint-dir", str(earlier)]):
        assert server_main(["--port", "0", *args]) == 2
        err = capsys.readouterr().err
        assert err.strip() == (f"ps-server: error: --checkpoint-dir {earlier} already holds 1 checkpoint(s) of another "
                               f"run (newest ckpt-0000000040.pt): continue that job with --resume {earlier}, or give "
                               "this one a folder of its own"), err
    assert [p.name for p in earlier.iterdir()] == ["ckpt-0000000040.pt"] and not other.exists()
