"""`--port-file`: where a server tells scripts the port it bound (with `--port 0`).

Checked at start, before anything listens: a file that cannot be written is bad input, not an
error after the server is up with workers already joining. Written atomically (a temporary file
in the same folder, then a rename), so a script polling for it never reads it half written.
"""

from __future__ import annotations

import os
from pathlib import Path


class PortFile:
    """The `--port-file` of one server process."""

    def __init__(self, path: Path, flag: str = "--port-file") -> None:
        """OSError naming the flag and path unless a file can be written in its folder (and it is no folder)."""
        self.path = path
        if path.is_dir():
            raise OSError(f"{flag} {path} is a directory")
        probe = self._temporary()
        try:
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise OSError(f"{flag} {path} cannot be written: {exc.strerror or exc}") from None

    def _temporary(self) -> Path:
        return self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")

    def write(self, port: int) -> None:
        """Replace the file with the port number, at once for any reader."""
        temporary = self._temporary()
        temporary.write_text(str(port))
        os.replace(temporary, self.path)
