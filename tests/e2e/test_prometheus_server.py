"""A real Prometheus server scrapes a real training run's /metrics and answers PromQL over its HTTP API,
and with the server's token in its scrape configuration reads a server whose token guards /metrics.

Marked `prometheus`, which the default `python -m pytest -q` deselects: run it with
`python -m pytest -q -m prometheus`. It needs the `prometheus` binary (Debian's package, which
deploy/prometheus.sh installs when missing, as root); it is skipped, saying why, only where that
cannot be installed.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.processes import start_server
from tests.repo import ROOT

pytestmark = pytest.mark.prometheus

INSTALL = ROOT / "deploy" / "prometheus.sh"
JOB = ["--quiet", "--workers", "2", "--model-arg", "hidden=16", "--global-batch", "64", "--epochs", "1000"]
WORKER = ("--slowdown", "10", "--retry-for", "0")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    """The `prometheus` binary, installed by deploy/prometheus.sh if missing; skip (with its reason) if it cannot be."""
    found = shutil.which("prometheus")
    if found is None:
        install = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=900)
        found = shutil.which("prometheus")
        if found is None:
            lines = (install.stderr or install.stdout).strip().splitlines()
            pytest.skip(f"prometheus cannot be installed here: {lines[-1] if lines else f'exit {install.returncode}'}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with OPENER.open(url, timeout=10) as reply:
            return reply.status, reply.read()
    except OSError:  # not listening yet, or 503 while it starts
        return 0, b""


@pytest.fixture
def prometheus(tmp_path: Path, prometheus_binary: str) -> Iterator[Callable[[str], str]]:
    """`prometheus(target)` starts a Prometheus server on loopback that scrapes http://target/metrics
    every second (`credentials`: with `Authorization: Bearer CREDENTIALS`), waits until it is ready and
    returns its base URL; it is stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(target: str, credentials: str | None = None) -> str:
        port, n = free_port(), len(started)
        config = tmp_path / f"prometheus-{n}.yml"
        authorization = f"    authorization:\n      credentials: {credentials}\n" if credentials else ""
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: hetero_ps\n{authorization}    static_configs:\n"
            f"      - targets: ['{target}']\n")
        log = tmp_path / f"prometheus-{n}.log"
        with open(log, "w") as out:
            started.append(subprocess.Popen(
                [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / f'tsdb-{n}'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while get(f"{base}/-/ready")[0] != 200:
            assert started[-1].poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        return base

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query(base: str, promql: str) -> list[dict]:
    """The instant vector Prometheus answers for `promql` (its HTTP API)."""
    status, body = get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert status == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def positive(base: str, promql: str, timeout: float = 90.0) -> list[dict]:
    """Query until every series of the answer is > 0 (and there is one); returns the answer."""
    deadline = time.monotonic() + timeout
    while True:
        result = query(base, promql)
        if result and all(float(r["value"][1]) > 0 for r in result):
            return result
        assert time.monotonic() < deadline, f"{promql}: no positive answer within {timeout}s (last: {result})"
        time.sleep(0.5)


def documented_queries() -> list[str]:
    """The expressions of the ```promql block in docs/operations.md (comments dropped)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("```promql\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_prometheus_scrapes_a_run_and_answers_rate_queries(tmp_path: Path, prometheus) -> None:
    metrics_port_file = tmp_path / "metrics.port"
    cluster = start_server(tmp_path, [*JOB, "--metrics-port", "0", "--metrics-port-file", str(metrics_port_file)])
    try:
        base = prometheus(f"127.0.0.1:{int(metrics_port_file.read_text())}")
        cluster.start_worker("a", *WORKER)
        cluster.start_worker("b", *WORKER)

        (steps,) = positive(base, 'rate(hetero_ps_steps_total{job="hetero_ps"}[10s])')
        assert steps["metric"]["instance"].startswith("127.0.0.1:")
        per_worker = positive(base, "sum by (worker) (rate(hetero_ps_worker_samples_total[10s]))")
        assert {r["metric"]["worker"] for r in per_worker} == {"a", "b"}
        positive(base, "sum(rate(hetero_ps_grpc_received_bytes_total[10s]))")
        positive(base, "histogram_quantile(0.9, rate(hetero_ps_round_duration_seconds_bucket[10s]))")
        (up,) = query(base, 'up{job="hetero_ps"}')
        assert up["value"][1] == "1"
        for promql in documented_queries():  # every example of docs/operations.md is valid PromQL here
            query(base, promql)
        cluster.server.send_signal(signal.SIGTERM)
        assert cluster.wait(60) == 0, cluster.server_log()
    finally:
        cluster.stop()


def test_prometheus_with_the_token_scrapes_a_server_that_has_one_and_without_it_does_not(tmp_path: Path, prometheus) -> None:
    """The scrape configuration of docs/operations.md (`authorization: credentials`) reads a server whose
    token guards /metrics; a Prometheus without it sees the target down (401)."""
    token = "scrape-t0ken"
    metrics_port_file = tmp_path / "metrics.port"
    cluster = start_server(tmp_path, [*JOB, "--token", token, "--metrics-port", "0", "--metrics-port-file", str(metrics_port_file)])
    try:
        target = f"127.0.0.1:{int(metrics_port_file.read_text())}"
        with_token, without = prometheus(target, token), prometheus(target)
        (info,) = positive(with_token, 'hetero_ps_job_info{job="hetero_ps"}')
        assert info["metric"]["mode"] == "bsp"
        positive(with_token, 'up{job="hetero_ps"}')
        deadline = time.monotonic() + 60
        while not query(without, 'up{job="hetero_ps"}'):
            assert time.monotonic() < deadline, "the Prometheus without the token never scraped"
            time.sleep(0.5)
        (down,) = query(without, 'up{job="hetero_ps"}')
        assert down["value"][1] == "0" and not query(without, "hetero_ps_job_info")
    finally:
        cluster.stop()
