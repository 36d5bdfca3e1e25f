"""The shared integration fixture: a real fs3 cluster of processes on 127.0.0.1 in a temp directory.

::

    async with Cluster(tmp_path, storage_nodes=3, chains=2) as c:   # or: c = Cluster(...); await c.start()
        client = await c.storage_client()
        await client.write(c.chain_ids[0], inode, 0, 0, b"data", 1 << 20)
        c.kill_storage(1)                                        # SIGKILL by PID
        await c.wait_chains(lambda chain: len(chain.serving) == 2)
        c.start_storage(1)                                       # same node id, ports, targets
        await c.wait_all_serving()

What :meth:`Cluster.start` does: writes a cluster secret, starts one ``fs3.mgmtd`` (lmdb store,
short lease and heartbeat timeouts), initializes the cluster, pre-registers ``storage_nodes``
storage nodes and creates their targets (node ``i`` holds target ``(i + 1) * 100 + c`` of chain
``c``, for every chain), uploads ``chains`` chains of ``replication`` targets on consecutive nodes
and chain table 1 over them, starts one ``fs3.storage`` daemon per node, and waits until routing
shows every chain with every target SERVING.

Every process runs in its own session and is killed by PID in :meth:`Cluster.stop`, also when a
test fails; logs are in ``<tmp>/<name>.log`` and :meth:`Cluster.logs` returns them for assertion
messages. Others add daemons with :meth:`Cluster.spawn` (a meta daemon, a FUSE mount), which the
same teardown kills; :attr:`Cluster.mgmtd_address`, :attr:`Cluster.secret_file` and
:attr:`Cluster.admin` are what their configs and setup need.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from fs3.client.mgmtd_client import MgmtdClient
from fs3.client.routing import ChainView, Routing, RoutingCache
from fs3.client.storage_client import RetryPolicy, StorageClient
from fs3.config import MgmtdConfig, StorageConfig
from fs3.errors import FS3Error
from fs3.net import RpcClient
from fs3.proto import common_pb2, mgmtd_pb2

REPO = Path(__file__).resolve().parents[1]

# mgmtd timings for tests: failures are noticed within a couple of seconds, with slack for a busy
# two-core machine (a heartbeat delayed past the timeout would reconfigure chains spuriously).
MGMTD_TIMING = {
    "lease_interval_s": 2.0,
    "heartbeat_timeout_s": 2.0,
    "chain_update_interval_s": 0.05,
    "client_session_timeout_s": 5.0,
    # tests that stop mgmtd expect failures noticed within the timeout as before; those of the
    # stop fence itself set it (tests/mgmtd/test_stop_fence.py)
    "stop_fence_s": 0.0,
}
STORAGE_TIMING = {
    "heartbeat_interval_s": 0.25,
    "routing_refresh_interval_s": 0.25,
    "resync_interval_s": 0.1,
    "forward_timeout_s": 20.0,
}


def _defaults(cls: type, names: tuple[str, ...]) -> dict[str, object]:
    known = {f.name: f.default for f in fields(cls)}
    return {name: known[name] for name in names}


# For benchmarks: the background intervals the daemons run with when deployed (their config
# defaults). With the test timings above each storage daemon polls mgmtd eight times a second,
# which cost an idle three-daemon cluster 41 ms of CPU per second more on the development VM.
DEPLOYED_STORAGE_TIMING = _defaults(
    StorageConfig, ("heartbeat_interval_s", "routing_refresh_interval_s", "resync_interval_s")
)
DEPLOYED_MGMTD_TIMING = _defaults(MgmtdConfig, ("heartbeat_timeout_s", "chain_update_interval_s"))


async def expect_errno(errno_: int, aw: Awaitable[object]) -> FS3Error:
    """Await ``aw``, which must fail with an FS3Error of POSIX errno ``errno_``; returns the error."""
    with pytest.raises(FS3Error) as e:
        await aw
    assert e.value.errno == errno_, e.value
    return e.value


async def wait_until(
    pred: Callable[[], Awaitable[bool] | bool],
    timeout_s: float = 20.0,
    what: str = "",
    interval_s: float = 0.05,
) -> None:
    """Poll ``pred`` until it is true; raise AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = pred()
        if asyncio.iscoroutine(r):
            r = await r
        if r:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or pred}")
        await asyncio.sleep(interval_s)


def fail_disk(target_path: Path) -> None:
    """Make a storage target's disk "fail" under a running daemon.

    Its chunk directory is removed (also for the shard-directory descriptors the engine keeps open)
    and a file stands in its way. The daemon may be creating chunk files while this runs, so the
    directory is first renamed aside (new creations by path fail at once) and the renamed tree is
    removed until it is gone: a file created in a shard directory between its listing and its
    rmdir makes that rmdir fail with ENOTEMPTY, and the next pass removes it.
    """
    chunks = target_path / "chunks"
    dead = target_path / "chunks.failed"
    os.rename(chunks, dead)
    chunks.write_text("not a directory")
    for _ in range(100):
        shutil.rmtree(dead, ignore_errors=True)
        if not dead.exists():
            return
    raise AssertionError(f"{dead} could not be removed: something keeps writing into it")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def write_config(
    path: Path, top: dict[str, object], tables: dict[str, dict[str, object]] | None = None
) -> Path:
    """Write a TOML config: top-level keys, then ``[table]`` sections."""
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for name, table in (tables or {}).items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


# Every process any Cluster started, killed at interpreter exit if a test was cut short (a timeout
# can interrupt the event loop before the cluster's own teardown runs).
_LIVE: set[Proc] = set()


@atexit.register
def _kill_leftovers() -> None:
    for p in list(_LIVE):
        if p.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.popen.pid, signal.SIGKILL)  # type: ignore[union-attr]


@dataclass(eq=False)
class Proc:
    """A daemon process the cluster started."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class StorageNode:
    """One storage daemon: its node id, targets (id -> directory), port and process."""

    index: int
    node_id: int
    targets: dict[int, Path]
    port: int = 0
    backend_port: int = 0
    metrics_port: int = 0
    proc: Proc | None = None
    config: Path | None = None


def _stop_all(procs: list[Proc]) -> None:
    """SIGTERM each of ``procs``, then SIGKILL what has not exited after a grace of 5 s."""
    for p in procs:
        if p.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
    deadline = time.monotonic() + 5.0
    for p in procs:
        if p.popen is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)


@dataclass
class Cluster:
    """mgmtd plus ``storage_nodes`` storage daemons; see the module docstring."""

    tmp: Path
    storage_nodes: int = 3
    chains: int = 1
    replication: int = 3
    sync_writes: bool = False
    backend_network: bool = False  # chain replication on a second port per storage daemon
    metrics: bool = False  # each storage daemon serves /metrics on StorageNode.metrics_port
    storage_extra: dict[str, object] = field(default_factory=dict)
    mgmtd_extra: dict[str, object] = field(default_factory=dict)
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        self.tmp = Path(self.tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.nodes: list[StorageNode] = []
        self.secret = os.urandom(24).hex().encode()
        self.secret_file = self.tmp / "cluster.secret"
        self.mgmtd_address = ""
        self.mgmtd_proc: Proc | None = None
        self.admin: MgmtdClient | None = None
        self.admin_token = ""
        self.chain_ids: list[int] = [c + 1 for c in range(self.chains)]
        self.chain_targets: dict[int, list[int]] = {}
        self._clients: list[tuple[RoutingCache, RpcClient, MgmtdClient]] = []

    # -- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout_s: float = 60.0) -> None:
        try:
            await self._start(timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, timeout_s: float) -> None:
        self.secret_file.write_bytes(self.secret)
        await self.start_mgmtd()
        bootstrap = MgmtdClient([self.mgmtd_address], cluster_secret=self.secret, timeout_s=20.0)
        try:
            self.admin_token = await bootstrap.init_cluster("test")
        finally:
            await bootstrap.close()
        self.admin = MgmtdClient(
            [self.mgmtd_address], token=self.admin_token, cluster_secret=self.secret, timeout_s=20.0
        )
        n = self.storage_nodes
        if self.replication > n:
            raise ValueError("replication exceeds the number of storage nodes")
        specs: list[mgmtd_pb2.TargetSpec] = []
        for i in range(n):
            node = StorageNode(i, 10001 + i, {})
            self.nodes.append(node)
            await self.admin.register_node(node.node_id, common_pb2.NODE_STORAGE)
        for c, chain_id in enumerate(self.chain_ids):
            tids = []
            for r in range(self.replication):
                node = self.nodes[(c + r) % n]
                tid = (node.index + 1) * 100 + chain_id
                node.targets[tid] = self.tmp / f"storage-{node.node_id}" / f"target-{tid}"
                specs.append(
                    mgmtd_pb2.TargetSpec(
                        target_id=tid, node_id=node.node_id, disk_index=len(node.targets) - 1
                    )
                )
                tids.append(tid)
            self.chain_targets[chain_id] = tids
        await self.admin.create_targets(specs)
        await self.admin.upload_chains(self.chain_targets)
        await self.admin.upload_chain_table(1, self.chain_ids)
        for node in self.nodes:
            self.start_storage(node.index)
        for node in self.nodes:
            await self._wait_port(node)
        await self.wait_all_serving(timeout_s)

    async def stop(self) -> None:
        """Close clients and kill every process by PID (SIGTERM, then SIGKILL after a grace)."""
        for routing, rpc, mgmtd in self._clients:
            with contextlib.suppress(Exception):
                await routing.stop()
            with contextlib.suppress(Exception):
                await rpc.close()
            with contextlib.suppress(Exception):
                await mgmtd.close()
        self._clients.clear()
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await self.admin.close()
            self.admin = None
        # storage daemons first, while mgmtd still takes their last heartbeat (a clean stop says
        # its targets go offline, and waits a little for mgmtd to hear it), then the rest
        storage = [p for p in self.procs if p.name.startswith("storage-")]
        for group in (storage, [p for p in self.procs if p not in storage]):
            _stop_all(group)

    # -- processes --------------------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Proc:
        """Start a process (output to ``<tmp>/<name>.log``) that :meth:`stop` will kill."""
        proc = Proc(name, argv, self.tmp / f"{name}.log")
        self._launch(proc, env)
        self.procs.append(proc)
        _LIVE.add(proc)
        return proc

    def _launch(self, proc: Proc, env: dict[str, str] | None = None) -> None:
        with open(proc.log_path, "ab") as log:
            proc.popen = subprocess.Popen(
                proc.argv,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )

    async def start_mgmtd(self) -> None:
        port_file = self.tmp / "mgmtd.port"
        port_file.unlink(missing_ok=True)
        cfg = write_config(
            self.tmp / "mgmtd.toml",
            {
                "node_id": 1,
                "listen_host": "127.0.0.1",
                "listen_port": 0,
                "cluster_secret_file": str(self.secret_file),
                **MGMTD_TIMING,
                **self.mgmtd_extra,
            },
            {"kv": {"engine": "lmdb", "path": str(self.tmp / "kv")}, "log": {"level": self.log_level}},
        )
        self.mgmtd_proc = self.spawn(
            "mgmtd", [sys.executable, "-m", "fs3.mgmtd", "--config", str(cfg), "--port-file", str(port_file)]
        )
        port = await self._read_port(port_file, self.mgmtd_proc)
        self.mgmtd_address = f"127.0.0.1:{port}"

    async def restart_mgmtd(self) -> None:
        """Start mgmtd again (after it stopped or was killed) on its old port, which clients and
        daemons know it by."""
        assert self.mgmtd_proc is not None
        port = int(self.mgmtd_address.rsplit(":", 1)[1])
        cfg = self.tmp / "mgmtd.toml"
        cfg.write_text(re.sub(r"^listen_port = \d+$", f"listen_port = {port}", cfg.read_text(), flags=re.M))
        port_file = self.tmp / "mgmtd.port"
        port_file.unlink(missing_ok=True)
        for _ in range(20):  # the old port may not be free again at once
            self._launch(self.mgmtd_proc)
            try:
                await self._read_port(port_file, self.mgmtd_proc, 30)
                return
            except RuntimeError:
                await asyncio.sleep(1)
        raise AssertionError(f"mgmtd could not be restarted on its port {port}\n{self.mgmtd_proc.log()}")

    def storage_config(self, node: StorageNode) -> Path:
        for p in node.targets.values():
            p.parent.mkdir(parents=True, exist_ok=True)  # the "disk" (storage creates the target dir)
        return write_config(
            self.tmp / f"storage-{node.node_id}.toml",
            {
                "node_id": node.node_id,
                "listen_host": "127.0.0.1",
                "listen_port": node.port,
                "mgmtd_addresses": [self.mgmtd_address],
                "cluster_secret_file": str(self.secret_file),
                "target_paths": [str(p) for p in node.targets.values()],
                "target_ids": list(node.targets),
                "sync_writes": self.sync_writes,
                "backend_port": node.backend_port,
                "metrics_port": node.metrics_port,
                "io_threads": 8,
                **STORAGE_TIMING,
                **self.storage_extra,
            },
            {"log": {"level": self.log_level}},
        )

    def start_storage(self, index: int) -> Proc:
        """Start (or restart) storage daemon ``index``; a restart reuses its port and targets."""
        node = self.nodes[index]
        if node.proc is not None and node.proc.alive():
            raise RuntimeError(f"storage {index} is running")
        if self.backend_network and not node.backend_port:
            node.backend_port = free_port()
        if self.metrics and not node.metrics_port:
            node.metrics_port = free_port()
        node.config = self.storage_config(node)
        port_file = self.tmp / f"storage-{node.node_id}.port"
        port_file.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "fs3.storage",
            "--config",
            str(node.config),
            "--port-file",
            str(port_file),
        ]
        if node.proc is None:
            node.proc = self.spawn(f"storage-{node.node_id}", argv)
        else:
            node.proc.argv = argv
            self._launch(node.proc)
        return node.proc

    async def _wait_port(self, node: StorageNode, timeout_s: float = 30.0) -> None:
        assert node.proc is not None
        node.port = await self._read_port(self.tmp / f"storage-{node.node_id}.port", node.proc, timeout_s)

    async def restart_storage(self, index: int, timeout_s: float = 30.0) -> None:
        """Start a killed storage daemon again and wait until mgmtd has heard from the new process
        (so routing no longer reflects the old one; it does not serve yet)."""
        node = self.nodes[index]
        self.start_storage(index)
        await self._wait_port(node, timeout_s)
        assert self.admin is not None and node.proc is not None and node.proc.popen is not None
        pid = node.proc.popen.pid

        async def heard() -> bool:
            nodes = await self.admin.list_nodes()  # type: ignore[union-attr]
            return any(n.node_id == node.node_id and n.pid == pid for n in nodes)

        await wait_until(heard, timeout_s, f"mgmtd to hear from the restarted storage {node.node_id}")

    def kill_storage(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) to storage daemon ``index`` and reap it."""
        proc = self.nodes[index].proc
        assert proc is not None and proc.popen is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, sig)
        if sig == signal.SIGKILL:
            proc.popen.wait(timeout=10)

    async def _read_port(self, port_file: Path, proc: Proc, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            text = _read_text(port_file)
            if text:
                return int(text)
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()[-3000:]}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} did not start in {timeout_s}s:\n{proc.log()[-3000:]}")
            await asyncio.sleep(0.05)

    def logs(self, tail: int = 4000) -> str:
        """The tail of every process's log, for assertion messages."""
        return "\n".join(f"===== {p.name} =====\n{p.log()[-tail:]}" for p in self.procs)

    # -- routing and clients ----------------------------------------------------------------------

    async def routing(self) -> Routing:
        """A fresh routing snapshot from mgmtd."""
        assert self.admin is not None
        return Routing((await self.admin.get_routing_info(0)).info)

    async def wait_chains(
        self, pred: Callable[[ChainView], bool], timeout_s: float = 30.0, what: str = ""
    ) -> Routing:
        """Wait until ``pred`` holds for every chain; return that routing."""
        found: list[Routing] = []

        async def check() -> bool:
            r = await self.routing()
            if all(cid in r.chains and pred(r.chains[cid]) for cid in self.chain_ids):
                found.append(r)
                return True
            return False

        try:
            await wait_until(check, timeout_s, what or "chains to reach a state", interval_s=0.1)
        except AssertionError as e:
            r = await self.routing()
            states = {
                cid: [(t.target_id, common_pb2.PublicTargetState.Name(t.public_state)) for t in ch.targets]
                for cid, ch in r.chains.items()
            }
            raise AssertionError(f"{e}; chains now: {states}\n{self.logs()}") from None
        return found[0]

    async def wait_all_serving(self, timeout_s: float = 30.0) -> Routing:
        """Wait until every target of every chain is SERVING and reported UPTODATE by its daemon.

        (A new chain starts with every target SERVING before any daemon has said a word; the
        daemons' startup protocol then takes each through OFFLINE and back.)
        """
        seen: list[Routing] = []

        def ready(r: Routing, cid: int) -> bool:
            ch = r.chains.get(cid)
            return (
                ch is not None
                and len(ch.serving) == len(ch.targets) == self.replication
                and all(r.targets[t].local_state == common_pb2.UPTODATE for t in ch.serving)
            )

        async def check() -> bool:
            seen.append(await self.routing())
            return all(ready(seen[-1], cid) for cid in self.chain_ids)

        try:
            await wait_until(check, timeout_s, "every target SERVING and UPTODATE", interval_s=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None
        return seen[-1]

    async def storage_client(self, retry: RetryPolicy | None = None, **kw) -> StorageClient:
        """A StorageClient (own routing cache and RPC client, closed by :meth:`stop`)."""
        mgmtd = MgmtdClient([self.mgmtd_address], cluster_secret=self.secret, timeout_s=10.0)
        routing = RoutingCache(mgmtd, refresh_interval_s=0.25, min_refresh_gap_s=0.02)
        rpc = RpcClient(self.secret, identity="test-client", connections_per_peer=2)
        self._clients.append((routing, rpc, mgmtd))
        await routing.start()
        return StorageClient(routing, rpc, retry=retry or RetryPolicy(total_s=60.0, rpc_timeout_s=10.0), **kw)

    async def scrape(self, index: int) -> str:
        """The /metrics text of storage daemon ``index`` (needs ``metrics=True``)."""
        port = self.nodes[index].metrics_port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        body = await reader.read()
        writer.close()
        return body.decode(errors="replace")

    def node_of_target(self, target_id: int) -> StorageNode:
        return next(n for n in self.nodes if target_id in n.targets)


@contextlib.contextmanager
def storage_on_tmpfs(root: Path, sizes: list[str]):  # type: ignore[no-untyped-def]
    """Mount a tmpfs of ``sizes[i]`` (e.g. "24m") at storage daemon i's directory under the
    cluster directory ``root`` (pytest skips without root); all unmounted, lazily if still busy,
    even when the test fails."""
    mounted: list[Path] = []
    try:
        for i, size in enumerate(sizes):
            d = root / f"storage-{10001 + i}"
            d.mkdir(parents=True, exist_ok=True)
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True
            )
            if r.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")
            mounted.append(d)
        yield root
    finally:
        for d in mounted:
            if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(d)], capture_output=True)
