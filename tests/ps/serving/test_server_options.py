"""The connections a server holds at once: its open-file limit, raised to the hard limit, less the
descriptors it keeps for its own files (ps/serving/server_options.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from ps.serving.server_options import FILE_RESERVE, MAX_GRPC_INT, MIN_CONNECTIONS, connection_cap
from tests.processes import ENV
from tests.repo import ROOT


@pytest.mark.parametrize(("limit", "cap"), [(1024, 1024 - FILE_RESERVE), (FILE_RESERVE, MIN_CONNECTIONS),
                                            (1 << 40, MAX_GRPC_INT)], ids=["common-default", "tiny", "huge"])
def test_the_connection_cap_leaves_the_reserve_and_fits_grpcs_integer(limit: int, cap: int) -> None:
    assert connection_cap(limit) == cap


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_servers_options_raise_its_soft_file_limit_to_the_hard_one_and_cap_connections_under_it() -> None:
    """A process started at 256 open files (hard 2,048): the options it serves with hold 2,048 less
    the reserve, and the process may open 2,048 files from then on."""
    code = ("import resource; from ps.serving.server_options import serving_options; "
            "options = dict(serving_options()); "
            "print(options['grpc.max_allowed_incoming_connections'], resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run(["prlimit", "--nofile=256:2048", sys.executable, "-c", code], capture_output=True, text=True,
                         env=ENV, cwd=ROOT, timeout=60, check=True).stdout.split()
    assert out == [str(2048 - FILE_RESERVE), "2048"]

