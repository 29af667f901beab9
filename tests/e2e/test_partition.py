"""A network partition, with real processes: a worker in its own network namespace loses its link.

The worker sits behind a veth pair in a namespace of its own; the test takes the link down (packets
are dropped, no connection is reset: a partition, not a crash), then brings it back. The server must
evict the unreachable worker and go on; the worker must notice on its own, and rejoin once the link
is back. Needs root and `ip netns` (skipped otherwise).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import start_server
from tests.fault_jobs import JOB, TARGET, WORKER, status, wait_for

PREFIX = "pspart"  # the namespaces this test makes: pspart<pid>, with the host side of the link vhp<pid>


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _clear_leftovers() -> None:
    """Delete the namespaces and links of earlier runs whose process is gone (a run killed before its
    fixture could clean up leaves a link holding its address, and the next run's packets go there)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        pid = name.removeprefix(PREFIX)
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "link", "del", f"vhp{pid}"], capture_output=True, timeout=10, check=False)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10, check=False)


def _free_subnet() -> tuple[str, str]:
    """(host, worker) addresses of a 10.231.x.0/30 that no interface on this host holds."""
    held = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10, check=False).stdout
    for third in range(os.getpid() % 200, os.getpid() % 200 + 250):
        net = f"10.231.{third % 250}"
        if f" {net}." not in held:
            return f"{net}.1", f"{net}.2"
    pytest.skip("no free 10.231.x.0/30 for the test's link")


@pytest.fixture
def namespace() -> Iterator[tuple[str, str, str]]:
    """(namespace, host-side link, host-side address) joined to this host by a veth pair."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns)")
    _clear_leftovers()
    host_ip, worker_ip = _free_subnet()
    ns, host_link, ns_link = f"{PREFIX}{os.getpid()}", f"vhp{os.getpid()}", f"vwp{os.getpid()}"
    try:
        _ip("netns", "add", ns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces are not available: {exc.stderr.decode().strip()}")
    try:
        try:
            _ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
            _ip("link", "set", ns_link, "netns", ns)
            _ip("addr", "add", f"{host_ip}/30", "dev", host_link)
            _ip("link", "set", host_link, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{worker_ip}/30", "dev", ns_link)
            _ip("netns", "exec", ns, "ip", "link", "set", ns_link, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot build the veth link: {exc.stderr.decode().strip()}")
        yield ns, host_link, host_ip
    finally:
        subprocess.run(["ip", "link", "del", host_link], capture_output=True, timeout=10, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)


def test_partitioned_worker_is_evicted_and_rejoins_when_the_link_returns(tmp_path: Path, namespace: tuple[str, str, str]) -> None:
    ns, host_link, host_ip = namespace
    # enough epochs that the job cannot end before the worker is back: the rejoin comes ~6 s after
    # the link, and with 8 epochs the three others were then within a step or two of the end
    cluster = start_server(tmp_path, [*JOB, "--epochs", "16", "--host", "0.0.0.0", "--insecure"])
    try:
        for name in ("w0", "w1", "w2"):
            cluster.start_worker(name, *WORKER)
        remote = cluster.start_worker("w3", *WORKER, prefix=("ip", "netns", "exec", ns),
                                      target=f"{host_ip}:{cluster.port}")
        wait_for(lambda: status(cluster.target)["epoch"] >= 1, 120, "epoch 1")
        cut_at = time.monotonic()
        _ip("link", "set", host_link, "down")
        evicted = wait_for(lambda: "w3" not in status(cluster.target)["workers"], 30, "eviction of the cut-off worker")
        r = status(cluster.target)["round"]
        wait_for(lambda: status(cluster.target)["round"] > r, 30, "progress without w3")
        stall = time.monotonic() - cut_at
        time.sleep(5)  # a partition of ~10 s in all
        _ip("link", "set", host_link, "up")
        restored_at = time.monotonic()
        rejoin = wait_for(lambda: "w3" in status(cluster.target)["workers"], 60, "w3 to rejoin after the link came back")
        assert cluster.wait(300) == 0, cluster.server_log()
        assert remote.wait(30) == 0, cluster.worker_log("w3")
        (summary,) = cluster.events("summary")
        assert summary["accuracy"] >= TARGET, summary
        print("FAULT " + str({"fault": "network partition of one worker (~10 s)", "detected_s": round(evicted, 2),
                              "stall_s": round(stall, 2), "rejoined_after_link_up_s": round(rejoin, 2),
                              "link_up_at_s": round(restored_at - cut_at, 2), "accuracy": summary["accuracy"]}), flush=True)
    finally:
        cluster.stop()
