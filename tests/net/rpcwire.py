"""Raw-socket helpers for fs3 RPC tests: build frames by hand, do the handshake by hand, read replies.

Tests use these to feed a server bytes no well-behaved client would send.
"""

from __future__ import annotations

import asyncio
import socket
import time

from fs3.net import auth
from fs3.net.frame import (
    DEFAULT_LIMITS,
    F_HANDSHAKE,
    HEADER_SIZE,
    FrameError,
    decode_header,
    encode_header,
)
from fs3.proto import common_pb2, rpc_pb2

SECRET = b"test-cluster-secret-0123456789ab"


def frame(
    flags: int,
    request_id: int,
    service_id: int,
    method_id: int,
    message: bytes,
    payload: bytes = b"",
    timeout_ms: int = 0,
) -> bytes:
    """A complete, valid frame."""
    return (
        encode_header(flags, request_id, service_id, method_id, len(message), len(payload), timeout_ms)
        + message
        + payload
    )


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes (raises EOFError on a closed connection)."""
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def read_frame(sock: socket.socket) -> tuple[tuple[int, ...], bytes, bytes]:
    """Read one frame: (header fields, message, payload)."""
    head = recv_exact(sock, HEADER_SIZE)
    hdr = decode_header(head, 0, DEFAULT_LIMITS)
    message = recv_exact(sock, hdr[5])
    payload = recv_exact(sock, hdr[6])
    return hdr, message, payload


def read_status(message: bytes) -> common_pb2.Status:
    return common_pb2.Status.FromString(message)


def wait_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Read until the peer closes; return what arrived (raises TimeoutError if it never closes)."""
    sock.settimeout(timeout)
    data = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk
    raise TimeoutError("peer did not close the connection")


def parse_frames(data: bytes) -> list[tuple[tuple[int, ...], bytes]]:
    """Split a byte string into (header, message) frames (stops at the first incomplete one)."""
    out = []
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        try:
            hdr = decode_header(data, pos, DEFAULT_LIMITS)
        except FrameError:
            break
        end = pos + HEADER_SIZE + hdr[5] + hdr[6]
        if end > len(data):
            break
        out.append((hdr, data[pos + HEADER_SIZE : pos + HEADER_SIZE + hdr[5]]))
        pos = end
    return out


def connect(address: tuple[str, int], timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def handshake(sock: socket.socket, secret: bytes = SECRET, identity: str = "raw-test") -> None:
    """Authenticate a raw socket as a client would."""
    nonce = auth.new_nonce()
    hello = rpc_pb2.ClientHello(version=auth.HANDSHAKE_VERSION, nonce=nonce, identity=identity)
    sock.sendall(frame(F_HANDSHAKE, 0, 0, auth.CLIENT_HELLO, hello.SerializeToString()))
    hdr, message, _ = read_frame(sock)
    assert hdr[3] == auth.SERVER_HELLO, hdr
    sh = rpc_pb2.ServerHello.FromString(message)
    assert auth.verify(auth.server_proof(secret, nonce, sh.nonce, identity), sh.proof)
    proof = rpc_pb2.ClientProof(proof=auth.client_proof(secret, sh.nonce, nonce, identity))
    sock.sendall(frame(F_HANDSHAKE, 0, 0, auth.CLIENT_PROOF, proof.SerializeToString()))
    hdr, _, _ = read_frame(sock)
    assert hdr[3] == auth.AUTH_OK, hdr


async def read_frame_async(reader: asyncio.StreamReader) -> tuple[tuple[int, ...], bytes, bytes]:
    """Read one frame from an asyncio stream: (header fields, message, payload)."""
    hdr = decode_header(await reader.readexactly(HEADER_SIZE), 0, DEFAULT_LIMITS)
    message = await reader.readexactly(hdr[5])
    payload = await reader.readexactly(hdr[6])
    return hdr, message, payload


async def accept_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes = SECRET
) -> None:
    """Play the server's part of the handshake on an asyncio stream (for fake servers)."""
    _, message, _ = await read_frame_async(reader)
    hello = rpc_pb2.ClientHello.FromString(message)
    nonce = auth.new_nonce()
    proof = auth.server_proof(secret, hello.nonce, nonce, hello.identity)
    reply = rpc_pb2.ServerHello(version=auth.HANDSHAKE_VERSION, nonce=nonce, proof=proof)
    writer.write(frame(F_HANDSHAKE, 0, 0, auth.SERVER_HELLO, reply.SerializeToString()))
    await read_frame_async(reader)  # the client's proof; a fake server takes it on trust
    writer.write(frame(F_HANDSHAKE, 0, 0, auth.AUTH_OK, b""))
    await writer.drain()
