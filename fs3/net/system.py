"""The built-in system service (service id 0): health checks and benchmark plumbing.

Every :class:`fs3.net.server.RpcServer` serves it. ``Ping`` answers who the server is; ``Echo``
returns the message data and the raw payload unchanged; ``Sink`` swallows a payload and ``Source``
produces one of a requested length, for one-way bulk measurements.
"""

from __future__ import annotations

import time

from fs3.errors import FS3Error, StatusCode
from fs3.net.frame import RpcLimits
from fs3.net.service import CallContext, ServiceDef, inline
from fs3.proto import rpc_pb2

SYSTEM_SERVICE = ServiceDef(
    rpc_pb2.SERVICE_SYSTEM,
    "system",
    {
        1: ("Ping", rpc_pb2.PingRequest, rpc_pb2.PingResponse),
        2: ("Echo", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        3: ("Sink", rpc_pb2.SinkRequest, rpc_pb2.SinkResponse),
        4: ("Source", rpc_pb2.SourceRequest, rpc_pb2.SourceResponse),
    },
)
PING = SYSTEM_SERVICE["Ping"]
ECHO = SYSTEM_SERVICE["Echo"]
SINK = SYSTEM_SERVICE["Sink"]
SOURCE = SYSTEM_SERVICE["Source"]


def source_pattern(length: int) -> bytes:
    """The bytes ``Source`` sends for ``length`` (a repeating 0..255 ramp, so tests can check them)."""
    return (bytes(range(256)) * (length // 256 + 1))[:length]


class SystemService:
    """Handlers of the system service."""

    def __init__(self, identity: str, limits: RpcLimits) -> None:
        self.identity = identity
        self.limits = limits
        self._pattern = memoryview(b"")

    @inline
    async def ping(
        self, request: rpc_pb2.PingRequest, payload: memoryview | None, ctx: CallContext
    ) -> rpc_pb2.PingResponse:
        return rpc_pb2.PingResponse(identity=self.identity, server_time_ns=time.time_ns())

    @inline
    async def echo(
        self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext
    ) -> tuple[rpc_pb2.EchoResponse, memoryview | None]:
        return rpc_pb2.EchoResponse(data=request.data), payload

    @inline
    async def sink(
        self, request: rpc_pb2.SinkRequest, payload: memoryview | None, ctx: CallContext
    ) -> rpc_pb2.SinkResponse:
        return rpc_pb2.SinkResponse(received=0 if payload is None else payload.nbytes)

    @inline
    async def source(
        self, request: rpc_pb2.SourceRequest, payload: memoryview | None, ctx: CallContext
    ) -> tuple[rpc_pb2.SourceResponse, memoryview]:
        n = request.length
        if n > self.limits.max_payload_bytes:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"length {n} exceeds the payload limit")
        if n > len(self._pattern):
            # Immutable bytes, built once and grown rarely, so replies can share it while in flight.
            self._pattern = memoryview(source_pattern(max(n, 1 << 20)))
        return rpc_pb2.SourceResponse(), self._pattern[:n]
