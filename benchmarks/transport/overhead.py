"""The server's per-step overhead for a small model: in this process (the real servicer and coordinator
driven as gRPC drives them) and from the outside (client threads against ps-server, minus the echo)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from benchmarks.transport.job import server_argv
from benchmarks.transport.processes import Processes, echo_argv, server_processes
from benchmarks.transport.stats import stats


class _Context:
    """Stands in for grpc.aio.ServicerContext: the servicer only calls abort()."""

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def _timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    return wrapper


def _marked(chunks: Sequence[bytes], mark: dict[str, float]) -> Iterator[bytes]:
    """Yield the chunks, then note the time in mark["sent"] (gRPC asks for the next one once the last is written)."""
    yield from chunks
    mark["sent"] = time.perf_counter()


def _push_chunks(meta: Any, payload: Sequence[bytes], mark: dict[str, float]) -> Iterator[bytes]:
    """A push as PSClient sends it: serialized chunks, the header (`meta`, a PushMeta) on the first;
    mark["sent"] after the last."""
    from common.transport.chunk_frames import push_frame

    frame = push_frame(meta)
    for seq, data in enumerate(payload):
        yield b"".join((frame(seq, len(data)), data))
    mark["sent"] = time.perf_counter()


async def _apush_chunks(meta: Any, payload: Sequence[bytes], mark: dict[str, float] | None) -> Any:
    """The same as an async request stream, each chunk parsed from its bytes as the server's request
    deserializer does (ps.serving.handlers); with `mark`, notes when the stream has ended."""
    from protos import ps_pb2
    from common.transport.chunk_frames import push_frame
    from common.transport.serialized import data_view_parser

    parse = data_view_parser(ps_pb2.PushChunk)
    frame = push_frame(meta)
    for seq, data in enumerate(payload):
        yield parse(b"".join((frame(seq, len(data)), data)))
    if mark is not None:
        mark["sent"] = time.perf_counter()


async def _serialize_all(replies: Any, serialize_s: list[float], done: list[float]) -> None:
    """Drain a servicer's reply stream, serializing each message as gRPC would; note when it is all out."""
    async for message in replies:
        t0 = time.perf_counter()
        if not isinstance(message, bytes):  # bytes: a reply chunk serialized once for every worker
            message.SerializeToString()
        serialize_s[0] += time.perf_counter() - t0
    done.append(time.perf_counter())


def measure_overhead_inprocess(numel: int, workers: int, iterations: int, warmup: int) -> dict[str, Any]:
    """The real servicer and coordinator in this process, driven the way gRPC drives them.

    Per step, `workers - 1` pushes go in first and wait for the round; then the last push's chunks are
    fed and the clock starts when its request stream ends (the last push has arrived). It stops when
    every worker's reply messages have been produced by ``ParameterServerServicer.Push`` and
    serialized as gRPC's response serializer does before writing them (``SerializeToString``; a chunk the
    servicer already serialized, bytes, passes through as it is). This is the Python
    work between the last push arriving and the replies leaving: payload check, accumulate, optimizer
    step (begun when the round closes and applied a piece at a time as the first reply streams),
    epoch bookkeeping, encoding the parameters once, building and serializing the replies.
    gRPC's own socket writes are not in it (``measure_overhead_outside`` has those).
    """
    from common.transport.messages import JoinAsk, PushMeta, PushTimes
    from common.transport.proto_convert import join_ask_to_proto
    from ps.server_job import build_job
    from ps.serving.server_options import run_loop
    from ps.server_flags import build_parser
    from ps.servicer import ParameterServerServicer
    from common.transport.wire import CHUNK_BYTES, encode, split

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as ps-server --threads 1
    args = build_parser().parse_args([*server_argv(numel, workers, "float32"), "--port", "0"])
    job = build_job(args)
    core = job.coordinator
    # components, timed by wrapping the instance's methods (the server's code is not touched); a method
    # that a later version renames just leaves its component null
    close_round: list[float] = []
    encode_times: list[float] = []
    finish_times: list[float] = []
    wrapped = {"begin_push": hasattr(core, "begin_push"),
               "round_close.close": hasattr(getattr(core, "round_close", None), "close"),
               "replies.current_payload": hasattr(getattr(core, "replies", None), "current_payload")}
    if wrapped["round_close.close"]:
        core.round_close.close = _timed(core.round_close.close, close_round)  # type: ignore[method-assign]
    if wrapped["replies.current_payload"]:
        core.replies.current_payload = _timed(core.replies.current_payload, encode_times)  # type: ignore[method-assign]
    if wrapped["begin_push"]:
        begin_push = core.begin_push

        def timed_begin_push(meta: Any) -> Any:
            receiver = begin_push(meta)
            receiver.finish = _timed(receiver.finish, finish_times)  # type: ignore[method-assign]
            return receiver

        core.begin_push = timed_begin_push  # type: ignore[method-assign]
    servicer = ParameterServerServicer(core)
    ctx = _Context()
    grads = [split(encode(torch.randn(numel).mul_(1e-3)), CHUNK_BYTES) for _ in range(workers)]
    totals: list[float] = []
    serialize: list[float] = []
    close_per_step: list[float] = []
    encode_per_step: list[float] = []
    finish_last: list[float] = []

    async def run() -> None:
        joins = await asyncio.gather(*(servicer.Join(join_ask_to_proto(JoinAsk(f"w{k}", 1.0)), ctx)
                                       for k in range(workers)))
        ids = [j.worker_id for j in joins]
        secrets = [j.secret for j in joins]
        for worker_id, secret in zip(ids, secrets, strict=True):  # a worker's first Pull, before its first push
            core.pull(worker_id, secret, header_only=True)
        batch = [j.batch_size for j in joins]
        round_ = joins[0].round

        def push(k: int, mark: dict[str, float] | None, round_: int, ser: list[float], done: list[float]) -> Any:
            meta = PushMeta(ids[k], round_, 0, batch[k], PushTimes(1.0), "float32", numel, secret=secrets[k])
            return _serialize_all(servicer.Push(_apush_chunks(meta, grads[k], mark), ctx), ser, done)

        for step in range(warmup + iterations):
            marks: dict[str, float] = {}
            done: list[float] = []
            ser = [0.0]
            before = sum(w.updates for w in core.status().workers)
            first = [asyncio.create_task(push(k, None, round_, ser, done)) for k in range(workers - 1)]
            while sum(w.updates for w in core.status().workers) < before + workers - 1:
                await asyncio.sleep(0)
            for _ in range(10):  # let the early pushes settle on the round future
                await asyncio.sleep(0)
            n_close, n_encode = len(close_round), len(encode_times)
            await asyncio.gather(*first, asyncio.create_task(push(workers - 1, marks, round_, ser, done)))
            if step >= warmup:
                totals.append(max(done) - marks["sent"])
                serialize.append(ser[0])
                close_per_step.append(sum(close_round[n_close:]))
                encode_per_step.append(sum(encode_times[n_encode:]))
                finish_last.append(finish_times[-1] if finish_times else 0.0)
            round_ += 1

    def component(values: list[float], method: str) -> float | None:
        return round(1e3 * statistics.median(values), 3) if wrapped[method] and values else None

    try:
        run_loop(run())
    finally:
        job.evaluator.close()
        job.metrics.close()
        torch.set_num_threads(threads)
    return {
        "method": "in-process: the real ParameterServerServicer.Push + Coordinator, fed PushChunk streams on an "
                  "asyncio (uvloop) loop; from the end of the last push's request stream to all replies "
                  "produced and serialized (SerializeToString, or bytes serialized by the servicer); gRPC socket I/O excluded",
        "numel": numel, "workers": workers, "wire_dtype": "float32", "iterations": len(totals),
        **stats(totals),
        "components_median_ms": {
            "last_push_finish": component(finish_last, "begin_push"),
            "close_round": component(close_per_step, "round_close.close"),
            "payload_encode": component(encode_per_step, "replies.current_payload"),
            "reply_serialize_all_workers": round(1e3 * statistics.median(serialize), 3),
        },
        "components_note": "last_push_finish: ChunkReceiver.finish of the last push (length check; NaN/Inf was "
                           "checked chunk by chunk as they arrived); "
                           "close_round: RoundClose.close (accumulate result, begin the optimizer step, bookkeeping; "
                           "the step itself runs a piece at a time as the first reply streams, common.params.store); "
                           "payload_encode: StepReplies.current_payload (the version's lazily framed chunks, common.transport.payload; "
                           "the framing happens as the replies are produced, inside the total); "
                           "reply_serialize_all_workers: SerializeToString of every reply message not already serialized",
    }


def measure_overhead_outside(procs: Processes, numel: int, workers: int, iterations: int, warmup: int) -> dict[str, Any]:
    """From the outside: `workers` client threads in this process, one channel each, released by a barrier
    to push at the same instant. Per step, the gap from the last push fully sent to the last worker's
    first reply chunk, on a real ps-server, minus the same gap on the echo server (store-and-forward,
    same bytes, same threads); medians of each. Noisy: client threads share this process and the CPUs."""
    import grpc

    from benchmarks.echo import STREAM_METHOD
    from protos import ps_pb2, ps_pb2_grpc
    from common.transport.messages import JoinAsk, LeaveAsk, PullAsk, PushMeta, PushTimes
    from common.transport.proto_convert import join_ask_to_proto, leave_to_proto, pull_ask_to_proto
    from common.transport.wire import CHUNK_BYTES, FlatReceiver, encode, split
    from worker.transport.channel import CHANNEL_OPTIONS

    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    push_method = f"/{ps_pb2.DESCRIPTOR.services_by_name['ParameterServer'].full_name}/Push"
    grads = [split(encode(torch.randn(numel).mul_(1e-3)), CHUNK_BYTES) for _ in range(workers)]

    def run_threads(body: Callable[[int, threading.Barrier, list[dict[str, float]]], None]) -> list[float]:
        barrier = threading.Barrier(workers)
        marks: list[list[dict[str, float]]] = [[] for _ in range(workers)]
        errors: list[BaseException] = []

        def target(k: int) -> None:
            try:
                body(k, barrier, marks[k])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=target, args=(k,), daemon=True) for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        if any(t.is_alive() for t in threads):
            raise RuntimeError("overhead measurement: a client thread did not finish within 600 s")
        if errors:
            raise RuntimeError(f"overhead measurement failed: {errors[0]!r}") from errors[0]
        gaps = []
        for step in range(warmup, warmup + iterations):
            sent = max(marks[k][step]["sent"] for k in range(workers))
            first = max(marks[k][step]["first"] for k in range(workers))
            gaps.append(first - sent)
        return gaps

    argv = [sys.executable, "-m", "ps.server", *server_argv(numel, workers, "float32")]
    with server_processes(procs, [("ps-server-overhead", argv),
                                  ("echo-overhead", echo_argv())]) as (ps_target, echo_target):
        def ps_body(k: int, barrier: threading.Barrier, marks: list[dict[str, float]]) -> None:
            channel = grpc.insecure_channel(ps_target, options=options)
            try:
                stub = ps_pb2_grpc.ParameterServerStub(channel)
                push = channel.stream_stream(push_method, response_deserializer=ps_pb2.ParamsChunk.FromString)  # chunks as bytes
                joined = stub.Join(join_ask_to_proto(JoinAsk(f"w{k}", 1.0)), wait_for_ready=True, timeout=120)
                list(stub.Pull(pull_ask_to_proto(PullAsk(joined.worker_id, joined.secret, header_only=True)),
                               timeout=120))  # a worker's first Pull, before its first push
                out = torch.empty(numel)
                round_, batch = joined.round, joined.batch_size
                for _ in range(warmup + iterations):
                    mark: dict[str, float] = {}
                    meta = PushMeta(joined.worker_id, round_, 0, batch, PushTimes(1.0), "float32", numel,
                                    secret=joined.secret)

                    barrier.wait(60)
                    receiver = None
                    for message in push(_push_chunks(meta, grads[k], mark)):
                        if receiver is None:
                            mark["first"] = time.perf_counter()
                            receiver = FlatReceiver(out, message.header.num_values, message.header.wire_dtype)
                            round_, batch = message.header.round, message.header.batch_size
                        receiver.feed(message.seq, message.data)
                    marks.append(mark)
                stub.Leave(leave_to_proto(LeaveAsk(joined.worker_id, joined.secret)))
            finally:
                channel.close()

        def echo_body(k: int, barrier: threading.Barrier, marks: list[dict[str, float]]) -> None:
            channel = grpc.insecure_channel(echo_target, options=options)
            stream = channel.stream_stream(STREAM_METHOD)
            try:
                for _ in range(warmup + iterations):
                    mark: dict[str, float] = {}

                    barrier.wait(60)
                    for i, _chunk in enumerate(stream(_marked(grads[k], mark))):
                        if i == 0:
                            mark["first"] = time.perf_counter()
                    marks.append(mark)
            finally:
                channel.close()

        ps_gaps = run_threads(ps_body)
        echo_gaps = run_threads(echo_body)

    ps_stats, echo_stats = stats(ps_gaps), stats(echo_gaps)
    return {
        "method": "outside: 4 client threads (one channel each) released by a barrier; per step the gap from the "
                  "last push fully sent to the last worker's first reply chunk, ps-server minus the echo server "
                  "(median_ms and p90_ms are differences of the two servers' percentiles, so p90 may be under the median)",
        "numel": numel, "workers": workers, "iterations": iterations,
        "median_ms": round(ps_stats["median_ms"] - echo_stats["median_ms"], 3),
        "p90_ms": round(ps_stats["p90_ms"] - echo_stats["p90_ms"], 3),
        "ps_gap": ps_stats, "echo_gap": echo_stats,
    }
