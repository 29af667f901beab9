"""The front doors a person types (ps-server, ps-shard, ps-worker, ps-cluster and the benchmarks they
compare with) answer --help and refuse bad arguments before torch loads: torch's import is seconds on a
small machine, and neither answer needs it."""

from __future__ import annotations

import subprocess
from pathlib import Path
import sys

import pytest

from tests.repo import ROOT

PROBE = """
import runpy, sys
module, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = module
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as exc:
    print("exit", exc.code)
print("torch loaded" if "torch" in sys.modules else "torch not loaded")
"""

DOORS = [
    ("ps.server", ["--help"], 0),
    ("ps.server", ["--workers", "0"], 2),
    ("ps.shards.server", ["--help"], 0),
    ("ps.shards.server", ["--threads", "0"], 2),
    ("worker.cli", ["--help"], 0),
    ("worker.cli", ["--server", "127.0.0.1:99999"], 2),
    ("deploy.cli", ["--help"], 0),
    ("deploy.cli", ["run", "--help"], 0),
    ("benchmarks.hetero", ["--help"], 0),
    ("benchmarks.tta", ["--help"], 0),
    ("benchmarks.simulate", ["--help"], 0),
]


@pytest.mark.parametrize(("module", "args", "status"), DOORS, ids=[f"{m} {' '.join(a)}" for m, a, _ in DOORS])
def test_help_and_bad_arguments_load_no_torch(module: str, args: list[str], status: int) -> None:
    result = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    lines = result.stdout.strip().splitlines()
    assert lines[-2:] == [f"exit {status}", "torch not loaded"], result.stdout[-2000:] + result.stderr[-2000:]


def test_a_launcher_refuses_a_server_flag_before_torch_loads(tmp_path: Path) -> None:
    """ps-cluster run checks the flags it passes ps-server with ps-server's own parser and checks
    (ps/flag_checks.py), which load no model, data or transport."""
    result = subprocess.run([sys.executable, "-c", PROBE, "deploy.cli", "run", "--out", str(tmp_path), "--mode", "asp",
                             "--server-arg=--adaptive-batch=gns"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-2:] == ["exit 2", "torch not loaded"], result.stdout + result.stderr
    assert "ps-server would refuse these arguments: --adaptive-batch gns is for --mode bsp" in result.stderr
