"""Connections without the cluster secret are refused, with a logged reason, on both sides."""

from __future__ import annotations

import asyncio

import pytest
import rpcwire
from rpc_fixtures import TEST_LIMITS, TEST_SERVICE, ThreadedServer, poll
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer, auth
from fs3.net.frame import F_ERROR, F_HANDSHAKE, F_REQUEST
from fs3.net.system import ECHO, PING
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)


async def test_wrong_secret_is_refused(rpc_server: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    async with RpcClient(b"not-the-cluster-secret!", limits=TEST_LIMITS) as client:
        with pytest.raises(FS3Error) as e:
            await client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    # the server proves itself first, so the client already sees the mismatch
    assert e.value.code == StatusCode.RPC_AUTH_FAILED
    # the client's secret is the wrong one here: the message must not blame the server
    assert "different cluster secret" in e.value.message and "does not know" not in e.value.message
    await poll(lambda: rpc_server.connection_count == 0, what="the refused connection to close")
    messages = [r.getMessage() for r in caplog.records]
    assert any("server failed to prove the cluster secret" in m for m in messages)
    assert any("connection closed during handshake" in m for m in messages)


async def test_server_refuses_a_client_proof_made_with_another_secret(
    rpc_server: RpcServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A client that skips checking the server (as an attacker would) still cannot get in.
    loop = asyncio.get_running_loop()

    def attempt() -> tuple[int, int]:
        with rpcwire.connect(rpc_server.address) as sock:
            nonce = auth.new_nonce()
            hello = rpc_pb2.ClientHello(version=1, nonce=nonce, identity="mallory")
            sock.sendall(rpcwire.frame(F_HANDSHAKE, 0, 0, auth.CLIENT_HELLO, hello.SerializeToString()))
            _, message, _ = rpcwire.read_frame(sock)
            sh = rpc_pb2.ServerHello.FromString(message)
            proof = auth.client_proof(b"guessed-secret-guessed-secret", sh.nonce, nonce, "mallory")
            sock.sendall(
                rpcwire.frame(
                    F_HANDSHAKE, 0, 0, auth.CLIENT_PROOF, rpc_pb2.ClientProof(proof=proof).SerializeToString()
                )
            )
            sock.sendall(rpcwire.frame(F_REQUEST, 1, 0, PING.id, b""))
            hdr, message, _ = rpcwire.read_frame(sock)
            rest = rpcwire.wait_closed(sock)
            assert not rest  # nothing after the refusal: the ping was never served
            return hdr[0], rpcwire.read_status(message).code

    flags, code = await loop.run_in_executor(None, attempt)
    assert flags & F_HANDSHAKE and flags & F_ERROR and code == StatusCode.RPC_AUTH_FAILED
    assert any(
        "wrong cluster secret" in r.getMessage() and "mallory" in r.getMessage() for r in caplog.records
    )
    # and proper clients are unaffected
    async with RpcClient(SECRET) as client:
        await client.call(rpc_server.address, PING, rpc_pb2.PingRequest())


def test_requests_before_the_handshake_are_refused(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        sock.sendall(rpcwire.frame(F_REQUEST, 1, 0, PING.id, b""))
        hdr, message, _ = rpcwire.read_frame(sock)
        assert hdr[0] & F_ERROR and rpcwire.read_status(message).code == StatusCode.RPC_AUTH_FAILED
        assert rpcwire.wait_closed(sock) == b""
    assert threaded_server.ping().identity == "threaded"


@pytest.mark.parametrize(
    "hello",
    [
        rpc_pb2.ClientHello(version=2, nonce=b"n" * 32, identity="x"),
        rpc_pb2.ClientHello(version=1, nonce=b"short", identity="x"),
        rpc_pb2.ClientHello(version=1, nonce=b"n" * 32, identity="i" * 300),
    ],
    ids=["version", "nonce", "identity"],
)
def test_malformed_hello_is_refused(threaded_server: ThreadedServer, hello: rpc_pb2.ClientHello) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        sock.sendall(rpcwire.frame(F_HANDSHAKE, 0, 0, auth.CLIENT_HELLO, hello.SerializeToString()))
        hdr, message, _ = rpcwire.read_frame(sock)
        assert hdr[0] & F_ERROR and rpcwire.read_status(message).code == StatusCode.RPC_AUTH_FAILED
        rpcwire.wait_closed(sock)


def test_silent_client_is_dropped_after_the_handshake_timeout(
    threaded_server: ThreadedServer, caplog: pytest.LogCaptureFixture
) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        hdr, message, _ = rpcwire.read_frame(sock)  # blocks until the server gives up on us
        assert rpcwire.read_status(message).code == StatusCode.RPC_AUTH_FAILED
        rpcwire.wait_closed(sock)
    assert any("handshake timeout" in r.getMessage() for r in caplog.records)


async def test_client_identity_reaches_handlers(rpc_server: RpcServer) -> None:
    async with RpcClient(SECRET, identity="storage-3") as client:
        handlers = rpc_server.handlers  # type: ignore[attr-defined]
        handlers.gate.set()
        await client.call(rpc_server.address, TEST_SERVICE["Block"], rpc_pb2.EchoRequest())
        assert handlers.contexts[-1].identity == "storage-3"


def test_a_request_right_behind_the_proof_gets_full_limits(threaded_server: ThreadedServer) -> None:
    # The proof widens the connection's limits; a request pipelined in the same write is judged by
    # the widened ones.
    with rpcwire.connect(threaded_server.address) as sock:
        nonce = auth.new_nonce()
        hello = rpc_pb2.ClientHello(version=1, nonce=nonce, identity="eager")
        sock.sendall(rpcwire.frame(F_HANDSHAKE, 0, 0, auth.CLIENT_HELLO, hello.SerializeToString()))
        _, message, _ = rpcwire.read_frame(sock)
        sh = rpc_pb2.ServerHello.FromString(message)
        proof = rpc_pb2.ClientProof(proof=auth.client_proof(SECRET, sh.nonce, nonce, "eager"))
        payload = bytes(range(256)) * 400
        sock.sendall(
            rpcwire.frame(F_HANDSHAKE, 0, 0, auth.CLIENT_PROOF, proof.SerializeToString())
            + rpcwire.frame(F_REQUEST, 1, 0, ECHO.id, b"", payload)
        )
        hdr, _, _ = rpcwire.read_frame(sock)
        assert hdr[0] & F_HANDSHAKE and hdr[3] == auth.AUTH_OK
        hdr, _, echoed = rpcwire.read_frame(sock)
        assert hdr[1] == 1 and not hdr[0] & F_ERROR and echoed == payload
