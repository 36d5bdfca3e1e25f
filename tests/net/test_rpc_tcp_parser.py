"""The TCP receive state machine against arbitrary fragmentation: whatever sizes the kernel hands
over, frames come out whole, in order, byte-exact (inline, big-message and direct-payload paths)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fs3.net.frame import F_REQUEST, FrameError, RpcLimits, encode_header
from fs3.net.tcp import TcpConnection
from fs3.net.transport import FrameReceiver

pytestmark = pytest.mark.timeout(120)


class Recorder(FrameReceiver):
    def __init__(self) -> None:
        self.frames: list[tuple[int, int, int, bytes, bytes | None]] = []
        self.errors: list[FrameError] = []

    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        return memoryview(bytearray(length))

    def frame_received(
        self,
        flags: int,
        request_id: int,
        service_id: int,
        method_id: int,
        timeout_ms: int,
        message: Any,
        payload: memoryview | None,
    ) -> None:
        self.frames.append(
            (request_id, service_id, method_id, bytes(message), None if payload is None else bytes(payload))
        )

    def frame_error(self, error: FrameError) -> None:
        self.errors.append(error)

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


class FakeTransport:
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int = 0, low: int = 0) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, data: list[bytes]) -> None:
        pass

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def feed(conn: TcpConnection, data: bytes, chunks: list[int]) -> None:
    """Hand ``data`` to the protocol in reads of the given sizes (cycled), as a loop would."""
    pos, i = 0, 0
    while pos < len(data):
        want = chunks[i % len(chunks)]
        i += 1
        buf = conn.get_buffer(-1)
        n = min(len(buf), want, len(data) - pos)
        buf[:n] = data[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


frame_spec = st.tuples(
    st.integers(0, 20_000).map(lambda n: n if n < 300 or n % 3 else n * 10),  # some messages > 64 KiB
    st.one_of(st.just(0), st.integers(1, 300_000)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(frame_spec, min_size=1, max_size=12), chunks=st.lists(st.integers(1, 70_000), min_size=1)
)
def test_frames_survive_any_fragmentation(
    loop: asyncio.AbstractEventLoop, specs: list[tuple[int, int]], chunks: list[int]
) -> None:
    rec = Recorder()
    conn = TcpConnection(loop, RpcLimits(), lambda c: rec, server_side=True)
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    sent = []
    stream = bytearray()
    for i, (mlen, plen) in enumerate(specs):
        message = bytes((i + k) % 251 for k in range(min(mlen, 1000))) * (mlen // 1000 + 1)
        message = message[:mlen]
        payload = bytes((i * 7 + k) % 253 for k in range(min(plen, 1000))) * (plen // 1000 + 1)
        payload = payload[:plen]
        stream += encode_header(F_REQUEST, i + 1, 5, i, len(message), len(payload)) + message + payload
        sent.append((i + 1, 5, i, message, payload or None))
    feed(conn, bytes(stream), chunks)
    assert not rec.errors
    assert rec.frames == sent
    conn.connection_lost(None)
