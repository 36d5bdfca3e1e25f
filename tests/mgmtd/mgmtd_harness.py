"""Helpers for mgmtd tests: in-process servers over the mem engine, real processes over lmdb,
fake storage nodes, and polling with deadlines."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from cluster import free_port
from cluster import wait_until as _wait_until

from fs3.client.mgmtd_client import MgmtdClient
from fs3.config import KvConfig, MgmtdConfig
from fs3.kv.base import Database
from fs3.mgmtd.server import MgmtdServer
from fs3.proto import common_pb2, mgmtd_pb2

REPO = Path(__file__).resolve().parents[2]

# Short intervals so that failure detection and failover take well under a second in tests.
FAST = {
    "lease_interval_s": 0.8,
    "heartbeat_timeout_s": 1.0,
    "chain_update_interval_s": 0.05,
    "client_session_timeout_s": 1.0,
    # a stopped server's successor fails silent nodes within the timeout, as these tests expect
    # (test_stop_fence.py sets it)
    "stop_fence_s": 0.0,
}


async def wait_until(
    pred: Callable[[], Awaitable[bool] | bool], timeout_s: float = 10.0, what: str = ""
) -> None:
    """cluster.wait_until, polling faster (failover here takes well under a second)."""
    await _wait_until(pred, timeout_s, what, interval_s=0.02)


def mgmtd_config(node_id: int = 1, port: int = 0, **overrides) -> MgmtdConfig:
    kv = overrides.pop("kv", KvConfig(engine="mem"))
    host = overrides.pop("listen_host", "127.0.0.1")
    return MgmtdConfig(node_id=node_id, listen_host=host, listen_port=port, kv=kv, **{**FAST, **overrides})


@dataclass
class InProcess:
    """mgmtd servers in this process sharing one store, and clients to close afterwards."""

    db: Database
    servers: list[MgmtdServer] = field(default_factory=list)
    clients: list[MgmtdClient] = field(default_factory=list)

    async def start(self, node_id: int = 1, *, secret: bytes | None = None, **overrides) -> MgmtdServer:
        server = MgmtdServer(mgmtd_config(node_id, **overrides), self.db, secret=secret)
        await server.start()
        self.servers.append(server)
        return server

    def client(self, servers: list[MgmtdServer] | None = None, **kw) -> MgmtdClient:
        addresses = [s.address for s in (servers or self.servers)]
        c = MgmtdClient(addresses, timeout_s=kw.pop("timeout_s", 5.0), **kw)
        self.clients.append(c)
        return c

    async def primary(self, timeout_s: float = 5.0) -> MgmtdServer:
        await wait_until(lambda: any(s.is_primary() for s in self.servers), timeout_s, "a primary")
        return next(s for s in self.servers if s.is_primary())


@dataclass
class Admin:
    """A primary with an initialized cluster and an admin client."""

    env: InProcess
    server: MgmtdServer
    client: MgmtdClient
    token: str


def endpoint(port: int = 9000) -> common_pb2.Endpoint:
    return common_pb2.Endpoint(host="127.0.0.1", port=port, transport="tcp")


def storage_heartbeat(
    node_id: int, sequence: int, chain_version: int = 1 << 40, routing_version: int = 1 << 40
) -> mgmtd_pb2.HeartbeatRequest:
    """A heartbeat of storage node ``node_id`` with its one target ``node_id + 100`` UPTODATE,
    acting on ``chain_version`` of its chain and on ``routing_version`` (by default any)."""
    return mgmtd_pb2.HeartbeatRequest(
        node_id=node_id,
        type=common_pb2.NODE_STORAGE,
        incarnation=1,
        sequence=sequence,
        routing_version=routing_version,
        targets=[
            mgmtd_pb2.TargetHeartbeat(
                target_id=node_id + 100, local_state=common_pb2.UPTODATE, chain_version=chain_version
            )
        ],
    )


class StorageNode:
    """A fake storage daemon: registers, and heartbeats with increasing sequence numbers."""

    def __init__(self, client: MgmtdClient, node_id: int, targets: list[int]) -> None:
        self.client = client
        self.node_id = node_id
        self.incarnation = time.time_ns()
        self.sequence = 0
        self.local = {t: common_pb2.UPTODATE for t in targets}
        self.chain_version: dict[int, int] = {}
        self.low_space: set[int] = set()  # targets it reports low on space

    async def register(self) -> None:
        await self.client.register_node(
            self.node_id, common_pb2.NODE_STORAGE, [endpoint(9000 + self.node_id)]
        )

    def request(self) -> mgmtd_pb2.HeartbeatRequest:
        self.sequence += 1
        return mgmtd_pb2.HeartbeatRequest(
            node_id=self.node_id,
            type=common_pb2.NODE_STORAGE,
            incarnation=self.incarnation,
            sequence=self.sequence,
            routing_version=1 << 40,
            targets=[
                mgmtd_pb2.TargetHeartbeat(
                    target_id=t,
                    local_state=s,
                    chain_version=self.chain_version.get(t, 1 << 40),
                    used_bytes=123,
                    low_space=t in self.low_space,
                )
                for t, s in self.local.items()
            ],
        )

    async def heartbeat(self) -> mgmtd_pb2.HeartbeatReply:
        return await self.client.heartbeat(self.request())


@dataclass
class Proc:
    """A real mgmtd process."""

    node_id: int
    port: int
    popen: subprocess.Popen
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class ProcessCluster:
    """Real mgmtd processes over one lmdb directory; all are killed by PID at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []

    def write_config(self, node_id: int, port: int, **extra) -> Path:
        lines = [
            f"node_id = {node_id}",
            'listen_host = "127.0.0.1"',
            f"listen_port = {port}",
        ]
        for k, v in {**FAST, **extra}.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
        lines += ["[kv]", 'engine = "lmdb"', f'path = "{self.tmp / "kv"}"', "[log]", 'level = "INFO"']
        path = self.tmp / f"mgmtd-{node_id}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, node_id: int, **extra) -> Proc:
        port = free_port()
        cfg = self.write_config(node_id, port, **extra)
        log_path = self.tmp / f"mgmtd-{node_id}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "fs3.mgmtd", "--config", str(cfg)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Proc(node_id, port, popen, log_path)
        self.procs.append(proc)
        return proc

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, sig)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
