"""A whole fs3 cluster for client and FUSE tests: the shared :class:`Cluster` (mgmtd and storage
daemons) plus meta daemons, client configs and FUSE mounts, all torn down by :meth:`FsCluster.stop`
even when a test fails (mounts are lazily unmounted, every process killed by PID).

::

    async with FsCluster(tmp_path) as c:
        fs = await c.connect()                       # fs3.client.FileSystem, closed by stop()
        mnt = await c.mount(tmp_path / "mnt")        # `fs3 mount` in the foreground, as a process
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster import Cluster, Proc, wait_until, write_config

from fs3.client.filesystem import FileSystem, meta_addresses
from fs3.config import ClientConfig, load_config


def is_mounted(path: Path) -> bool:
    target = str(Path(path).resolve())
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def force_unmount(path: Path) -> None:
    """Unmount ``path`` whatever state its daemon is in (fusermount3 -u, then a lazy umount)."""
    for argv in (["fusermount3", "-u", "-q", str(path)], ["umount", "-l", str(path)]):
        if not is_mounted(path):
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=10)


@dataclass
class Mount:
    """A running ``fs3 mount`` process."""

    path: Path
    proc: Proc
    config: Path

    def unmount(self, timeout_s: float = 20.0) -> int:
        """``fusermount3 -u`` and wait for the daemon to exit; returns its exit status. Retried
        while it fails and the file system is still mounted: busy for a moment after a close (the
        kernel sends RELEASE after close(2) returns), more so on a loaded machine. A daemon that
        does not exit is asked where it is (SIGUSR1, SIGUSR2: its log gets every task's and thread's
        stack), killed, and reported with the end of its log."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run(
                ["fusermount3", "-u", str(self.path)], capture_output=True, timeout=timeout_s
            )
            if done.returncode == 0 or not is_mounted(self.path) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        popen = self.proc.popen
        assert popen is not None
        try:
            return popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        os.kill(popen.pid, signal.SIGUSR1)  # every task's stack, to the log (a loop that runs)
        time.sleep(2.0)
        os.kill(popen.pid, signal.SIGUSR2)  # every thread's, to standard error (one that is blocked)
        time.sleep(0.5)
        os.kill(popen.pid, signal.SIGKILL)
        force_unmount(self.path)
        with contextlib.suppress(subprocess.TimeoutExpired):  # one in D state dies once unmounted
            popen.wait(timeout=10)
        raise AssertionError(
            f"the mount at {self.path} did not exit within {timeout_s} s of fusermount3 -u (its last "
            f"status {done.returncode}: {done.stderr.decode(errors='replace').strip()}); its log "
            f"ends:\n{self.proc.log()[-12000:]}"
        )


@dataclass
class FsCluster:
    """mgmtd + ``metas`` meta daemons + ``storage_nodes`` storage daemons; see the module docstring."""

    tmp: Path
    metas: int = 1
    storage_nodes: int = 3
    chains: int = 3
    replication: int = 3
    stripe: int = 3
    chunk_size: int = 1 << 20
    log_level: str = "INFO"
    storage_extra: dict[str, object] = field(default_factory=dict)  # more storage config keys
    mgmtd_extra: dict[str, object] = field(default_factory=dict)  # more mgmtd config keys
    meta_extra: dict[str, object] = field(default_factory=dict)  # more meta config keys
    meta_procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tmp = Path(self.tmp)
        self.cluster = Cluster(
            self.tmp,
            storage_nodes=self.storage_nodes,
            chains=self.chains,
            replication=self.replication,
            log_level=self.log_level,
            storage_extra=self.storage_extra,
            mgmtd_extra=self.mgmtd_extra,
        )
        self.meta_ports: list[int] = []
        self.mounts: list[Mount] = []
        self._clients: list[FileSystem] = []

    async def __aenter__(self) -> FsCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout_s: float = 60.0) -> None:
        try:
            await self.cluster.start(timeout_s)
            for i in range(self.metas):
                self.start_meta(i)
            for i in range(self.metas):
                port_file = self.tmp / f"meta-{i}.port"
                self.meta_ports.append(await self.cluster._read_port(port_file, self.meta_procs[i]))

            async def registered() -> bool:
                return len(meta_addresses(await self.cluster.routing())) >= self.metas

            await wait_until(registered, timeout_s, "meta daemons in routing")
        except BaseException:
            await self.stop()
            raise

    def start_meta(self, index: int) -> Proc:
        cfg = write_config(
            self.tmp / f"meta-{index}.toml",
            {
                "node_id": 100 + index,
                "listen_host": "127.0.0.1",
                "listen_port": self.meta_ports[index] if index < len(self.meta_ports) else 0,
                "mgmtd_addresses": [self.cluster.mgmtd_address],
                "cluster_secret_file": str(self.cluster.secret_file),
                "authenticate": False,
                "gc_interval_s": 0.5,
                "default_stripe": self.stripe,
                "default_chunk_size": self.chunk_size,
                **self.meta_extra,
            },
            {
                "kv": {"engine": "lmdb", "path": str(self.tmp / "meta-kv"), "map_size": 1 << 30},
                "log": {"level": self.log_level},
            },
        )
        port_file = self.tmp / f"meta-{index}.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "fs3.meta", "--config", str(cfg), "--port-file", str(port_file)]
        if index < len(self.meta_procs):
            proc = self.meta_procs[index]
            proc.argv = argv
            self.cluster._launch(proc)
        else:
            proc = self.cluster.spawn(f"meta-{index}", argv)
            self.meta_procs.append(proc)
        return proc

    def kill_meta(self, index: int) -> None:
        popen = self.meta_procs[index].popen
        assert popen is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10)

    def client_config(self, name: str = "client", **overrides: object) -> Path:
        """A client TOML config for this cluster (``overrides`` are top-level keys)."""
        top: dict[str, object] = {
            "mgmtd_addresses": [self.cluster.mgmtd_address],
            "cluster_secret_file": str(self.cluster.secret_file),
            "rpc_timeout_s": 20.0,
            **overrides,
        }
        return write_config(self.tmp / f"{name}.toml", top, {"log": {"level": self.log_level}})

    async def connect(self, **overrides: object) -> FileSystem:
        """A FileSystem over this cluster (closed by :meth:`stop`)."""
        cfg = load_config(ClientConfig, self.client_config(**overrides))
        fs = await FileSystem.connect(cfg, timeout_s=30.0)
        self._clients.append(fs)
        return fs

    async def mount(
        self, path: Path, name: str = "mount", timeout_s: float = 30.0, **overrides: object
    ) -> Mount:
        """Start ``fs3 mount path --foreground`` and wait until the mount is up."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = self.client_config(name, **overrides)
        argv = [
            sys.executable,
            "-m",
            "fs3.cli.main",
            "mount",
            str(path),
            "--config",
            str(cfg),
            "--foreground",
        ]
        proc = self.cluster.spawn(name, argv)
        mnt = Mount(path, proc, cfg)
        self.mounts.append(mnt)

        def up() -> bool:
            if not proc.alive():
                raise AssertionError(f"{name} exited with {proc.popen.returncode}:\n{proc.log()[-3000:]}")  # type: ignore[union-attr]
            return is_mounted(path)

        await wait_until(up, timeout_s, f"{path} to be mounted")
        return mnt

    async def stop(self) -> None:
        # a client made in another event loop (a test's own, with this cluster a fixture of a
        # longer-lived loop) cannot be closed here: the test that made it must close it
        foreign: list[str] = []
        for fs in self._clients:
            try:
                await asyncio.wait_for(fs.close(), 10)
            except Exception as e:  # noqa: BLE001 - else a client of a test that already failed
                if isinstance(e, RuntimeError) and "another event loop" in str(e):
                    foreign.append(str(e))
        self._clients.clear()
        for mnt in self.mounts:
            if mnt.proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(mnt.proc.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        for mnt in self.mounts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                mnt.proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))  # type: ignore[union-attr]
            force_unmount(mnt.path)
        await self.cluster.stop()
        for mnt in self.mounts:
            force_unmount(mnt.path)
        if foreign:
            raise RuntimeError(f"{len(foreign)} client(s) left open by a test in its own loop: {foreign[0]}")

    def logs(self, tail: int = 4000) -> str:
        return self.cluster.logs(tail)
