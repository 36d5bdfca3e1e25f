"""A mount without the cluster secret (``user_auth = true``): a user mounts fs3 with its own token,
and whoever uses the mount acts as that user at meta; storage serves it through the capabilities
its opens bring."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cluster import free_port
from fs_cluster import FsCluster, force_unmount

from fs3.client.filesystem import FileSystem

pytestmark = pytest.mark.timeout(180)

ALICE = 1000


def _pread(path: Path, length: int, offset: int) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), length, offset)


def _capability_calls(metrics_port: int) -> float:
    """How many Capability calls meta served (renewals: capabilities not brought by an open)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("fs3_meta_requests_total{") and 'method="Capability"' in line
    )


async def _alice(c: FsCluster, tmp: Path) -> tuple[FileSystem, Path]:
    """The admin's client (a cluster member) and the token file of alice, who owns /alice."""
    assert c.cluster.admin is not None
    admin_token, token = tmp / "admin.token", tmp / "alice.token"
    admin_token.write_text(c.cluster.admin_token)
    token.write_text(await c.cluster.admin.add_user(ALICE, "alice", gid=ALICE))
    admin = await c.connect(name="client-admin", token_file=str(admin_token))
    await admin.mkdir("/alice", 0o755)
    await admin.chown("/alice", ALICE, ALICE)
    return admin, token


async def test_a_mount_on_a_users_token_acts_as_that_user(tmp_path: Path) -> None:
    metrics_port = free_port()
    meta_extra = {"authenticate": True, "metrics_port": metrics_port}
    async with FsCluster(
        tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1, meta_extra=meta_extra
    ) as c:
        admin, token = await _alice(c, tmp_path)
        mnt = await c.mount(tmp_path / "mnt", user_auth=True, token_file=str(token), cluster_secret_file="")

        # root on this host writes through the mount: the file is alice's, its bytes on storage
        data = os.urandom(3 << 20)
        path = mnt.path / "alice" / "f"
        await asyncio.to_thread(path.write_bytes, data)
        assert os.stat(path).st_uid == ALICE
        assert await admin.read_file("/alice/f") == data
        assert await asyncio.to_thread(_pread, path, 1 << 20, 1 << 20) == data[1 << 20 : 2 << 20]
        # and meta refuses what alice may not do, whoever the kernel says asks
        with pytest.raises(PermissionError):
            await asyncio.to_thread((mnt.path / "rootfile").write_bytes, b"x")
        await admin.write_file("/private", b"root only", perm=0o600)
        with pytest.raises(PermissionError):
            await asyncio.to_thread((mnt.path / "private").read_bytes)
        # every read and write went with the capability its open brought: none was asked for again
        assert _capability_calls(metrics_port) == 0


async def test_a_users_mount_keeps_the_handles_of_what_the_kernel_holds(tmp_path: Path) -> None:
    """Meta asks a non-root user's requests for a handle of each inode they name by id; the mount
    keeps the handles of inodes the kernel holds (looked up and not yet forgotten: an open
    directory, an open file) however many others it meets beyond ``inode_handles``."""
    async with FsCluster(
        tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1, meta_extra={"authenticate": True}
    ) as c:
        admin, token = await _alice(c, tmp_path)
        mnt = await c.mount(
            tmp_path / "mnt", user_auth=True, token_file=str(token), cluster_secret_file="", inode_handles=20
        )

        def work() -> tuple[list[str], bytes]:
            held, many = mnt.path / "alice" / "held", mnt.path / "alice" / "many"
            held.mkdir()
            many.mkdir()
            (held / "a").write_bytes(b"a")
            fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with open(held / "out", "wb") as out:
                    out.write(b"x" * 5000)
                    out.flush()
                    for n in range(100):  # 100 inodes met, far more than 20
                        (many / f"f{n}").write_bytes(b"m")
                    assert sum(p.stat().st_size for p in many.iterdir()) == 100
                    drop = Path("/proc/sys/vm/drop_caches")
                    if os.access(drop, os.W_OK):
                        drop.write_text("2\n")  # the kernel forgets what it does not hold
                    assert len(os.listdir(many)) == 100  # looked up again
                    time.sleep(1.2)  # past attr_timeout_s: the kernel asks for attributes again
                    assert os.fstat(fd).st_uid == ALICE
                    out.write(b"y" * 5000)
                return sorted(os.listdir(fd)), (held / "out").read_bytes()
            finally:
                os.close(fd)

        names, data = await asyncio.to_thread(work)
        assert names == ["a", "out"] and data == b"x" * 5000 + b"y" * 5000
        assert (await admin.stat("/alice/held/out")).st_size == 10_000


async def test_a_member_mount_on_a_non_root_token_is_refused_at_start(tmp_path: Path) -> None:
    """A mount that holds the cluster secret sends each caller's uid with its token, and meta acts
    on a non-root token only for its own uid: such a mount (the deploy guide once said to make one)
    came up and then gave every user EACCES, root and the token's user alike, logging nothing. It
    is refused at start, saying why; with a root token the mount works."""
    async with FsCluster(
        tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1, meta_extra={"authenticate": True}
    ) as c:
        admin, token = await _alice(c, tmp_path)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        argv = [sys.executable, "-m", "fs3.cli.main", "mount", str(mnt), "--foreground", "--config"]

        async def mount_once(cfg: Path) -> subprocess.CompletedProcess[str]:
            """``fs3 mount`` of ``cfg`` in the foreground, expected to refuse at start."""
            try:
                return await asyncio.to_thread(
                    subprocess.run, [*argv, str(cfg)], capture_output=True, text=True, timeout=60
                )
            finally:
                force_unmount(mnt)  # should it have come up (and been killed by the timeout)

        cfg = c.client_config("member", token_file=str(token))
        r = await mount_once(cfg)
        assert r.returncode == 2, r.stderr  # a config to mend: the unit does not restart it
        assert "acts only for uid 1000 (alice)" in r.stderr and "--root" in r.stderr, r.stderr
        # no token at all: meta (which authenticates) would refuse every request as well
        cfg = c.client_config("member-without-token", token_file="")
        r = await mount_once(cfg)
        assert r.returncode == 2 and "without a user token" in r.stderr, r.stderr
        # a secret file that is not the cluster's: 2 as well (it was 1, which the unit restarts
        # every few seconds for ever), as meta and storage exit for it
        wrong = tmp_path / "wrong.secret"
        wrong.write_text("w" * 32 + "\n")
        cfg = c.client_config("wrong-secret", token_file=str(token), cluster_secret_file=str(wrong))
        r = await mount_once(cfg)
        assert r.returncode == 2 and "cluster secret" in r.stderr, r.stderr

        host_token = tmp_path / "host.token"
        assert c.cluster.admin is not None
        host_token.write_text(await c.cluster.admin.add_user(990, "mount-host", root=True))
        m = await c.mount(mnt, token_file=str(host_token))
        await asyncio.to_thread((m.path / "alice" / "by-root").write_bytes, b"r")
        assert (await admin.stat("/alice/by-root")).st_size == 1


async def test_a_member_mount_on_any_token_starts_where_meta_does_not_authenticate(tmp_path: Path) -> None:
    """A meta with authenticate = false trusts the uid each request names and takes any token: the
    start-up check asks meta, so such a mount is not refused for its token."""
    async with FsCluster(tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1) as c:
        _, token = await _alice(c, tmp_path)
        m = await c.mount(tmp_path / "mnt", token_file=str(token))
        await asyncio.to_thread((m.path / "by-root").write_bytes, b"r")
        assert (await asyncio.to_thread(os.stat, m.path / "by-root")).st_uid == 0


async def test_a_member_mount_takes_up_a_new_token_written_to_its_token_file(tmp_path: Path) -> None:
    """A mount read its token once: once the token was revoked (or expired), every request got
    EACCES until the mount was restarted under the job using it. It now takes up the token written
    to its token_file (within TOKEN_CHECK_S), for its own requests and each caller's."""
    async with FsCluster(
        tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1, meta_extra={"authenticate": True}
    ) as c:
        assert c.cluster.admin is not None
        host_token = tmp_path / "host.token"
        host_token.write_text(await c.cluster.admin.add_user(990, "mount-host", root=True))
        m = await c.mount(tmp_path / "mnt", token_file=str(host_token))
        await asyncio.to_thread((m.path / "before").write_bytes, b"1")
        new = await c.cluster.admin.issue_token(990, invalidate_existing=True)
        replacement = tmp_path / "host.token.new"
        replacement.write_text(new + "\n")
        os.replace(replacement, host_token)
        # a restarted meta has no cached answer about the revoked token: it asks mgmtd
        c.kill_meta(0)
        c.start_meta(0)
        deadline = time.monotonic() + 30
        while True:
            try:
                await asyncio.to_thread((m.path / "after").write_bytes, b"2")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        assert await asyncio.to_thread((m.path / "before").read_bytes) == b"1"
        assert (await asyncio.to_thread(os.stat, m.path / "after")).st_size == 1
