"""The error every worker call raises when the server refuses it or cannot be reached: one type, so the
session's recovery reads a status name and never a gRPC exception."""

from __future__ import annotations

import grpc


class ServerError(RuntimeError):
    """The server refused a call or could not be reached; `code` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def server_error(exc: grpc.RpcError) -> ServerError:
    """A failed RPC as a ServerError (its status code's name and details)."""
    return ServerError(exc.code().name, exc.details() or "")
