"""ps-worker settings from environment variables (containers, Kubernetes): a flag wins over its variable."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import ENV, start_server
from worker import flags as cli
from worker.env_flags import parse_with_environment


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in cli.ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)


def test_every_setting_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "PS_SERVER": "ps-server:50051", "PS_NAME": "w3", "PS_CORES": "0.125", "PS_THREADS": "2",
        "PS_DEVICE": "cpu", "PS_SLOWDOWN": "1.5", "PS_STEP_OVERHEAD_MS": "20", "PS_TIMEOUT": "30", "PS_RETRY_FOR": "0",
        "PS_LOG_EVERY": "2", "PS_QUIET": "true", "PS_TLS_CA": "/ca.pem", "PS_TLS_CERT": "/c.pem",
        "PS_TLS_KEY": "/k.pem", "PS_MAX_BATCH": "24", "PS_NO_OVERLAP": "1", "PS_LOADER_WORKERS": "2",
        "PS_PREFETCH": "3", "PS_ALLOW_IMPORT": "mypkg, other.models", "PS_ALLOW_SHARD_HOST": "10.0.0.7",
        "PS_EARLY_END_STATUS": "0",
    }
    assert set(values) == set(cli.ENVIRONMENT.values())
    for variable, value in values.items():
        monkeypatch.setenv(variable, value)
    args = cli.parse_args([])
    assert (args.server, args.name, args.cores, args.threads, args.device) == ("ps-server:50051", "w3", 0.125, 2, "cpu")
    assert (args.slowdown, args.timeout, args.retry_for, args.log_every, args.quiet) == (1.5, 30.0, 0.0, 2.0, True)
    assert args.step_overhead_ms == 20.0 and args.max_batch == 24 and args.no_overlap
    assert (args.loader_workers, args.prefetch) == (2, 3)
    assert (args.tls_ca, args.tls_cert, args.tls_key) == ("/ca.pem", "/c.pem", "/k.pem")
    assert args.allow_import == ["mypkg", "other.models"] and args.allow_shard_host == ["10.0.0.7"]
    assert args.early_end_status == 0


def test_repeated_flags_win_over_their_list_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PS_ALLOW_IMPORT", "from_env")
    args = cli.parse_args(["--server", "h:1", "--allow-import", "a", "--allow-import", "b.c"])
    assert args.allow_import == ["a", "b.c"] and args.allow_shard_host is None


def test_flags_win_and_unset_variables_keep_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PS_SERVER", "elsewhere:1")
    monkeypatch.setenv("PS_CORES", "not a number")  # the flag wins, so its variable is not even read
    monkeypatch.setenv("PS_NAME", "   ")  # blank counts as unset
    args = cli.parse_args(["--server", "127.0.0.1:50051", "--cores", "2"])
    assert (args.server, args.cores, args.name, args.threads, args.timeout, args.quiet) == (
        "127.0.0.1:50051", 2.0, None, 1, 60.0, False,
    )


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({}, "the following arguments are required: --server (or set PS_SERVER)"),
        ({"PS_SERVER": "no-port"}, "PS_SERVER='no-port': expected HOST:PORT with a port in 1-65535"),
        ({"PS_SERVER": "h:1", "PS_THREADS": "0"}, "PS_THREADS='0': expected a whole number > 0"),
        ({"PS_SERVER": "h:1", "PS_TIMEOUT": "nan"}, "PS_TIMEOUT='nan': expected a finite number"),
        ({"PS_SERVER": "h:1", "PS_SLOWDOWN": "0.5"}, "PS_SLOWDOWN='0.5': expected a number >= 1"),
        ({"PS_SERVER": "h:1", "PS_QUIET": "maybe"}, "PS_QUIET='maybe': expected one of 0, 1, false"),
    ],
)
def test_bad_or_missing_values_are_usage_errors_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variables: dict[str, str], message: str
) -> None:
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as info:
        cli.parse_args([])
    assert info.value.code == 2
    assert f"ps-worker: error: {message}" in capsys.readouterr().err


def test_choices_are_checked_and_unknown_options_refused() -> None:
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--mode", choices=["bsp", "asp"], default="bsp")
    assert parse_with_environment(parser, [], {"mode": "P_MODE"}, {"P_MODE": "asp"}).mode == "asp"
    with pytest.raises(SystemExit):
        parse_with_environment(parser, [], {"mode": "P_MODE"}, {"P_MODE": "ssp"})
    with pytest.raises(ValueError, match="no such option"):
        parse_with_environment(parser, [], {"nope": "P_NOPE"}, {})


def test_help_lists_the_variables(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside a flag's name
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for dest, variable in cli.ENVIRONMENT.items():
        assert f"{variable} (--{dest.replace('_', '-')})" in out


def run_worker_from_environment(tmp_path: Path, **variables: str) -> str:
    """One epoch of a one-worker job whose worker has no flags at all; the worker's output."""
    cluster = start_server(tmp_path, ["--workers", "1", "--dataset", "digits", "--model-arg", "hidden=16",
                                      "--global-batch", "64", "--epochs", "1", "--quiet"])
    try:
        env = {k: v for k, v in ENV.items() if k not in cli.ENVIRONMENT.values()}
        env |= {"PS_SERVER": cluster.target, "PYTHONWARNINGS": "default", **variables}
        log = tmp_path / "worker.log"
        with log.open("w") as out:
            worker = subprocess.run([sys.executable, "-m", "worker.cli"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=120, cwd=os.getcwd())
        assert worker.returncode == 0, log.read_text()
        assert cluster.wait(60) == 0, cluster.server_log()
        (join,) = cluster.events("adjust")[:1]
        assert list(join["batch_sizes"]) == [variables.get("PS_NAME")]
        return log.read_text()
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_worker_configured_only_by_its_environment_trains(tmp_path: Path) -> None:
    output = run_worker_from_environment(tmp_path, PS_NAME="from-env", PS_CORES="0.5", PS_QUIET="1")
    assert output == ""  # PS_QUIET: no progress lines


@pytest.mark.slow
def test_progress_lines_without_warnings(tmp_path: Path) -> None:
    output = run_worker_from_environment(tmp_path, PS_NAME="chatty", PS_LOG_EVERY="0.001")
    assert "chatty: epoch 0 step" in output and " loss " in output
    assert "Warning" not in output  # float() of a loss that requires grad warned on every progress line
