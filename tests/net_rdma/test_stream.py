"""Cutting the SEND stream into frames, whatever the SEND boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fs3.net.frame import (
    F_REQUEST,
    F_SINK,
    H_FLAGS,
    H_PAYLOAD_LEN,
    H_REQUEST_ID,
    FrameError,
    RpcLimits,
    encode_header,
)
from fs3.net.rdma.stream import StreamAssembler
from fs3.net.rdma.wire import RemoteBuffer, pack_sink, unpack_sink

pytestmark = pytest.mark.timeout(60)
LIMITS = RpcLimits()
INLINE = 100


def _sink(rid: int) -> RemoteBuffer:
    return RemoteBuffer(0x9000 + rid, 9, 1000 + rid)


def _frame(rid: int, message: bytes, payload: bytes) -> bytes:
    """A request; every third names a reply buffer (Flag.SINK: its descriptor comes last)."""
    sink = rid % 3 == 0
    head = encode_header(F_REQUEST | (F_SINK if sink else 0), rid, 1, 2, len(message), len(payload))
    tail = pack_sink(_sink(rid)) if sink else b""
    if len(payload) > INLINE:
        return head + message + RemoteBuffer(0x1000 + rid, 7, len(payload), rid).pack() + tail
    return head + message + payload + tail


frames_st = st.lists(st.tuples(st.binary(max_size=300), st.binary(max_size=300)), min_size=1, max_size=20)


@settings(max_examples=100, deadline=None)
@given(frames_st, st.data())
def test_frames_survive_any_chunking(frames: list[tuple[bytes, bytes]], data: st.DataObject) -> None:
    stream = b"".join(_frame(i + 1, m, p) for i, (m, p) in enumerate(frames))
    asm = StreamAssembler(INLINE)
    got = []
    pos = 0
    while pos < len(stream):
        n = data.draw(st.integers(1, 500))
        asm.feed(stream[pos : pos + n])
        pos += n
        while (f := asm.next_frame(LIMITS)) is not None:
            got.append(f)
    assert not asm.mid_frame
    assert len(got) == len(frames)
    for i, (f, (m, p)) in enumerate(zip(got, frames, strict=True)):
        assert f.header[H_REQUEST_ID] == i + 1 and f.message == m and f.header[H_PAYLOAD_LEN] == len(p)
        if len(p) > INLINE:
            assert f.payload is None and RemoteBuffer.unpack(f.descriptor, len(p)).token == i + 1  # type: ignore[arg-type]
        else:
            assert f.descriptor is None and (f.payload or b"") == p
        if (i + 1) % 3 == 0:
            assert f.header[H_FLAGS] & F_SINK and unpack_sink(f.sink) == _sink(i + 1)  # type: ignore[arg-type]
        else:
            assert f.sink is None


def test_bad_header_is_a_frame_error() -> None:
    asm = StreamAssembler(INLINE)
    asm.feed(b"X" * 44)
    with pytest.raises(FrameError, match="magic"):
        asm.next_frame(LIMITS)


def test_limits_apply_per_call() -> None:
    asm = StreamAssembler(INLINE)
    asm.feed(encode_header(F_REQUEST, 1, 1, 1, 5000, 0) + bytes(5000))
    with pytest.raises(FrameError, match="exceeds limit"):
        asm.next_frame(RpcLimits(max_message_bytes=4096))


def test_large_streams_do_not_grow_the_buffer_forever() -> None:
    asm = StreamAssembler(INLINE)
    one = _frame(1, b"m" * 1000, b"")
    for _ in range(3000):
        asm.feed(one)
        assert asm.next_frame(LIMITS) is not None
    assert len(asm._buf) < 2 << 20
