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

HOST_IP, WORKER_IP = "10.231.7.1", "10.231.7.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def namespace() -> Iterator[tuple[str, str]]:
    """(namespace, host-side link) joined to this host by a veth pair."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns)")
    ns, host_link, ns_link = f"pspart{os.getpid()}", f"vhp{os.getpid()}", f"vwp{os.getpid()}"
    try:
        _ip("netns", "add", ns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces are not available: {exc.stderr.decode().strip()}")
    try:
        try:
            _ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
            _ip("link", "set", ns_link, "netns", ns)
            _ip("addr", "add", f"{HOST_IP}/30", "dev", host_link)
            _ip("link", "set", host_link, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{WORKER_IP}/30", "dev", ns_link)
            _ip("netns", "exec", ns, "ip", "link", "set", ns_link, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot build the veth link: {exc.stderr.decode().strip()}")
        yield ns, host_link
    finally:
        subprocess.run(["ip", "link", "del", host_link], capture_output=True, timeout=10, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)


def test_partitioned_worker_is_evicted_and_rejoins_when_the_link_returns(tmp_path: Path, namespace: tuple[str, str]) -> None:
    ns, host_link = namespace
    # enough epochs that the job cannot end before the worker is back: the rejoin comes ~6 s after
    # the link, and with 8 epochs the three others were then within a step or two of the end
    cluster = start_server(tmp_path, [*JOB, "--epochs", "16", "--host", "0.0.0.0", "--insecure"])
    try:
        for name in ("w0", "w1", "w2"):
            cluster.start_worker(name, *WORKER)
        remote = cluster.start_worker("w3", *WORKER, prefix=("ip", "netns", "exec", ns),
                                      target=f"{HOST_IP}:{cluster.port}")
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
