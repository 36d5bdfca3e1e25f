"""Byte formats of the RDMA transport: the connection handshake (over TCP), the chunk header that
starts every SEND, and the descriptor of a payload the receiver pulls with RDMA READ.

Handshake (little endian), sent once each way on the TCP connection before any frame::

    offset size field
         0    4 magic         b"FS3V" (a TCP frame starts with b"FS3R", so a listener can tell them apart)
         4    2 version       1
         6    2 kind          CONNECT (client), ACCEPT (server), or FALLBACK (server: "use TCP")
         8    4 body length   exact, per kind (FALLBACK: the reason, at most 256 bytes of UTF-8)
        12      body

    CONNECT / ACCEPT body (:data:`PARAMS_SIZE` bytes)
         0    4 qpn           queue pair number (24 bits)
         4    4 psn           first packet sequence number (24 bits)
         8    2 lid           port LID (InfiniBand; 0 on RoCE)
        10    1 mtu           ibv_mtu enum, 1 (256) .. 5 (4096)
        11    1 link layer    1 InfiniBand, 2 Ethernet (RoCE)
        12   16 gid           the GID the peer addresses us with
        28    2 recv buffers  receive buffers posted for the peer's SENDs (its initial credits)
        30    2 reserved      0
        32    4 buffer size   bytes of each of those buffers
        36    4 inline max    payloads up to this size travel in the SEND stream; larger are pulled

Every input is checked before use: a wrong magic, version or kind, a body length that is not the
kind's exact size, and out-of-range fields raise :class:`HandshakeError`, so a confused or hostile
peer costs one closed TCP connection.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from fs3.errors import FS3Error, StatusCode

MAGIC = b"FS3V"
VERSION = 1
PREFIX_SIZE = 12
MAX_REASON_BYTES = 256

_PREFIX = struct.Struct("<4sHHI")
_PARAMS = struct.Struct("<IIHBB16sHHII")
PARAMS_SIZE = _PARAMS.size
assert PARAMS_SIZE == 40 and _PREFIX.size == PREFIX_SIZE

# Limits of what a peer may ask for: enough for any real setup, small enough that a bogus
# handshake cannot make us register gigabytes.
MIN_BUFFER_SIZE = 1024
MAX_BUFFER_SIZE = 1 << 20
MAX_RECV_BUFFERS = 4096
_MASK24 = (1 << 24) - 1
#: ConnectParams.features: this side names reply buffers in its requests and writes replies into
#: the ones its peer's requests name (see fs3.net.rdma.stream); a side that does not set it is
#: sent no Flag.SINK. Unknown bits are ignored (a later build's features).
FEATURE_REPLY_BUFFERS = 1


class Kind(enum.IntEnum):
    """What a handshake message is."""

    CONNECT = 1
    ACCEPT = 2
    FALLBACK = 3


class LinkLayer(enum.IntEnum):
    """The port's link layer (the values of ``IBV_LINK_LAYER_*``)."""

    INFINIBAND = 1
    ETHERNET = 2


class HandshakeError(FS3Error):
    """A handshake message that must not be used."""

    def __init__(self, message: str) -> None:
        super().__init__(StatusCode.RPC_CONNECT_FAILED, f"rdma handshake: {message}")


@dataclass(slots=True, frozen=True)
class ConnectParams:
    """One side's half of an RC connection: where to send, and how much it may send."""

    qpn: int
    psn: int
    lid: int
    mtu: int
    link_layer: int
    gid: bytes
    recv_buffers: int
    buffer_size: int
    inline_max: int
    features: int = 0  # FEATURE_* bits

    def check(self) -> None:
        """Raise :class:`HandshakeError` when a field is out of range."""
        if not 0 < self.qpn <= _MASK24:
            raise HandshakeError(f"queue pair number {self.qpn} out of range")
        if not 0 <= self.psn <= _MASK24:
            raise HandshakeError(f"packet sequence number {self.psn} out of range")
        if not 0 <= self.lid <= 0xFFFF:
            raise HandshakeError(f"lid {self.lid} out of range")
        if not 1 <= self.mtu <= 5:
            raise HandshakeError(f"mtu code {self.mtu} out of range")
        if self.link_layer not in (LinkLayer.INFINIBAND, LinkLayer.ETHERNET):
            raise HandshakeError(f"unknown link layer {self.link_layer}")
        if len(self.gid) != 16:
            raise HandshakeError("gid must be 16 bytes")
        if self.link_layer == LinkLayer.ETHERNET and not any(self.gid):
            raise HandshakeError("RoCE needs a gid")
        if not 3 <= self.recv_buffers <= MAX_RECV_BUFFERS:
            raise HandshakeError(f"{self.recv_buffers} receive buffers out of range")
        if not MIN_BUFFER_SIZE <= self.buffer_size <= MAX_BUFFER_SIZE:
            raise HandshakeError(f"buffer size {self.buffer_size} out of range")
        if not 0 <= self.inline_max <= 1 << 30:
            raise HandshakeError(f"inline max {self.inline_max} out of range")
        if not 0 <= self.features <= 0xFFFF:
            raise HandshakeError(f"features {self.features:#x} out of range")

    def pack(self, kind: Kind) -> bytes:
        """The complete handshake message of ``kind`` (CONNECT or ACCEPT)."""
        self.check()
        body = _PARAMS.pack(
            self.qpn,
            self.psn,
            self.lid,
            self.mtu,
            self.link_layer,
            self.gid,
            self.recv_buffers,
            self.features,
            self.buffer_size,
            self.inline_max,
        )
        return _PREFIX.pack(MAGIC, VERSION, kind, len(body)) + body


def pack_fallback(reason: str) -> bytes:
    """The server's answer when it will not use RDMA with this peer (the socket carries TCP frames next)."""
    body = reason.encode()[:MAX_REASON_BYTES]
    return _PREFIX.pack(MAGIC, VERSION, Kind.FALLBACK, len(body)) + body


def parse_prefix(data: bytes | bytearray | memoryview) -> tuple[Kind, int]:
    """Check the first :data:`PREFIX_SIZE` bytes; return the kind and the exact body length to read."""
    if len(data) < PREFIX_SIZE:
        raise HandshakeError("truncated prefix")
    magic, version, kind, length = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise HandshakeError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise HandshakeError(f"unsupported version {version} (this side speaks {VERSION})")
    try:
        k = Kind(kind)
    except ValueError:
        raise HandshakeError(f"unknown message kind {kind}") from None
    if k == Kind.FALLBACK:
        if length > MAX_REASON_BYTES:
            raise HandshakeError(f"fallback reason of {length} bytes is too long")
    elif length != PARAMS_SIZE:
        raise HandshakeError(f"{k.name} body of {length} bytes, expected {PARAMS_SIZE}")
    return k, length


def parse_params(body: bytes | bytearray | memoryview) -> ConnectParams:
    """Decode and check a CONNECT or ACCEPT body."""
    if len(body) != PARAMS_SIZE:
        raise HandshakeError(f"parameters of {len(body)} bytes, expected {PARAMS_SIZE}")
    (qpn, psn, lid, mtu, ll, gid, nrecv, features, bsize, inline_max) = _PARAMS.unpack(bytes(body))
    params = ConnectParams(qpn, psn, lid, mtu, ll, gid, nrecv, bsize, inline_max, features)
    params.check()
    return params


def parse_message(data: bytes | bytearray | memoryview) -> tuple[Kind, ConnectParams | str]:
    """Decode one whole handshake message: (kind, params) or (FALLBACK, reason)."""
    kind, length = parse_prefix(data)
    if len(data) != PREFIX_SIZE + length:
        raise HandshakeError(f"message of {len(data)} bytes, its prefix says {PREFIX_SIZE + length}")
    body = bytes(data[PREFIX_SIZE:])
    if kind == Kind.FALLBACK:
        return kind, body.decode(errors="replace")
    return kind, parse_params(body)


# ---- the chunk header at the start of every SEND ---------------------------------------------------

# credits returned (u16), number of pulled payloads released (u16, their u32 tokens follow the header),
# stream bytes in this SEND (u32)
_CHUNK = struct.Struct("<HHI")
CHUNK_HEADER_SIZE = _CHUNK.size
_TOKEN = struct.Struct("<I")
TOKEN_SIZE = _TOKEN.size


def pack_chunk_header(buf: memoryview | bytearray, credits: int, tokens: list[int], stream_bytes: int) -> int:
    """Write a chunk header and its released tokens at the start of ``buf``; return the bytes used."""
    _CHUNK.pack_into(buf, 0, credits, len(tokens), stream_bytes)
    off = CHUNK_HEADER_SIZE
    for t in tokens:
        _TOKEN.pack_into(buf, off, t)
        off += TOKEN_SIZE
    return off


def parse_chunk(data: memoryview, length: int) -> tuple[int, list[int], memoryview]:
    """Split a received SEND of ``length`` bytes into (credits, released tokens, stream bytes).

    Raises :class:`fs3.net.frame.FrameError`-compatible FS3Error(RPC_MALFORMED_FRAME) when the
    header's counts do not add up to ``length``."""
    if length < CHUNK_HEADER_SIZE:
        raise FS3Error(StatusCode.RPC_MALFORMED_FRAME, f"rdma chunk of {length} bytes is too short")
    credits, ntokens, nstream = _CHUNK.unpack_from(data, 0)
    off = CHUNK_HEADER_SIZE
    if off + ntokens * TOKEN_SIZE + nstream != length:
        raise FS3Error(
            StatusCode.RPC_MALFORMED_FRAME,
            f"rdma chunk header says {ntokens} tokens + {nstream} bytes, the SEND had {length}",
        )
    tokens = [_TOKEN.unpack_from(data, off + i * TOKEN_SIZE)[0] for i in range(ntokens)]
    off += ntokens * TOKEN_SIZE
    return credits, tokens, data[off : off + nstream]


# ---- a payload the receiver pulls ---------------------------------------------------------------

# remote address (u64), rkey (u32), token (u32) that releases the sender's buffer when echoed back
_DESCRIPTOR = struct.Struct("<QII")
DESCRIPTOR_SIZE = _DESCRIPTOR.size


@dataclass(slots=True, frozen=True)
class RemoteBuffer:
    """Registered memory of a peer that this side may RDMA-READ or RDMA-WRITE: what a request names
    when it wants the server to move bulk data one-sidedly (a client's read destination, a chain
    predecessor's staging buffer). ``token`` is the owner's handle for it (0 when unused)."""

    addr: int
    rkey: int
    length: int
    token: int = 0

    def pack(self) -> bytes:
        """addr, rkey, token; the length travels separately (the frame header's payload length)."""
        return _DESCRIPTOR.pack(self.addr, self.rkey, self.token)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, length: int) -> RemoteBuffer:
        """Decode a descriptor of a ``length``-byte buffer."""
        if len(data) != DESCRIPTOR_SIZE:
            raise FS3Error(StatusCode.RPC_MALFORMED_FRAME, "bad rdma payload descriptor size")
        addr, rkey, token = _DESCRIPTOR.unpack(bytes(data))
        if length <= 0 or addr + length > 1 << 64:
            raise FS3Error(StatusCode.RPC_MALFORMED_FRAME, "rdma payload descriptor out of range")
        return cls(addr, rkey, length, token)


# ---- a reply buffer a request names, and a payload already written there -------------------------

#: the descriptor of a reply whose payload the server has RDMA-written into the request's sink
#: (token 0: a pulled payload's token never is)
WRITTEN = bytes(DESCRIPTOR_SIZE)


def pack_sink(remote: RemoteBuffer) -> bytes:
    """The descriptor of a request's reply buffer: addr, rkey and its length (in the token field)."""
    return _DESCRIPTOR.pack(remote.addr, remote.rkey, remote.length)


def unpack_sink(data: bytes | bytearray | memoryview) -> RemoteBuffer:
    """Decode a request's reply buffer descriptor; RPC_MALFORMED_FRAME if it makes no sense."""
    if len(data) != DESCRIPTOR_SIZE:
        raise FS3Error(StatusCode.RPC_MALFORMED_FRAME, "bad rdma reply buffer descriptor size")
    addr, rkey, length = _DESCRIPTOR.unpack(bytes(data))
    if length <= 0 or addr + length > 1 << 64:
        raise FS3Error(StatusCode.RPC_MALFORMED_FRAME, "rdma reply buffer descriptor out of range")
    return RemoteBuffer(addr, rkey, length)
