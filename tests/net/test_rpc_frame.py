"""The frame header codec, the buffer pool and the handshake's proofs, without sockets."""

from __future__ import annotations

import ctypes
import mmap
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fs3.errors import StatusCode
from fs3.net import auth
from fs3.net.buffers import ALIGNED_MIN, AlignedBuffer, BufferPool
from fs3.net.frame import (
    DEFAULT_LIMITS,
    F_ERROR,
    F_HANDSHAKE,
    F_PAYLOAD_CRC,
    F_REQUEST,
    F_RESPONSE,
    F_SINK,
    HEADER_SIZE,
    VALID_FLAGS_RDMA,
    FrameError,
    RpcLimits,
    check_header,
    decode_header,
    encode_header,
)
from fs3.net.transport import parse_address

pytestmark = pytest.mark.timeout(60)

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
flags_ok = st.sampled_from(
    [
        F_REQUEST,
        F_RESPONSE,
        F_RESPONSE | F_ERROR,
        F_HANDSHAKE,
        F_HANDSHAKE | F_ERROR,
        F_REQUEST | F_PAYLOAD_CRC,
    ]
)


@given(flags_ok, u64, u16, u16, st.integers(0, DEFAULT_LIMITS.max_message_bytes), u32)
def test_header_round_trip(flags: int, rid: int, svc: int, meth: int, mlen: int, timeout_ms: int) -> None:
    plen = 12345
    pcrc = 99 if flags & F_PAYLOAD_CRC else 0
    raw = encode_header(flags, rid, svc, meth, mlen, plen, timeout_ms, pcrc)
    assert len(raw) == HEADER_SIZE
    assert decode_header(raw, 0, DEFAULT_LIMITS) == (flags, rid, svc, meth, timeout_ms, mlen, plen, pcrc)
    # also at an offset inside a larger buffer, through a memoryview
    buf = memoryview(b"xyz" + raw + b"tail")
    assert decode_header(buf, 3, DEFAULT_LIMITS)[1] == rid


@settings(max_examples=500)
@given(st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE))
def test_random_header_is_refused_cleanly(raw: bytes) -> None:
    # Random bytes never parse as a header (the magic and the CRC stand in the way), and refusing
    # them raises only FrameError.
    with pytest.raises(FrameError) as e:
        decode_header(raw, 0, DEFAULT_LIMITS)
    assert e.value.code == StatusCode.RPC_MALFORMED_FRAME


@given(st.integers(0, HEADER_SIZE - 1), st.integers(1, 255))
def test_any_flipped_header_byte_is_detected(pos: int, xor: int) -> None:
    raw = bytearray(encode_header(F_REQUEST, 7, 1, 2, 10, 20, 1000))
    raw[pos] ^= xor
    with pytest.raises(FrameError):
        decode_header(bytes(raw), 0, DEFAULT_LIMITS)


def test_huge_lengths_are_refused_before_anything_is_allocated() -> None:
    raw = encode_header(F_REQUEST, 42, 0, 1, 0, 1 << 63)
    with pytest.raises(FrameError) as e:
        decode_header(raw, 0, DEFAULT_LIMITS)
    assert e.value.code == StatusCode.RPC_FRAME_TOO_LARGE
    assert e.value.request_id == 42  # the header was intact, so the caller can be told
    raw = encode_header(F_REQUEST, 43, 0, 1, 0xFFFFFFFF, 0)
    with pytest.raises(FrameError) as e:
        decode_header(raw, 0, DEFAULT_LIMITS)
    assert e.value.code == StatusCode.RPC_FRAME_TOO_LARGE
    small = RpcLimits(max_message_bytes=100, max_payload_bytes=1000)
    decode_header(encode_header(F_REQUEST, 1, 0, 1, 100, 1000), 0, small)
    with pytest.raises(FrameError):
        decode_header(encode_header(F_REQUEST, 1, 0, 1, 100, 1001), 0, small)


@pytest.mark.parametrize(
    "flags",
    [0, F_REQUEST | F_RESPONSE, F_REQUEST | F_ERROR, F_ERROR, F_REQUEST | 0x80, F_RESPONSE | F_HANDSHAKE],
)
def test_invalid_flag_combinations_are_refused(flags: int) -> None:
    with pytest.raises(FrameError) as e:
        decode_header(encode_header(flags, 1, 0, 1, 0), 0, DEFAULT_LIMITS)
    assert e.value.code == StatusCode.RPC_MALFORMED_FRAME


def test_a_named_reply_buffer_is_an_rdma_request_s_flag_only() -> None:
    """Flag.SINK (a descriptor of the caller's reply buffer follows) means something only on RDMA
    and only on a request: TCP's check refuses it everywhere, the RDMA stream's on anything else."""
    for flags in (F_REQUEST | F_SINK, F_REQUEST | F_PAYLOAD_CRC | F_SINK):
        with pytest.raises(FrameError):
            decode_header(encode_header(flags, 1, 0, 1, 0), 0, DEFAULT_LIMITS)
        raw = encode_header(flags, 1, 0, 1, 0)
        assert check_header(raw, 0, DEFAULT_LIMITS, VALID_FLAGS_RDMA)[2] == flags
    for flags in (F_RESPONSE | F_SINK, F_HANDSHAKE | F_SINK, F_RESPONSE | F_ERROR | F_SINK):
        with pytest.raises(FrameError) as e:
            check_header(encode_header(flags, 1, 0, 1, 0), 0, DEFAULT_LIMITS, VALID_FLAGS_RDMA)
        assert e.value.code == StatusCode.RPC_MALFORMED_FRAME


def test_wrong_version_and_reserved_field_are_refused() -> None:
    from crc32c import crc32c

    head = struct.pack("<IBBHHHQIIQI", 0x52335346, 2, F_REQUEST, 0, 1, 0, 1, 0, 0, 0, 0)
    with pytest.raises(FrameError, match="version"):
        decode_header(head + struct.pack("<I", crc32c(head)), 0, DEFAULT_LIMITS)
    head = struct.pack("<IBBHHHQIIQI", 0x52335346, 1, F_REQUEST, 0, 1, 5, 1, 0, 0, 0, 0)
    with pytest.raises(FrameError, match="reserved"):
        decode_header(head + struct.pack("<I", crc32c(head)), 0, DEFAULT_LIMITS)
    # a payload crc without its flag
    head = struct.pack("<IBBHHHQIIQI", 0x52335346, 1, F_REQUEST, 0, 1, 0, 1, 0, 0, 0, 7)
    with pytest.raises(FrameError, match="crc"):
        decode_header(head + struct.pack("<I", crc32c(head)), 0, DEFAULT_LIMITS)


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        RpcLimits(max_message_bytes=0)
    with pytest.raises(ValueError):
        RpcLimits(max_payload_bytes=1 << 63)
    with pytest.raises(ValueError):
        RpcLimits(frame_timeout_s=0)


def test_buffer_pool_reuses_and_bounds_what_it_keeps() -> None:
    pool = BufferPool(max_retained_bytes=3 << 20, max_buffer_bytes=4 << 20)
    a = pool.acquire(1000)
    assert len(a) == 4096
    pool.release(a)
    assert pool.acquire(3000) is a  # same size class comes back
    big = pool.acquire((1 << 20) + 1)
    assert len(big) == 2 << 20
    pool.release(big)
    assert pool.retained_bytes == 2 << 20
    other = bytearray(2 << 20)
    pool.release(other)  # would exceed the retention cap: dropped
    assert pool.retained_bytes == 2 << 20
    assert len(pool.acquire(5 << 20)) == 5 << 20  # beyond the largest class: exact, unpooled
    pool.release(bytearray(12345))  # not a pool size: ignored
    pool.clear()
    assert pool.retained_bytes == 0


def test_large_pool_buffers_are_page_aligned_and_small_ones_are_bytearrays() -> None:
    pool = BufferPool()
    small = pool.acquire(ALIGNED_MIN // 2)  # its size class is below ALIGNED_MIN
    assert type(small) is bytearray
    for n in (ALIGNED_MIN, (1 << 20) - 5, 1 << 20):
        buf = pool.acquire(n)
        assert isinstance(buf, AlignedBuffer) and len(buf) >= n
        view = memoryview(buf)[:n]
        view[:] = b"x" * n  # writable, as a receive buffer must be
        assert ctypes.addressof(ctypes.c_char.from_buffer(view)) % mmap.PAGESIZE == 0
        pool.release(buf)
        assert pool.acquire(n) is buf  # and reused like the others


def test_handshake_proofs_bind_roles_nonces_and_identity() -> None:
    secret = b"s" * 32
    cn, sn = auth.new_nonce(), auth.new_nonce()
    sp = auth.server_proof(secret, cn, sn, "node-1")
    cp = auth.client_proof(secret, sn, cn, "node-1")
    assert sp != cp  # a reflected proof is useless
    assert auth.verify(sp, auth.server_proof(secret, cn, sn, "node-1"))
    assert not auth.verify(sp, auth.server_proof(b"t" * 32, cn, sn, "node-1"))
    assert not auth.verify(sp, auth.server_proof(secret, cn, sn, "node-2"))
    assert not auth.verify(sp, auth.server_proof(secret, auth.new_nonce(), sn, "node-1"))
    with pytest.raises(ValueError):
        auth.check_secret(b"short")


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_address("[::1]:9000") == ("::1", 9000)
    assert parse_address(("h", "7")) == ("h", 7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        parse_address("nohost")
