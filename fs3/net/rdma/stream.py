"""Frames over a stream of SENDs: what the sender puts in the stream and how the receiver cuts it up.

The bytes of a frame (the :mod:`fs3.net.frame` header, the message, and either the payload itself or
a 16-byte :class:`~fs3.net.rdma.wire.RemoteBuffer` descriptor when the payload is larger than the
peer's ``inline_max``) form one byte stream, cut into SENDs of at most a receive buffer each. So
messages of any size fit, many small frames share one SEND, and the receiver finds frame boundaries
exactly as the TCP transport does.
"""

from __future__ import annotations

from dataclasses import dataclass

from fs3.net.frame import (
    H_MESSAGE_LEN,
    H_PAYLOAD_LEN,
    HEADER_SIZE,
    RpcLimits,
    check_header,
)
from fs3.net.rdma.wire import DESCRIPTOR_SIZE


@dataclass(slots=True)
class ParsedFrame:
    """One frame cut from the stream: header fields (``check_header`` indices), the message, and the
    inline payload or the descriptor of a payload to pull (exactly one of them when a payload exists)."""

    header: tuple[int, ...]
    message: bytes
    payload: bytes | None
    descriptor: bytes | None


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
            self._hdr = check_header(buf, self._pos, limits)
            self._pos += HEADER_SIZE
            avail -= HEADER_SIZE
        hdr = self._hdr
        mlen = hdr[H_MESSAGE_LEN]
        plen = hdr[H_PAYLOAD_LEN]
        pulled = plen > self.inline_max
        tail = DESCRIPTOR_SIZE if pulled else plen
        if avail < mlen + tail:
            return None
        p = self._pos
        message = bytes(buf[p : p + mlen])
        rest = bytes(buf[p + mlen : p + mlen + tail]) if tail else None
        self._pos = p + mlen + tail
        self._hdr = None
        # Keep the buffer from growing without bound on a busy connection: drop what was consumed.
        if self._pos > 1 << 20:
            del buf[: self._pos]
            self._pos = 0
        if pulled:
            return ParsedFrame(hdr, message, None, rest)
        return ParsedFrame(hdr, message, rest if plen else None, None)

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame is buffered."""
        return self._hdr is not None or self._pos < len(self._buf)
