"""The fs3 RPC frame: a fixed binary header, a protobuf message, and an optional raw payload.

Wire layout (little endian, :data:`HEADER_SIZE` = 44 bytes)::

    offset size field
         0    4 magic           b"FS3R"
         4    1 version         1
         5    1 flags           Flag bits
         6    2 service id
         8    2 method id
        10    2 reserved        must be 0
        12    8 request id      0 for handshake and connection-level errors
        20    4 timeout ms      the caller's remaining deadline (requests; 0 = none given)
        24    4 message length  bytes of protobuf message that follow the header
        28    8 payload length  bytes of raw payload that follow the message
        36    4 payload crc     CRC32C of the payload when Flag.PAYLOAD_CRC is set, else 0
        40    4 header crc      CRC32C of bytes 0..39

The header CRC is checked before any length is believed, and lengths are checked against
:class:`RpcLimits` before anything is allocated, so a corrupt or hostile header costs nothing.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from crc32c import crc32c

from fs3.errors import FS3Error, StatusCode

MAGIC = 0x52335346  # b"FS3R" read as little-endian u32
VERSION = 1

# Everything but the header CRC; the CRC is computed over exactly these bytes.
_HEAD = struct.Struct("<IBBHHHQIIQI")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEAD.size + _CRC.size
assert HEADER_SIZE == 44

MAX_U32 = 0xFFFFFFFF


class Flag(enum.IntFlag):
    """Frame kind and options. Exactly one of REQUEST, RESPONSE, HANDSHAKE is set."""

    REQUEST = 0x01
    RESPONSE = 0x02
    ERROR = 0x04  # a RESPONSE (or HANDSHAKE) whose message is an fs3.Status
    HANDSHAKE = 0x08
    PAYLOAD_CRC = 0x10  # the payload crc field is meaningful and must be checked
    # RDMA only (other transports refuse it): a request followed by the descriptor of the caller's
    # registered buffer, where the server may RDMA WRITE the reply's payload (fs3.net.rdma.stream)
    SINK = 0x20


# Plain ints for the hot path (IntFlag arithmetic is slow).
F_REQUEST = int(Flag.REQUEST)
F_RESPONSE = int(Flag.RESPONSE)
F_ERROR = int(Flag.ERROR)
F_HANDSHAKE = int(Flag.HANDSHAKE)
F_PAYLOAD_CRC = int(Flag.PAYLOAD_CRC)
F_SINK = int(Flag.SINK)
_KIND_MASK = F_REQUEST | F_RESPONSE | F_HANDSHAKE
_KNOWN = _KIND_MASK | F_ERROR | F_PAYLOAD_CRC
# Valid flag bytes, precomputed so validation is one set lookup.
_VALID_FLAGS = frozenset(
    f
    for f in range(256)
    if not f & ~_KNOWN
    and (f & _KIND_MASK) in (F_REQUEST, F_RESPONSE, F_HANDSHAKE)
    and not (f & F_ERROR and f & F_REQUEST)
)
#: what the RDMA transport also accepts: requests that name a reply buffer
VALID_FLAGS_RDMA = _VALID_FLAGS | frozenset(f | F_SINK for f in _VALID_FLAGS if f & F_REQUEST)


@dataclass(slots=True, frozen=True)
class RpcLimits:
    """Limits every fs3 RPC endpoint enforces on what it receives (and checks before it sends).

    ``frame_timeout_s`` bounds how long a started frame may stay incomplete (a peer that stops
    mid-frame is disconnected); ``handshake_timeout_s`` bounds the authentication handshake. A server
    stops reading from a connection while it has ``max_inflight_calls`` calls, or calls holding
    ``max_inflight_payload_bytes`` of request payload, in progress for it. ``write_stall_timeout_s``
    bounds how long a peer may take none of what we have queued for it (a peer that stops reading
    is disconnected: it would otherwise hold its connection, and a server the replies it buffered,
    for ever, since a server stops reading from such a peer and so never sees it go away).
    """

    max_message_bytes: int = 16 << 20
    max_payload_bytes: int = 64 << 20
    frame_timeout_s: float = 30.0
    handshake_timeout_s: float = 10.0
    max_inflight_calls: int = 4096
    max_inflight_payload_bytes: int = 256 << 20
    write_stall_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.max_message_bytes <= MAX_U32:
            raise ValueError(f"max_message_bytes out of range: {self.max_message_bytes}")
        if not 0 <= self.max_payload_bytes < 1 << 63:
            raise ValueError(f"max_payload_bytes out of range: {self.max_payload_bytes}")
        if self.frame_timeout_s <= 0 or self.handshake_timeout_s <= 0 or self.write_stall_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_inflight_calls < 1 or self.max_inflight_payload_bytes < 1:
            raise ValueError("in-flight limits must be positive")


DEFAULT_LIMITS = RpcLimits()


class FrameError(FS3Error):
    """A frame that must not be processed. ``request_id`` is set when the header was intact (CRC ok),
    so the peer can be told which call failed; ``fatal`` frames close the connection."""

    def __init__(self, code: int, message: str, request_id: int = 0, fatal: bool = True) -> None:
        super().__init__(code, message)
        self.request_id = request_id
        self.fatal = fatal


def encode_header(
    flags: int,
    request_id: int,
    service_id: int,
    method_id: int,
    message_len: int,
    payload_len: int = 0,
    timeout_ms: int = 0,
    payload_crc: int = 0,
) -> bytes:
    """Pack a header (with its CRC). Callers validate ranges; struct raises on overflow."""
    head = _HEAD.pack(
        MAGIC,
        VERSION,
        flags,
        service_id,
        method_id,
        0,
        request_id,
        timeout_ms,
        message_len,
        payload_len,
        payload_crc,
    )
    return head + _CRC.pack(crc32c(head))


# (flags, request_id, service_id, method_id, timeout_ms, message_len, payload_len, payload_crc)
HeaderFields = tuple[int, int, int, int, int, int, int, int]

# The whole header, CRC included, and the indices of its fields in check_header's result.
_FULL = struct.Struct("<IBBHHHQIIQII")
H_FLAGS = 2
H_SERVICE = 3
H_METHOD = 4
H_REQUEST_ID = 6
H_TIMEOUT = 7
H_MESSAGE_LEN = 8
H_PAYLOAD_LEN = 9
H_PAYLOAD_CRC = 10
# CRC32C over bytes followed by their own CRC (little endian) always gives this constant, so one
# pass over all 44 bytes checks the header CRC.
_CRC_RESIDUE = 0x48674BC7


def check_header(
    buf: bytes | bytearray | memoryview,
    offset: int,
    limits: RpcLimits,
    valid_flags: frozenset[int] = _VALID_FLAGS,
) -> tuple[int, ...]:
    """Validate the header at ``buf[offset:]`` and return all its fields (index with ``H_*``);
    ``valid_flags``: the flag bytes the transport accepts.

    The receive path's version of :func:`decode_header`: one unpack, one CRC pass and one combined
    test when the header is good, the detailed diagnosis only when it is not.
    """
    f = _FULL.unpack_from(buf, offset)
    if (
        f[0] != MAGIC
        or crc32c(buf[offset : offset + HEADER_SIZE]) != _CRC_RESIDUE
        or f[1] != VERSION
        or f[2] not in valid_flags
        or f[5]
        or (f[10] and not f[2] & F_PAYLOAD_CRC)
        or f[8] > limits.max_message_bytes
        or f[9] > limits.max_payload_bytes
    ):
        _diagnose(f, buf, offset, limits, valid_flags)
    return f


def _diagnose(
    f: tuple[int, ...],
    buf: bytes | bytearray | memoryview,
    offset: int,
    limits: RpcLimits,
    valid_flags: frozenset[int] = _VALID_FLAGS,
) -> None:
    """Raise the FrameError that says what is wrong with header fields ``f``."""
    (magic, version, flags, _, _, reserved, request_id, _, mlen, plen, pcrc, _) = f
    if magic != MAGIC:
        raise FrameError(StatusCode.RPC_MALFORMED_FRAME, f"bad magic 0x{magic:08x}")
    if crc32c(buf[offset : offset + HEADER_SIZE]) != _CRC_RESIDUE:
        raise FrameError(StatusCode.RPC_MALFORMED_FRAME, "header crc mismatch")
    if version != VERSION:
        raise FrameError(StatusCode.RPC_MALFORMED_FRAME, f"unsupported version {version}", request_id)
    if flags not in valid_flags or reserved:
        raise FrameError(
            StatusCode.RPC_MALFORMED_FRAME,
            f"invalid flags 0x{flags:02x} reserved={reserved}",
            request_id,
        )
    if not flags & F_PAYLOAD_CRC and pcrc:
        raise FrameError(StatusCode.RPC_MALFORMED_FRAME, "payload crc set without its flag", request_id)
    if mlen > limits.max_message_bytes:
        raise FrameError(
            StatusCode.RPC_FRAME_TOO_LARGE,
            f"message of {mlen} bytes exceeds limit {limits.max_message_bytes}",
            request_id,
        )
    raise FrameError(
        StatusCode.RPC_FRAME_TOO_LARGE,
        f"payload of {plen} bytes exceeds limit {limits.max_payload_bytes}",
        request_id,
    )


def decode_header(buf: bytes | bytearray | memoryview, offset: int, limits: RpcLimits) -> HeaderFields:
    """Parse and validate the header at ``buf[offset:offset+HEADER_SIZE]``.

    Returns (flags, request_id, service_id, method_id, timeout_ms, message_len, payload_len,
    payload_crc). Raises :class:`FrameError`: RPC_MALFORMED_FRAME for a bad magic, CRC, version,
    flag set or reserved field; RPC_FRAME_TOO_LARGE (with the request id) for lengths beyond
    ``limits``. Nothing is believed before the CRC has been checked.
    """
    f = check_header(buf, offset, limits)
    return f[2], f[6], f[3], f[4], f[7], f[8], f[9], f[10]


def payload_crc(payload: bytes | bytearray | memoryview) -> int:
    """CRC32C of a payload, as carried in the header when Flag.PAYLOAD_CRC is set."""
    return crc32c(payload)
