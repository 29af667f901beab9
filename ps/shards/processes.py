"""`ps-server --shards N` on one host: start N-1 `ps-shard` processes on loopback and stop them again.

Each child is started with `--parent-pid`, so it is stopped by the kernel if the server dies
without cleaning up (see ps.shards.shard_run.exit_with_parent): no shard outlives its coordinator.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from common.ops import address
from ps.shards.control_key import SHARD_KEY_ENV, SHARD_KEY_FILE_ENV, new_shard_key

START_TIMEOUT_S = 60.0


class LocalShards:
    """N shard servers started as child processes; `addresses` once they listen."""

    def __init__(self, count: int, host: str = "127.0.0.1", token: str | None = None, *, shard_key: str | None = None,
                 tls_flags: Sequence[str] = ()) -> None:
        """`shard_key`: the coordinator's key for their control calls (default: a fresh one, `self.shard_key`);
        `tls_flags`: ps-shard's --tls-cert/--tls-key/--tls-client-ca, as the coordinator serves."""
        if count < 1:
            raise ValueError(f"need at least one shard process, got {count}")
        # the shards' port files, read once they listen: the folder goes at once, so a server that
        # is killed later leaves nothing behind
        ports_dir = tempfile.TemporaryDirectory(prefix="ps-shards-")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addresses: list[str] = []
        env = dict(os.environ)
        if token is not None:
            env["PS_TOKEN"] = token  # not on the command line, where `ps` would show it
        self.shard_key = shard_key or new_shard_key()
        env[SHARD_KEY_ENV] = self.shard_key
        env.pop(SHARD_KEY_FILE_ENV, None)
        connect_host = "127.0.0.1" if host in address.WILDCARD_HOSTS else host
        try:
            port_files = []
            for i in range(count):
                port_file = Path(ports_dir.name) / f"shard{i + 1}.port"
                port_files.append(port_file)
                argv = [sys.executable, "-m", "ps.shards.server", "--host", host, "--port", "0", "--port-file", str(port_file),
                        "--parent-pid", str(os.getpid()), *tls_flags]
                # a session of its own: a Ctrl-C at the terminal reaches the server, which still needs
                # its shards for the final checkpoint, and not the shards themselves
                self.procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True))
            for port_file, proc in zip(port_files, self.procs, strict=True):
                self.addresses.append(address.join(connect_host, self._wait_port(port_file, proc)))
        except BaseException:
            self.stop()
            raise
        finally:
            ports_dir.cleanup()

    @staticmethod
    def _wait_port(port_file: Path, proc: subprocess.Popen[bytes]) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                return int(port_file.read_text())
            if proc.poll() is not None:
                raise OSError(f"shard server exited with status {proc.returncode} before it listened")
            time.sleep(0.02)
        raise OSError(f"shard server did not listen within {START_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        """SIGTERM every shard, SIGKILL any still running 5 s later."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
