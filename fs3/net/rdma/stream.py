"""Frames over a stream of SENDs: what the sender puts in the stream and how the receiver cuts it up.

The bytes of a frame (the :mod:`fs3.net.frame` header, the message, and either the payload itself or
a 16-byte :class:`~fs3.net.rdma.wire.RemoteBuffer` descriptor when the payload is larger than the
peer's ``inline_max``) form one byte stream, cut into SENDs of at most a receive buffer each. So
messages of any size fit, many small frames share one SEND, and the receiver finds frame boundaries
exactly as the TCP transport does.

A request whose caller wants the reply's payload in a buffer of its own may name that buffer: the
header has Flag.SINK and a second descriptor (:func:`~fs3.net.rdma.wire.pack_sink`) follows the
message and payload. The server may then RDMA WRITE the reply's payload there (a reply payload the
client would otherwise pull): the reply's descriptor then has token 0 (:data:`~fs3.net.rdma.wire.
WRITTEN`), which no pulled payload has, and says the bytes are already in the caller's buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from fs3.net.frame import (
    F_SINK,
    H_FLAGS,
    H_MESSAGE_LEN,
    H_PAYLOAD_LEN,
    HEADER_SIZE,
    VALID_FLAGS_RDMA,
    RpcLimits,
    check_header,
)
from fs3.net.rdma.wire import DESCRIPTOR_SIZE


@dataclass(slots=True)
class ParsedFrame:
    """One frame cut from the stream: header fields (``check_header`` indices), the message, the
    inline payload or the descriptor of a payload to pull (exactly one of them when a payload
    exists), and the descriptor of the reply buffer a request names (Flag.SINK)."""

    header: tuple[int, ...]
    message: bytes
    payload: bytes | None
    descriptor: bytes | None
    sink: bytes | None = None


class StreamAssembler:
    """Collects stream bytes and returns whole frames; validates each header before believing it.

    ``inline_max`` is what this side advertised: payloads up to it arrive inline, larger ones as
    descriptors. Raises :class:`fs3.net.frame.FrameError` for a bad header (the connection is then
    unusable: the stream has no other resynchronisation point).
    """

    def __init__(self, inline_max: int) -> None:
        self.inline_max = inline_max
        self._buf = bytearray()
        self._pos = 0
        self._hdr: tuple[int, ...] | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received stream bytes."""
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_frame(self, limits: RpcLimits) -> ParsedFrame | None:
        """The next complete frame, or None until more bytes arrive."""
        buf = self._buf
        avail = len(buf) - self._pos
        if self._hdr is None:
            if avail < HEADER_SIZE:
                return None
            self._hdr = check_header(buf, self._pos, limits, VALID_FLAGS_RDMA)
            self._pos += HEADER_SIZE
            avail -= HEADER_SIZE
        hdr = self._hdr
        mlen = hdr[H_MESSAGE_LEN]
        plen = hdr[H_PAYLOAD_LEN]
        pulled = plen > self.inline_max
        tail = DESCRIPTOR_SIZE if pulled else plen
        sink_len = DESCRIPTOR_SIZE if hdr[H_FLAGS] & F_SINK else 0
        if avail < mlen + tail + sink_len:
            return None
        p = self._pos
        message = bytes(buf[p : p + mlen])
        rest = bytes(buf[p + mlen : p + mlen + tail]) if tail else None
        p += mlen + tail
        sink = bytes(buf[p : p + sink_len]) if sink_len else None
        self._pos = p + sink_len
        self._hdr = None
        # Keep the buffer from growing without bound on a busy connection: drop what was consumed.
        if self._pos > 1 << 20:
            del buf[: self._pos]
            self._pos = 0
        if pulled:
            return ParsedFrame(hdr, message, None, rest, sink)
        return ParsedFrame(hdr, message, rest if plen else None, None, sink)

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame is buffered."""
        return self._hdr is not None or self._pos < len(self._buf)
