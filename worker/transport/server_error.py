"""The error every worker call raises when the server refuses it or cannot be reached: one type, so the
session's recovery reads a status name and never a gRPC exception."""

from __future__ import annotations

import grpc

MAX_TOLD = 4000
"""The most characters of a server's own words (an error's details, why the job ended) a worker shows."""


def printable(text: str, limit: int = MAX_TOLD) -> str:
    """`text`, told by a server, as one printable line: each character that is not printable as its
    escape (\\x1b, \\n), cut to `limit` characters. A server's words reach the worker's terminal and
    logs, where an escape sequence would act and a line break could forge a line of the worker's own
    (`ps-worker: error: ...`, `job done`)."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return shown if len(shown) <= limit else f"{shown[: limit - 3]}..."


class ServerError(RuntimeError):
    """The server refused a call or could not be reached; `code` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def server_error(exc: grpc.RpcError) -> ServerError:
    """A failed RPC as a ServerError (its status code's name and details, made `printable`)."""
    return ServerError(exc.code().name, printable(exc.details() or ""))
