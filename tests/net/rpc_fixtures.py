"""What the fs3 RPC tests share: a test service, limits, transports, a threaded server, poll().

A module with a name of its own (not ``conftest``), so that test files can import it whatever other
conftest modules pytest has loaded first when several test folders are collected together.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cluster import wait_until
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcLimits, RpcServer, ServiceDef
from fs3.net.service import CallContext, inline
from fs3.net.tcp import TcpTransport
from fs3.net.transport import Transport
from fs3.proto import common_pb2, rpc_pb2

# A service for tests. Messages are borrowed from rpc.proto/common.proto:
#   Block: waits until the test opens the gate, then echoes (deadline and cancellation tests)
#   Fail: raises FS3Error with the code and message of the Status it is sent
#   Crash: raises a plain exception (-> INTERNAL)
#   WrongType: returns a message of the wrong class (-> INTERNAL)
#   InlineBlock: Block, as an inline handler (started in the receive path, a task once it waits)
#   BadPayload: returns a payload that is not bytes-like (-> INTERNAL)
#   Timeout: uses asyncio.timeout around a wait that never ends (-> DEADLINE_EXCEEDED)
#   Lend: replies with a payload of int(data) bytes of its own (a lent buffer) and a done callback,
#     which counts and then zeroes the buffer, as reuse would
TEST_SERVICE = ServiceDef(
    100,
    "test",
    {
        1: ("Block", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        2: ("Fail", common_pb2.Status, rpc_pb2.EchoResponse),
        3: ("Crash", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        4: ("WrongType", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        5: ("InlineBlock", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        6: ("Timeout", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        7: ("BadPayload", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        8: ("Lend", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
    },
)


class ServiceUnderTest:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.blocked = 0
        self.finished = 0
        self.contexts: list[CallContext] = []
        self.lent_done = 0

    async def block(self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext) -> Any:
        self.contexts.append(ctx)
        self.blocked += 1
        await self.gate.wait()
        self.finished += 1
        return rpc_pb2.EchoResponse(data=request.data), payload

    @inline
    async def inline_block(
        self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext
    ) -> Any:
        return await self.block(request, payload, ctx)

    async def timeout(
        self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext
    ) -> Any:
        try:
            async with asyncio.timeout(0.05):
                await asyncio.Event().wait()
        except TimeoutError:
            raise FS3Error(StatusCode.DEADLINE_EXCEEDED, "handler gave up") from None

    async def bad_payload(
        self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext
    ) -> Any:
        return rpc_pb2.EchoResponse(), 12345

    async def lend(self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext) -> Any:
        size = int(request.data)
        buf = bytearray(lend_pattern(size))

        def done() -> None:
            self.lent_done += 1
            buf[:] = bytes(len(buf))  # the memory is reused at once

        return rpc_pb2.EchoResponse(), buf, done

    async def fail(self, request: common_pb2.Status, payload: memoryview | None, ctx: CallContext) -> Any:
        raise FS3Error(request.code, request.message)

    async def crash(self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext) -> Any:
        raise ZeroDivisionError("boom")

    async def wrong_type(
        self, request: rpc_pb2.EchoRequest, payload: memoryview | None, ctx: CallContext
    ) -> Any:
        return rpc_pb2.PingResponse()


def lend_pattern(size: int) -> bytes:
    """The bytes the Lend handler replies with."""
    return (bytes(range(1, 256)) * (size // 255 + 1))[:size]


TEST_LIMITS = RpcLimits(max_payload_bytes=32 << 20, frame_timeout_s=0.5, handshake_timeout_s=1.0)


# The transports the fixtures below run over: TCP everywhere; RDMA over the in-process fake of the
# verbs layer (tests/net_rdma/fakeverbs.py) everywhere; RDMA over a real device where one exists
# (skipped with discovery's reason elsewhere).
TRANSPORTS = ["tcp", "rdma-fake", "rdma"]
_RDMA_TESTS = Path(__file__).resolve().parents[1] / "net_rdma"


def _fakeverbs() -> Any:
    """tests/net_rdma/fakeverbs.py, loaded by path (without adding that folder to sys.path)."""
    mod = sys.modules.get("fakeverbs")
    if mod is None:
        spec = importlib.util.spec_from_file_location("fakeverbs", _RDMA_TESTS / "fakeverbs.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["fakeverbs"] = mod
        spec.loader.exec_module(mod)
    return mod


def make_transports(name: str) -> tuple[Transport, Transport]:
    """(server transport, client transport) for ``name``; skips the test when it cannot run here."""
    if name == "tcp":
        return TcpTransport(), TcpTransport()
    from fs3.config import RdmaConfig
    from fs3.net.rdma.transport import RdmaTransport

    if name == "rdma-fake":
        Fabric = _fakeverbs().Fabric

        fabric = Fabric()
        return tuple(  # type: ignore[return-value]
            RdmaTransport(
                RdmaConfig(), inventory=fabric.inventory(), opener=fabric.opener, limits=TEST_LIMITS
            )
            for _ in range(2)
        )
    from fs3.net.rdma.discovery import discover

    inventory = discover()
    if not inventory.usable:
        pytest.skip(f"no usable RDMA device: {inventory.reason()}")
    return tuple(RdmaTransport(RdmaConfig(), inventory=inventory, limits=TEST_LIMITS) for _ in range(2))  # type: ignore[return-value]


@contextlib.asynccontextmanager
async def serve_test_service(**server_args: Any) -> AsyncIterator[RpcServer]:
    """An RpcServer (the tests' secret and limits, ``server_args`` besides) serving TEST_SERVICE with
    a :class:`ServiceUnderTest` (``server.handlers``) on a free loopback port; stopped on exit."""
    server = RpcServer(SECRET, limits=TEST_LIMITS, **server_args)
    server.handlers = ServiceUnderTest()  # type: ignore[attr-defined]
    server.add_service(TEST_SERVICE, server.handlers)  # type: ignore[attr-defined]
    await server.start(("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.handlers.gate.set()  # type: ignore[attr-defined]
        await server.stop()


async def poll(condition: Callable[[], bool], within: float = 5.0, what: str = "condition") -> None:
    """Wait until ``condition()`` holds, checking every few milliseconds, or fail after ``within`` s."""
    await wait_until(condition, within, what, interval_s=0.005)


class ThreadedServer:
    """An RpcServer on its own uvloop in a background thread, for tests that drive it with blocking
    sockets (hypothesis examples). Records every error the loop reports."""

    def __init__(self, limits: RpcLimits = TEST_LIMITS) -> None:
        self.limits = limits
        self.loop_errors: list[dict[str, Any]] = []
        self.address: tuple[str, int] = ("", 0)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="rpc-test-server", daemon=True)
        self.server: RpcServer | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("threaded server did not start")

    def _run(self) -> None:
        loop = uvloop.new_event_loop()
        self._loop = loop
        loop.set_exception_handler(lambda _loop, ctx: self.loop_errors.append(ctx))
        loop.run_until_complete(self._main())
        loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.server = RpcServer(SECRET, identity="threaded", limits=self.limits)
        self.server.add_service(TEST_SERVICE, ServiceUnderTest())
        self.address = await self.server.start(("127.0.0.1", 0))
        self._ready.set()
        await self._stop.wait()
        await self.server.stop()

    def ping(self) -> rpc_pb2.PingResponse:
        """A well-behaved client's call, from a fresh client on a fresh loop."""

        async def go() -> rpc_pb2.PingResponse:
            async with RpcClient(SECRET, limits=self.limits) as client:
                from fs3.net.system import PING

                response, _ = await client.call(self.address, PING, rpc_pb2.PingRequest(), timeout=5)
                return response

        return uvloop.run(go())

    def connection_count(self) -> int:
        assert self.server is not None and self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._count(), self._loop).result(5)

    async def _count(self) -> int:
        assert self.server is not None
        return self.server.connection_count

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
