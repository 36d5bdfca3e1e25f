"""Handshake, chunk header and payload descriptor encodings, and rejection of bad input."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fs3.errors import FS3Error, StatusCode
from fs3.net.rdma.wire import (
    CHUNK_HEADER_SIZE,
    DESCRIPTOR_SIZE,
    FEATURE_REPLY_BUFFERS,
    MAGIC,
    PARAMS_SIZE,
    PREFIX_SIZE,
    ConnectParams,
    HandshakeError,
    Kind,
    LinkLayer,
    RemoteBuffer,
    pack_chunk_header,
    pack_fallback,
    parse_chunk,
    parse_message,
    parse_prefix,
)

pytestmark = pytest.mark.timeout(30)

GID = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 7])
GOOD = ConnectParams(0x1234, 0xABCDE, 0, 5, LinkLayer.ETHERNET, GID, 32, 16384, 65536)


def test_params_round_trip() -> None:
    for kind in (Kind.CONNECT, Kind.ACCEPT):
        msg = GOOD.pack(kind)
        assert len(msg) == PREFIX_SIZE + PARAMS_SIZE and msg[:4] == MAGIC
        assert parse_message(msg) == (kind, GOOD)


def test_features_round_trip_and_unknown_bits_are_ignored() -> None:
    """The u16 after the receive buffer count is a feature set (it was a reserved zero): a peer
    without any is one that names no reply buffers; bits this build does not know are kept and
    mean nothing to it."""
    with_replies = dataclasses.replace(GOOD, features=FEATURE_REPLY_BUFFERS)
    assert parse_message(with_replies.pack(Kind.ACCEPT)) == (Kind.ACCEPT, with_replies)
    kind, params = parse_message(_with(feat=0x8001))
    assert isinstance(params, ConnectParams) and params.features == 0x8001
    assert params.features & FEATURE_REPLY_BUFFERS
    assert parse_message(_with(feat=0))[1].features == 0  # type: ignore[union-attr]


def test_fallback_round_trip_and_reason_is_bounded() -> None:
    assert parse_message(pack_fallback("no device here")) == (Kind.FALLBACK, "no device here")
    kind, reason = parse_message(pack_fallback("x" * 1000))
    assert kind == Kind.FALLBACK and len(reason) == 256


def _with(**changes: object) -> bytes:
    fields = dict(
        qpn=GOOD.qpn, psn=GOOD.psn, lid=0, mtu=5, ll=2, gid=GID, nrecv=32, feat=0, bsize=16384, inline=65536
    )
    fields.update(changes)
    body = struct.pack("<IIHBB16sHHII", *fields.values())
    return MAGIC + struct.pack("<HHI", 1, 1, len(body)) + body


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"qpn": 0}, "queue pair number"),
        ({"qpn": 1 << 24}, "queue pair number"),
        ({"psn": 1 << 24}, "sequence number"),
        ({"mtu": 0}, "mtu"),
        ({"mtu": 6}, "mtu"),
        ({"ll": 7}, "link layer"),
        ({"gid": bytes(16)}, "gid"),
        ({"nrecv": 2}, "receive buffers"),
        ({"nrecv": 5000}, "receive buffers"),
        ({"bsize": 100}, "buffer size"),
        ({"bsize": 1 << 24}, "buffer size"),
        ({"inline": (1 << 30) + 1}, "inline"),
    ],
)
def test_out_of_range_fields_are_rejected(changes: dict[str, int], words: str) -> None:
    with pytest.raises(HandshakeError, match=words) as info:
        parse_message(_with(**changes))
    assert info.value.code == StatusCode.RPC_CONNECT_FAILED


def test_wrong_magic_version_kind_and_lengths_are_rejected() -> None:
    msg = GOOD.pack(Kind.CONNECT)
    with pytest.raises(HandshakeError, match="bad magic"):
        parse_message(b"FS3R" + msg[4:])
    with pytest.raises(HandshakeError, match="unsupported version 2"):
        parse_message(msg[:4] + struct.pack("<H", 2) + msg[6:])
    with pytest.raises(HandshakeError, match="unknown message kind 9"):
        parse_message(msg[:6] + struct.pack("<H", 9) + msg[8:])
    with pytest.raises(HandshakeError, match="body of 41 bytes"):
        parse_prefix(msg[:8] + struct.pack("<I", 41))
    # oversized: a huge announced length is refused from the prefix alone, before reading the body
    with pytest.raises(HandshakeError, match="expected 40"):
        parse_prefix(msg[:8] + struct.pack("<I", 1 << 31))
    with pytest.raises(HandshakeError, match="too long"):
        parse_prefix(pack_fallback("")[:8] + struct.pack("<I", 257))
    with pytest.raises(HandshakeError, match="truncated"):
        parse_prefix(msg[:5])
    with pytest.raises(HandshakeError, match="its prefix says"):
        parse_message(msg + b"extra")
    with pytest.raises(HandshakeError, match="its prefix says"):
        parse_message(msg[:-1])


def test_packing_checks_too() -> None:
    with pytest.raises(HandshakeError):
        ConnectParams(0, 0, 0, 5, 2, GID, 32, 16384, 0).pack(Kind.CONNECT)


@given(st.binary(max_size=128))
def test_arbitrary_bytes_never_crash_the_parser(data: bytes) -> None:
    try:
        parse_message(data)
    except HandshakeError:
        pass


@given(st.binary(min_size=PARAMS_SIZE, max_size=PARAMS_SIZE))
def test_arbitrary_bodies_parse_or_fail_cleanly(body: bytes) -> None:
    msg = MAGIC + struct.pack("<HHI", 1, 2, PARAMS_SIZE) + body
    try:
        kind, params = parse_message(msg)
    except HandshakeError:
        return
    assert kind == Kind.ACCEPT and isinstance(params, ConnectParams)
    params.check()


def test_chunk_header_round_trip() -> None:
    buf = bytearray(256)
    n = pack_chunk_header(buf, 7, [1, 0xFFFFFFFF], 5)
    buf[n : n + 5] = b"hello"
    credits, tokens, data = parse_chunk(memoryview(buf), n + 5)
    assert (credits, tokens, bytes(data)) == (7, [1, 0xFFFFFFFF], b"hello")
    assert n == CHUNK_HEADER_SIZE + 8


def test_chunk_whose_counts_do_not_match_its_length_is_malformed() -> None:
    buf = bytearray(64)
    n = pack_chunk_header(buf, 0, [3], 10)
    for length in (n + 9, n + 11, 3):
        with pytest.raises(FS3Error) as info:
            parse_chunk(memoryview(buf), length)
        assert info.value.code == StatusCode.RPC_MALFORMED_FRAME


def test_descriptor_round_trip_and_checks() -> None:
    rb = RemoteBuffer(0x7F0000001000, 0xABC, 4096, 42)
    data = rb.pack()
    assert len(data) == DESCRIPTOR_SIZE
    assert RemoteBuffer.unpack(data, 4096) == rb
    with pytest.raises(FS3Error):
        RemoteBuffer.unpack(data[:-1], 4096)
    with pytest.raises(FS3Error):
        RemoteBuffer.unpack(RemoteBuffer((1 << 64) - 10, 1, 100).pack(), 100)
