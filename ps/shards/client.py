"""The coordinator's side of --shards: its calls to the shard servers (grpc.aio).

Loads each shard's range at start (or resume), commits every BSP round on all shards at once, and
fetches the ranges back when the whole model is needed (evaluation, checkpoints).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import torch

from protos import ps_pb2_grpc
from ps.shards.control_key import key_metadata
from ps.shards.ranges import Range, merge_optimizer_states, slice_optimizer_state
from common.transport.chunk_frames import blob_chunks
from common.transport.messages import ShardAck, ShardCommit, ShardTarget
from common.transport.proto_convert import fetch_request, shard_ack_from_proto, shard_commit_to_proto
from common.transport.security import bearer
from ps.serving import blob
from ps.serving.server_options import GRPC_OPTIONS


class ShardFailure(RuntimeError):
    """A shard server could not be reached or refused a coordinator call: the job cannot go on."""


class RemoteShards:
    """Shard servers 1..N-1; range 0 stays with the coordinator."""

    def __init__(self, addresses: Sequence[str], ranges: Sequence[Range], token: str | None = None,
                 call_timeout_s: float = 120.0, *, shard_key: str,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        """`shard_key`: the coordinator's own key for the control calls (ps.shards.control_key);
        `credentials`: TLS to the shards (None: plaintext)."""
        if len(addresses) != len(ranges) - 1:
            raise ValueError(f"{len(addresses)} shard addresses for {len(ranges)} ranges (range 0 is the coordinator's)")
        self.addresses = list(addresses)
        self.ranges = list(ranges)
        self.numel = ranges[-1][1]
        self._metadata = ((bearer(token),) if token is not None else ()) + (key_metadata(shard_key),)
        self._credentials = credentials
        self._timeout = call_timeout_s
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[ps_pb2_grpc.ParameterShardStub] = []
        self._revoked: list[str] = []  # worker ids gone since the last commit

    @property
    def own(self) -> Range:
        return self.ranges[0]

    def info(self) -> list[ShardTarget]:
        """Every remote range and its server, for the workers' JoinReply."""
        return [ShardTarget(a, start, stop) for a, (start, stop) in zip(self.addresses, self.ranges[1:], strict=True)]

    def _open(self) -> None:
        if not self._stubs:
            if self._credentials is None:
                self._channels = [grpc.aio.insecure_channel(a, options=GRPC_OPTIONS) for a in self.addresses]
            else:
                self._channels = [grpc.aio.secure_channel(a, self._credentials, options=GRPC_OPTIONS) for a in self.addresses]
            self._stubs = [ps_pb2_grpc.ParameterShardStub(c) for c in self._channels]

    async def _each(self, call: Any) -> list[Any]:
        """Run `call(i, stub)` on every shard at once; ShardFailure naming the first that failed."""
        self._open()
        results = await asyncio.gather(*(call(i, s) for i, s in enumerate(self._stubs)), return_exceptions=True)
        for address, result in zip(self.addresses, results, strict=True):
            if isinstance(result, grpc.aio.AioRpcError):
                raise ShardFailure(f"shard {address}: {result.code().name}: {result.details()}")
            if isinstance(result, BaseException):
                raise ShardFailure(f"shard {address}: {result!r}")
        return results

    async def load(self, spec_json: str, params: torch.Tensor, optimizer: dict[str, Any] | None, round_: int,
                   max_workers: int, worker_key: bytes) -> None:
        """Give every shard its range of the full `params` (and `optimizer` state, None: fresh), and the
        key the workers' secrets derive from (ps.serving.worker_keys), so that it can check them."""
        async def one(i: int, stub: ps_pb2_grpc.ParameterShardStub) -> None:
            start, stop = self.ranges[i + 1]
            state = {
                "spec": spec_json, "start": start, "stop": stop, "round": round_, "max_workers": max_workers,
                "worker_key": worker_key.hex(),
                "params": params[start:stop].clone(),
                "optimizer": None if optimizer is None else slice_optimizer_state(optimizer, self.numel, start, stop),
            }
            chunks = list(blob_chunks(blob.pack(state)))
            await stub.Load(iter(chunks), metadata=self._metadata, timeout=self._timeout, wait_for_ready=True)

        await self._each(one)

    def revoke(self, worker_id: str) -> None:
        """`worker_id` left or was evicted: the next commit tells every shard to refuse it."""
        self._revoked.append(worker_id)

    async def commit(self, round_: int, contributors: dict[str, int], lr: float, wait_s: float) -> list[ShardAck]:
        """Close round `round_` on every shard with these contributors' slices (worker id: batch size), and
        revoke the worker ids gone since the last commit."""
        revoked, self._revoked = tuple(self._revoked), []
        request = shard_commit_to_proto(ShardCommit(round_, tuple(contributors.items()), lr, wait_s, revoked))
        acks = await self._each(lambda i, stub: stub.Commit(request, metadata=self._metadata, timeout=wait_s + self._timeout))
        return [shard_ack_from_proto(ack) for ack in acks]

    async def fetch(self, own_params: torch.Tensor, own_optimizer: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The whole model: the coordinator's range and every shard's, and the optimizer state merged."""
        async def one(i: int, stub: ps_pb2_grpc.ParameterShardStub) -> dict[str, Any]:
            parts = [chunk.data async for chunk in stub.Fetch(fetch_request(), metadata=self._metadata, timeout=self._timeout)]
            return blob.unpack(parts)

        states = await self._each(one)
        params = torch.cat([own_params.reshape(-1), *(s["params"] for s in states)])
        optimizer = merge_optimizer_states([own_optimizer, *(s["optimizer"] for s in states)], self.ranges)
        return params, optimizer

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels, self._stubs = [], []
