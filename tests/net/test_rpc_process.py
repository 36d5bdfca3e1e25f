"""A server in a separate process: calls across processes, SIGKILL, restart, reconnect."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from rpcwire import SECRET

from fs3.errors import FS3Error
from fs3.net import RpcClient
from fs3.net.system import ECHO, PING
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)


class ServerProcess:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def start(self, listen: str = "127.0.0.1:0") -> tuple[str, int]:
        env = dict(os.environ, FS3_CLUSTER_SECRET=SECRET.decode())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fs3.net", "serve", "--listen", listen, "--identity", "subprocess"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the server prints its address once it listens
        if not line.startswith("listening "):
            raise RuntimeError(f"server did not start: {line!r}")
        host, port = line.split()[1].rsplit(":", 1)
        return host, int(port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc


@pytest.fixture
def server_process() -> Iterator[ServerProcess]:
    sp = ServerProcess()
    try:
        yield sp
    finally:
        sp.kill()


async def test_calls_to_a_server_process_and_reconnect_after_sigkill(server_process: ServerProcess) -> None:
    address = await asyncio.to_thread(server_process.start)
    async with RpcClient(SECRET) as client:
        response, _ = await client.call(address, PING, rpc_pb2.PingRequest())
        assert response.identity == "subprocess"
        data = os.urandom(3 << 20)
        _, payload = await client.call(address, ECHO, rpc_pb2.EchoRequest(), payload=data)
        assert hashlib.sha256(payload).digest() == hashlib.sha256(data).digest()

        server_process.kill()
        with pytest.raises(FS3Error) as e:
            await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        assert e.value.retryable

        await asyncio.to_thread(server_process.start, f"{address[0]}:{address[1]}")
        # the pool reconnects on the next call; retry while the old connection's loss is noticed
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                response, _ = await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
                break
            except FS3Error as err:
                if not err.retryable or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.01)
        assert response.identity == "subprocess"


def test_command_line_ping_and_clean_shutdown(server_process: ServerProcess) -> None:
    host, port = server_process.start()
    env = dict(os.environ, FS3_CLUSTER_SECRET=SECRET.decode())
    out = subprocess.run(
        [sys.executable, "-m", "fs3.net", "ping", f"{host}:{port}", "--count", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("subprocess in") == 2
    bad = subprocess.run(
        [sys.executable, "-m", "fs3.net", "ping", f"{host}:{port}"],
        env=dict(os.environ, FS3_CLUSTER_SECRET="wrong-secret-wrong-secret"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 1 and "RPC_AUTH_FAILED" in bad.stderr
    for flags in (["--timeout", "-1"], ["--timeout", "nan"], ["--count", "0"]):
        refused = subprocess.run(
            [sys.executable, "-m", "fs3.net", "ping", f"{host}:{port}", *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert refused.returncode == 2 and "must be a" in refused.stderr, (flags, refused.stderr)
    assert server_process.terminate() == 0
