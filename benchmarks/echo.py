"""A raw gRPC echo service: the ceiling for the parameter server's transport.

No .proto and no generated code: the methods are registered with ``grpc.method_handlers_generic_handler``
and move plain ``bytes`` (no serializer), so what is measured is gRPC itself, with the same server stack
(``grpc.aio`` on uvloop when installed: ``ps.serving.server_options.run_loop``) and the same channel options as ``ps-server``
(``ps.serving.server_options.GRPC_OPTIONS``, ``worker.transport.channel.CHANNEL_OPTIONS``: 8 MiB messages each way).

- ``/bench.Echo/Stream`` (stream-stream): the client streams the payload up in chunks; once the last
  chunk is in, the server streams the same chunks back (store and forward, as a push is received
  whole before its reply leaves: this is the pattern of one parameter-server step, not a pipelined echo).
- ``/bench.Echo/Unary``: one message up, the same message back (only fits payloads under 8 MiB).

``python -m benchmarks.echo --port 0 --port-file PATH`` serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from common.ops.memory import tune_malloc
from ps.serving.server_options import GRPC_OPTIONS, run_loop, wait_for_stop_signal

SERVICE = "bench.Echo"
STREAM_METHOD = f"/{SERVICE}/Stream"
UNARY_METHOD = f"/{SERVICE}/Unary"


async def _stream(request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    received = [chunk async for chunk in request_iterator]
    for chunk in received:
        yield chunk


async def _unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


def handler() -> grpc.GenericRpcHandler:
    """The echo methods; request and response stay raw bytes (no (de)serializer)."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Stream": grpc.stream_stream_rpc_method_handler(_stream),
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
        },
    )


async def serve(host: str, port: int, port_file: Path | None, options: Sequence[tuple[str, Any]]) -> None:
    server = grpc.aio.server(options=list(options))
    server.add_generic_rpc_handlers((handler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    print(f"echo: listening on {host}:{bound}", flush=True)
    if port_file is not None:
        port_file.write_text(str(bound))
    await wait_for_stop_signal()
    await server.stop(grace=None)


class EchoClient:
    """Blocking client for the echo service on one channel with the worker's channel options."""

    def __init__(self, target: str) -> None:
        from worker.transport.channel import CHANNEL_OPTIONS

        self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stream = self.channel.stream_stream(STREAM_METHOD)
        self._unary = self.channel.unary_unary(UNARY_METHOD)

    def wait_ready(self, timeout: float) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def stream(self, chunks: Sequence[bytes], marks: dict[str, float] | None = None) -> int:
        """Stream `chunks` up and receive them back; returns the bytes received.

        With `marks`, records perf_counter times: ``sent`` (the last chunk was handed to gRPC) and
        ``first`` (the first reply chunk arrived).
        """

        def requests() -> Iterator[bytes]:
            yield from chunks
            if marks is not None:
                marks["sent"] = time.perf_counter()

        received = 0
        for i, chunk in enumerate(self._stream(requests())):
            if i == 0 and marks is not None:
                marks["first"] = time.perf_counter()
            received += len(chunk)
        return received

    def unary(self, payload: bytes) -> int:
        return len(self._unary(payload))

    def close(self) -> None:
        self.channel.close()


def rpc_echo(tensor: Any) -> Any:
    """The torch RPC callee of the transport benchmark: return the tensor it was sent (it travels back whole)."""
    return tensor


def main(argv: Sequence[str] | None = None) -> int:
    tune_malloc()  # as ps-server does: the ceiling gets the same allocator settings
    p = argparse.ArgumentParser(prog="python -m benchmarks.echo", description="Serve the raw gRPC echo service.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--port-file", type=Path, default=None, help="write the bound port here")
    p.add_argument("--options-json", default=None,
                   help="server options as a JSON list of [name, value] pairs; default ps-server's (GRPC_OPTIONS)")
    args = p.parse_args(argv)
    options = GRPC_OPTIONS if args.options_json is None else [tuple(pair) for pair in json.loads(args.options_json)]
    try:
        run_loop(serve(args.host, args.port, args.port_file, options))
    except OSError as exc:
        print(f"echo: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
