"""`ps-cluster slurm` without Slurm: the batch script's components and resources, the token kept off
every command line, the requeue directives, the script run by bash against stand-in Slurm commands,
the task wrapper, and the parsing of what sbatch/scontrol/sacct print. The real-Slurm run is
tests/deploy/test_slurm_run.py (marked `slurm`)."""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from io import StringIO
from pathlib import Path

import pytest

from deploy import slurm, slurm_follow
from tests.cluster_cli import run_cli as run_ps_cluster
from deploy.profiles import builtin_profiles, load_profile

CASES = [(name, mode) for name in builtin_profiles() for mode in ("bsp", "asp")]
GPU_PROFILE = """\
kind: profile
name: mixed
bsp:
  workers: [8, 8, 4, 16]
  gpus: [1, 1, 0, 2]
"""


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`ps-cluster slurm ARGV` (cluster_cli.run_cli)."""
    return run_ps_cluster(capsys, "slurm", *argv)


def script(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    return out


def components(text: str) -> list[dict[str, str]]:
    """Each component's #SBATCH options, split at the hetjob separators."""
    found: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if line == "#SBATCH hetjob":
            found.append({})
        elif line.startswith("#SBATCH --"):
            name, _, value = line[len("#SBATCH --"):].partition("=")
            found[-1][name] = value
    return found


def srun_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("srun ")]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_one_component_for_the_server_and_one_per_class_of_worker(
    capsys: pytest.CaptureFixture[str], name: str, mode: str
) -> None:
    text = script(capsys, "--profile", name, "--mode", mode, "--scale", "0.25")
    allocation = load_profile(name).allocation(mode)
    found = components(text)
    classes = sorted(set(allocation.workers))
    assert len(found) == 1 + len(classes)
    server = found[0]
    assert server["ntasks"] == "1"
    expected_server = math.ceil(allocation.server * 0.25) if mode == "asp" and allocation.server else 1
    assert server["cpus-per-task"] == str(expected_server)
    tasks = {}
    for component in found[1:]:
        tasks[int(component["cpus-per-task"])] = tasks.get(int(component["cpus-per-task"]), 0) + int(component["ntasks"])
    assert sum(tasks.values()) == len(allocation.workers)
    for cores in classes:
        assert tasks.get(max(1, math.ceil(cores * 0.25)), 0) >= allocation.workers.count(cores)
    runs = srun_lines(text)
    assert [line.split()[1] for line in runs] == [f"--het-group={k}" for k in range(len(found))]
    named = [w for line in runs[1:] for w in line.split("--names ")[1].split()[0].split(",")]
    assert sorted(named) == sorted(f"w{k}" for k in range(len(allocation.workers)))


def test_each_worker_declares_its_cores_and_threads(capsys: pytest.CaptureFixture[str]) -> None:
    text = script(capsys, "--profile", "hl4")  # bsp 9, 9, 6, 24 cores
    runs = srun_lines(text)
    assert "--names w0,w1" in runs[1] and "--cores 9 --threads 9 --device cpu" in runs[1]
    assert "--names w2" in runs[2] and "--cores 6 --threads 6" in runs[2]
    assert "--names w3" in runs[3] and "--cores 24 --threads 24" in runs[3]
    assert [c["cpus-per-task"] for c in components(text)] == ["1", "9", "6", "24"]
    assert [c["ntasks"] for c in components(text)] == ["1", "2", "1", "1"]


def test_gpus_are_asked_for_as_gres_and_their_workers_use_cuda(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = tmp_path / "mixed.yaml"
    profile.write_text(GPU_PROFILE, encoding="utf-8")
    text = script(capsys, "--profile", str(profile), "--memory", "8G", "--partition", "gpu", "--time", "1:00:00")
    found = components(text)
    assert [c.get("gres") for c in found] == [None, "gpu:1", None, "gpu:2"]
    assert all(c["mem"] == "8G" and c["partition"] == "gpu" and c["time"] == "1:00:00" for c in found)
    runs = srun_lines(text)
    assert "--names w0,w1" in runs[1] and "--device cuda" in runs[1]
    assert "--names w2" in runs[2] and "--device cpu" in runs[2]
    typed = script(capsys, "--profile", str(profile), "--gres", "gpu:a100")
    assert [c.get("gres") for c in components(typed)] == [None, "gpu:a100:1", None, "gpu:a100:2"]


def test_requeue_directives_and_resume(capsys: pytest.CaptureFixture[str]) -> None:
    text = script(capsys, "--profile", "hl2")
    first = components(text)[0]
    assert "requeue" in first and first["open-mode"] == "append" and first["output"] == "slurm-%j.out"
    assert all("requeue" not in c for c in components(text)[1:])
    assert 'start=(--resume "$job_dir/checkpoints")' in text
    assert 'start=(--checkpoint-dir "$job_dir/checkpoints")' in text
    assert text.splitlines()[0] == "#!/bin/bash"


def test_the_token_is_never_on_a_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    text = script(capsys, "--profile", "hl8", "--limiter", "auto", "--scale", "0.1")
    assert "--token" not in text
    uses = [line.strip() for line in text.splitlines() if "PS_TOKEN" in line and not line.lstrip().startswith("#")]
    assert uses == ['read -r PS_TOKEN < "$job_dir/token"', "export PS_TOKEN"]


def test_the_limiter_gives_each_task_its_quota(capsys: pytest.CaptureFixture[str]) -> None:
    text = script(capsys, "--profile", "hl4", "--scale", "0.03125", "--limiter", "auto")
    runs = srun_lines(text)
    assert "--limiter" not in runs[0]  # bsp: the server has no quota
    assert "--limiter auto --cores 0.28125" in runs[1] and "--slowdowns 2.66667,2.66667" in runs[1]
    assert "--limiter auto --cores 0.1875" in runs[2] and "--slowdowns 4 " in runs[2]
    assert "--cores 0.75" in runs[3] and "--slowdowns" not in runs[3]  # the fastest worker runs at 1
    assert all("--startup-cores 1 --settle-on \"$job_dir/metrics.jsonl\"" in line for line in runs[1:])
    asp = srun_lines(script(capsys, "--profile", "hl4", "--mode", "asp", "--scale", "0.03125", "--limiter", "cgroup"))
    assert "--names server --log-dir \"$job_dir\" --limiter cgroup --cores 0.25" in asp[0]
    assert "--limiter" not in srun_lines(script(capsys, "--profile", "hl4"))[1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--server-arg=--port 5"], "--port is set by ps-cluster slurm"),
    (["--server-arg=--token x"], "--token is set by ps-cluster slurm"),
    (["--server-arg=--epochs 0"], "ps-server would refuse"),
    (["--mode", "asp", "--server-arg=--adaptive-batch gns"], "ps-server would refuse these arguments: --adaptive-batch gns is for --mode bsp"),
    (["--mode", "asp", "--server-arg=--allreduce on"], "ps-server would refuse these arguments: --allreduce is the BSP collective fast path"),
    (["--server-arg=--shards 2 --balance cycle"], "ps-server would refuse these arguments: --balance cycle is measured in BSP rounds"),
    (["--server-arg=--allreduce off --allreduce-algorithm ring"], "ps-server would refuse these arguments: --allreduce-algorithm needs --allreduce"),
    (["--server-arg=--shard-addresses=node7"], "ps-server would refuse these arguments: --shard-addresses: expected HOST:PORT with a port in 1-65535, got 'node7'"),
    (["--server-arg=--tls-cert /certs/server.crt"], "ps-server would refuse these arguments: --tls-cert and --tls-key go together"),
    (["--server-arg=--shards 2 --tls-cert /certs/server.crt --tls-key /certs/server.key"],
     "ps-server would refuse these arguments: --shards with TLS needs --shard-tls-ca"),
    (["--time", "tomorrow"], "--time 'tomorrow'"),
    (["--memory", "8 GB"], "--memory '8 GB'"),
    (["--job-name", "a b"], "--job-name 'a b'"),
    (["--profile", "nope"], "unknown profile 'nope'"),
    (["--limiter", "fast"], "invalid choice"),
])
def test_bad_input_is_one_error_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv, "--out", str(tmp_path / "job"))
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "job").exists()


def test_a_profile_whose_step_overhead_is_past_the_most_emulated_is_one_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """step_overhead_ms: 1.0e+308 was written into the script as every worker's --step-overhead-ms."""
    profile = tmp_path / "slow.yaml"
    profile.write_text("bsp:\n  workers: [1, 2]\n  step_overhead_ms: 1.0e+308\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "--profile", str(profile), "--out", str(tmp_path / "job"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "step_overhead_ms[0] must be a number of ms in [0, 60000], got 1e+308" in err
    assert not (tmp_path / "job").exists()


def test_submit_without_slurm_is_one_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = run_cli(capsys, "--profile", "hl4", "--out", str(tmp_path / "job"), "--submit")
    assert code == 2 and out == ""
    assert err.strip() == "ps-cluster: error: sbatch is not on PATH: submit from a machine with Slurm's commands"


def test_out_writes_the_script_and_no_secret(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--profile", "hl4", "--out", str(tmp_path / "job"))
    assert code == 0 and "sbatch" in err
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == [slurm.SCRIPT_NAME]
    text = (tmp_path / "job" / slurm.SCRIPT_NAME).read_text(encoding="utf-8")
    assert components(text)[0]["chdir"] == str((tmp_path / "job").resolve())


STUBS = {
    "scontrol": """\
        if [ "$1 $2" = "show hostnames" ]; then echo n7; echo n8; exit 0; fi
        if [ "$1 $2" = "show node" ]; then echo "NodeName=$3 Arch=x86_64"; echo "   NodeAddr=127.0.0.1 NodeHostName=h"; exit 0; fi
        exit 1
    """,
    # each step: its command line, and whether it saw the token, to a log; the server's step writes its port
    "srun": """\
        printf '%s\\n' "$*" >> "$CALLS"
        echo "token-in-env=${PS_TOKEN:+yes}" >> "$CALLS"
        previous=""
        for arg in "$@"; do
            if [ "$previous" = "--port-file" ]; then echo 40123 > "$arg"; fi
            previous=$arg
        done
    """,
}


def run_script(text: str, job: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(job / "calls.log"),
           "SLURM_JOB_ID": "41", "SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "n7",
           "SLURM_JOB_NODELIST_HET_GROUP_1": "n8"}
    path = job / slurm.SCRIPT_NAME
    path.write_text(text, encoding="utf-8")
    return subprocess.run(["bash", str(path)], cwd=job, env=env, capture_output=True, text=True, timeout=60)


def test_the_script_runs_its_steps_and_resumes_when_requeued(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bin_dir, job = tmp_path / "bin", tmp_path / "job"
    bin_dir.mkdir()
    job.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + textwrap.dedent(body), encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    text = script(capsys, "--profile", "hl2", "--server-arg=--epochs 2")

    first = run_script(text, job, bin_dir)
    assert first.returncode == 0, first.stderr
    assert "server on 127.0.0.1:40123 (n7)" in first.stdout
    token = (job / "token").read_text(encoding="utf-8").strip()
    assert len(token) == 32 and stat.S_IMODE((job / "token").stat().st_mode) == 0o600
    calls = (job / "calls.log").read_text(encoding="utf-8")
    assert token not in calls and token not in first.stdout + first.stderr
    steps = [line for line in calls.splitlines() if line.startswith("--het-group")]
    assert len(steps) == 1 + len(components(text)[1:])
    assert calls.count("token-in-env=yes") == len(steps)
    assert "--host 127.0.0.1 --port 0" in steps[0] and f"--checkpoint-dir {job}/checkpoints" in steps[0]

    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "ckpt-0000000005.pt").write_bytes(b"")
    (job / "calls.log").unlink()
    again = run_script(text, job, bin_dir)  # as a requeued run finds the folder
    assert again.returncode == 0, again.stderr
    assert "resuming from the newest checkpoint" in again.stdout
    assert f"--resume {job}/checkpoints" in (job / "calls.log").read_text(encoding="utf-8")
    assert (job / "token").read_text(encoding="utf-8").strip() == token  # the same job keeps its token


def task(tmp_path: Path, *args: str, env: dict[str, str] | None = None, code: str = "") -> subprocess.CompletedProcess[str]:
    program = code or "import os; print('name', os.environ['PS_NAME'], 'slowdown', os.environ.get('PS_SLOWDOWN'))"
    return subprocess.run(
        [sys.executable, "-m", "deploy.slurm_task", *args, "--log-dir", str(tmp_path), "--", sys.executable, "-c", program],
        env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60,
    )


def test_a_task_takes_its_name_from_slurm_procid_and_logs_there(tmp_path: Path) -> None:
    done = task(tmp_path, "--names", "w0,w1", env={"SLURM_PROCID": "1"})
    assert done.returncode == 0, done.stderr
    assert "name w1 slowdown None" in (tmp_path / "w1.log").read_text(encoding="utf-8")
    slow = task(tmp_path, "--names", "w2,w3", "--limiter", "slowdown", "--cores", "0.5", "--period-us", "2000",
                "--slowdowns", "4,1.5", env={"SLURM_PROCID": "0"})
    assert slow.returncode == 0, slow.stderr
    assert "name w2 slowdown 4.0" in (tmp_path / "w2.log").read_text(encoding="utf-8")
    failed = task(tmp_path, "--names", "w5", code="raise SystemExit(3)")
    assert failed.returncode == 3
    missing = task(tmp_path, "--names", "w0", env={"SLURM_PROCID": "2"})
    assert missing.returncode == 2 and "SLURM_PROCID '2' names no task of w0" in missing.stderr


def test_a_task_runs_under_its_cgroup_quota(tmp_path: Path) -> None:
    from deploy.cgroups import detect_backend

    if detect_backend() is None:
        pytest.skip("no writable cgroup CPU controller here (needs root on Linux)")
    probe = "print(open('/proc/self/cgroup').read())"
    done = task(tmp_path, "--names", "w0", "--limiter", "cgroup", "--cores", "0.5", "--period-us", "2000",
                code=probe, env={"SLURM_JOB_ID": "77"})
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "w0.log").read_text(encoding="utf-8")
    assert "quota of 0.5 cores" in log and "hetero-ps/slurm-77." in log and "/w0" in log


SCONTROL_LINE = ("JobId=12 HetJobId=12 HetJobOffset=0 JobName=hetero-ps UserId=root(0) JobState={state} "
                 "Reason={reason} Dependency=(null) Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode={code} "
                 "NodeList=n1 BatchHost=n1")


def scontrol(state: str, restarts: int = 0, code: str = "0:0", reason: str = "None") -> str:
    line = SCONTROL_LINE.format(state=state, restarts=restarts, code=code, reason=reason)
    return line + "\n" + line.replace("JobId=12 ", "JobId=13 ").replace("HetJobOffset=0", "HetJobOffset=1") + "\n"


def test_what_slurm_prints_is_parsed() -> None:
    assert slurm_follow.parse_scontrol(scontrol("RUNNING")) == slurm_follow.JobState("RUNNING", 0, None, "None", "n1")
    ended = slurm_follow.parse_scontrol(scontrol("FAILED", 1, "2:0"))
    assert ended is not None and ended.ended and ended.exit_code == 2 and ended.restarts == 1
    assert slurm_follow.exit_status("0:15") == 143
    assert slurm_follow.parse_sacct("COMPLETED|0:0\n") == slurm_follow.JobState("COMPLETED", 0, 0)
    assert slurm_follow.parse_sacct("CANCELLED by 0|0:9\n").exit_code == 137  # type: ignore[union-attr]
    assert slurm_follow.parse_scontrol("slurm_load_jobs error: Invalid job id specified\n") is None


class FakeSlurm:
    """Answers sbatch, scontrol and sacct from a list of job states, one per query."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if argv[0] == "sbatch":
            return subprocess.CompletedProcess(argv, 0, "12\n", "")
        if argv[0] == "scontrol" and self.states:
            return subprocess.CompletedProcess(argv, 0, self.states.pop(0), "")
        return subprocess.CompletedProcess(argv, 1, "", "Slurm accounting storage is disabled")


def test_follow_prints_the_state_and_progress_and_returns_the_exit_code(tmp_path: Path) -> None:
    events = [
        '{"event": "adjust", "step": 0, "batch_sizes": {"w0": 64, "w1": 64}, "changed": false, "adjustments": 0}',
        '{"event": "epoch", "epoch": 1, "batch_sizes": {"w0": 64, "w1": 64}, "samples_per_s": 900.0}',
        '{"event": "resume", "step": 5, "epoch": 1}',
        '{"event": "summary", "epochs": 2, "batch_sizes": {"w0": 40, "w1": 88}, "accuracy": 0.91, '
        '"samples_per_s": 1000, "reason": "finished"}',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(events) + "\n", encoding="utf-8")
    fake = FakeSlurm([scontrol("PENDING", reason="Resources"), scontrol("RUNNING"), scontrol("PENDING", 1, reason="BeginTime"),
                      scontrol("COMPLETED", 1)])
    assert slurm_follow.submit(tmp_path / "x.sbatch", fake) == 12
    out = StringIO()
    assert slurm_follow.follow(12, tmp_path, out, fake, poll_s=0.0) == 0
    text = out.getvalue()
    for line in ("job 12: PENDING (Resources)", "job 12: RUNNING on n1", "plan at step 0: w0=64 w1=64",
                 "epoch 1: w0=64 w1=64 | 900 samples/s", "resumed from its checkpoint at step 5",
                 "job 12: PENDING (BeginTime), requeued 1x", "done: 2 epochs, final plan w0=40 w1=88, accuracy 91.0%",
                 "job 12: COMPLETED, exit status 0"):
        assert line in text
    lost = FakeSlurm([])
    assert slurm_follow.follow(12, tmp_path, StringIO(), lost, poll_s=0.0) == 1
    refused = lambda argv: subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Batch job submission failed")  # noqa: E731
    with pytest.raises(RuntimeError, match="Batch job submission failed"):
        slurm_follow.submit(tmp_path / "x.sbatch", refused)
