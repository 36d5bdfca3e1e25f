"""`fs3 mount` over a real cluster (mgmtd, one meta, three storage daemons at replication 3), driven
by the tools people point at a file system: coreutils, tar, git, rsync, fio, and a second mount."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from cluster import storage_on_tmpfs, wait_until
from fs_cluster import FsCluster, Mount, force_unmount, is_mounted
from fsx import Fsx, two_writers

from fs3.cli.fuse_mounts import fuse_connections, mount_device, unmount
from fs3.proto import common_pb2

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts as root (allow_other, setpriv)"),
]


@dataclass
class Env:
    cluster: FsCluster
    mnt: Path
    mount: Mount
    local: Path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("fuse")
    async with FsCluster(tmp / "cluster") as c:
        mount = await c.mount(tmp / "mnt")
        local = tmp / "local"
        local.mkdir()
        yield Env(c, mount.path, mount, local)


def sh(cmd: str, cwd: Path, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd!r} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def make_tree(root: Path) -> None:
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "small.txt").write_text("small\n")
    (root / "a" / "b" / "rand.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    (root / "a" / "b" / "c" / "empty").write_bytes(b"")
    (root / "a" / "link").symlink_to("small.txt")
    os.link(root / "a" / "small.txt", root / "a" / "hard.txt")
    (root / "a" / "exec.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "a" / "exec.sh").chmod(0o755)
    os.utime(root / "a" / "small.txt", ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))


def test_coreutils(env: Env) -> None:
    d = env.mnt / "core"
    d.mkdir()
    sh(
        """
        printf 'hello\\n' > f
        cp f g && cmp f g
        mv g h && test ! -e g && cmp f h
        ln h hard && ln -s f soft
        test "$(readlink soft)" = f && test "$(cat soft)" = hello
        test "$(stat -c %h h)" = 2
        chmod 640 f && test "$(stat -c %a f)" = 640
        chown 1234:5678 f && test "$(stat -c %u:%g f)" = 1234:5678
        touch -d '2001-02-03 04:05:06 UTC' f && test "$(stat -c %Y f)" = 981173106
        truncate -s 100000 f && test "$(stat -c %s f)" = 100000
        truncate -s 3 f && test "$(cat f)" = hel
        head -c 2000000 /dev/zero > z && test "$(du -k --apparent-size z | cut -f1)" = 1954
        df -k . | tail -1 | awk '{ exit !($2 > 0) }'
        mkdir -p x/y/z && touch x/y/z/leaf
        test "$(find . -name leaf)" = ./x/y/z/leaf
        test "$(find . -type l)" = ./soft
        mkfifo pipe && test -p pipe
        mv x w && test -e w/y/z/leaf
        rm -r w && test ! -e w
        rm hard soft pipe && ls | sort | tr '\\n' ' ' | grep -qx 'f h z '
        """,
        d,
    )


def test_tar_round_trip(env: Env) -> None:
    src = env.local / "tar-src"
    make_tree(src)
    (env.mnt / "tar").mkdir()
    sh(f"tar -C {src} -cf - . | tar -C {env.mnt}/tar -xpf -", env.local)
    back = env.local / "tar-back"
    back.mkdir()
    sh(f"tar -C {env.mnt}/tar -cf - . | tar -C {back} -xpf -", env.local)
    sh(f"diff -r --no-dereference {src} {back}", env.local)
    for rel in ("a/small.txt", "a/exec.sh", "a/b/rand.bin"):
        a, b = os.lstat(src / rel), os.lstat(back / rel)
        assert (a.st_mode, a.st_size, a.st_mtime_ns // 10**9) == (
            b.st_mode,
            b.st_size,
            b.st_mtime_ns // 10**9,
        )
    assert os.lstat(env.mnt / "tar" / "a" / "hard.txt").st_nlink == 2


def test_git(env: Env) -> None:
    repo = env.mnt / "repo"
    repo.mkdir()
    sh(
        """
        git init -q -b main .
        git config user.email t@example.com && git config user.name t
        for i in 1 2 3; do echo "line $i" > file$i; git add file$i; git commit -qm "commit $i"; done
        git mv file1 moved && git commit -qm move
        test "$(git log --oneline | wc -l)" = 4
        git log -1 --format=%s | grep -qx move
        git status --porcelain | wc -l | grep -qx 0
        test -z "$(git fsck --no-progress 2>&1 | grep -v '^dangling' || true)"
        """,
        repo,
    )


def test_rsync(env: Env) -> None:
    src = env.local / "rsync-src"
    make_tree(src)
    dst = env.mnt / "rsync"
    sh(f"rsync -a {src}/ {dst}/", env.local)
    sh(f"diff -r --no-dereference {src} {dst}", env.local)
    assert os.lstat(dst / "a" / "small.txt").st_mtime_ns == 1_500_000_000_000_000_000
    # a second run finds nothing to copy
    out = sh(f"rsync -ai {src}/ {dst}/", env.local).stdout
    assert out.strip() == "", out


def test_fio_verify(env: Env) -> None:
    d = env.mnt / "fio"
    d.mkdir()
    common = f"--directory={d} --name=v --size=24m --bs=64k --ioengine=psync --verify=crc32c --numjobs=2"
    sh(f"fio {common} --rw=write --do_verify=0 --verify_state_save=0", d, timeout=100)
    sh(f"fio {common} --rw=read --verify_only --verify_state_load=0", d, timeout=100)
    sh(f"fio {common} --rw=randwrite --bs=4k --size=4m --do_verify=1 --verify_state_save=0", d, timeout=100)


def test_fio_sparse_random_writes_verify_after_close(env: Env) -> None:
    """4 KiB random writes thinly spread over a 64 MiB file (a few dozen per 1 MiB chunk) reach
    storage gathered, one update per chunk with its blocks as several overlay runs; a second fio,
    after the first closed the file, reads every block back from storage and checks it."""
    d = env.mnt / "fio-sparse"
    d.mkdir()
    common = (
        "--name=v --filename=sparse --size=64m --bs=4k --ioengine=psync --verify=crc32c "
        "--rw=randwrite --number_ios=3000 --randseed=7"
    )
    sh(f"fio {common} --do_verify=0 --verify_state_save=1", d, timeout=100)
    sh(f"fio {common} --verify_only --verify_state_load=1", d, timeout=100)


def test_appends_and_sparse_files(env: Env) -> None:
    p = env.mnt / "appended"
    want = b""
    for i in range(20):
        line = f"line {i} {'x' * (i * 997)}\n".encode()
        with open(p, "ab") as f:
            f.write(line)
        want += line
    assert p.read_bytes() == want
    sh("for i in $(seq 5); do echo more$i >> appended; done", env.mnt)
    assert p.read_bytes().endswith(b"more4\nmore5\n")

    s = env.mnt / "sparse"
    fd = os.open(s, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.pwrite(fd, b"tail", 10 * 1024 * 1024 + 3)
        os.pwrite(fd, b"head", 0)
    finally:
        os.close(fd)
    assert s.stat().st_size == 10 * 1024 * 1024 + 7
    with open(s, "rb") as f:
        data = f.read()
    assert data[:4] == b"head" and data[-4:] == b"tail" and data[4:-4] == bytes(len(data) - 8)
    sh("truncate -s 30M sparse2 && cmp -n 31457280 sparse2 /dev/zero", env.mnt)


def test_stat_while_writer_open_and_after_close(env: Env) -> None:
    p = env.mnt / "growing"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        for i in range(1, 6):
            os.write(fd, b"z" * 300_000)
            assert os.stat(p).st_size == i * 300_000  # by path, while the writer is open
            assert os.fstat(fd).st_size == i * 300_000
        # another process sees it too
        assert sh("stat -c %s growing", env.mnt).stdout.strip() == str(5 * 300_000)
    finally:
        os.close(fd)
    assert os.stat(p).st_size == 5 * 300_000
    assert sh("stat -c %s growing", env.mnt).stdout.strip() == str(5 * 300_000)
    # and its times move with each write, not only at the writer's next report (close, fsync);
    # that report, later, leaves mtime at the write's time (it moved it to the report's)
    os.utime(p, ns=(10**18, 10**18))
    fd = os.open(p, os.O_WRONLY)
    try:
        before = time.time_ns()
        os.write(fd, b"more")
        for st in (os.fstat(fd), os.stat(p)):
            assert st.st_mtime_ns >= before and st.st_ctime_ns >= before
        written = os.stat(p).st_mtime_ns
        time.sleep(1.2)
        os.fsync(fd)
        assert os.stat(p).st_mtime_ns == written
        time.sleep(1.2)
    finally:
        os.close(fd)
    assert os.stat(p).st_mtime_ns == written
    assert sh("stat -c %Y growing", env.mnt).stdout.strip() == str(written // 10**9)


def test_open_with_o_trunc_drops_what_another_descriptor_buffered(env: Env) -> None:
    """`: > log` while a writer holds the log open: the writer's buffered bytes reach storage
    before the truncate, so they cannot land after it and bring the old content back."""
    p = env.mnt / "truncated-under-a-writer"
    fd1 = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd1, b"A" * 4000)  # buffered in the mount
        fd2 = os.open(p, os.O_WRONLY | os.O_TRUNC)
        os.write(fd2, b"B")
        os.close(fd2)
    finally:
        os.close(fd1)
    assert p.read_bytes() == b"B"
    assert sh("stat -c %s truncated-under-a-writer", env.mnt).stdout.strip() == "1"


async def test_fsync_on_one_descriptor_writes_out_the_others(env: Env) -> None:
    """`sync FILE` (fsync on a descriptor of its own) makes what another descriptor of this mount
    wrote durable and visible to other clients, as fsync of an inode does on Linux."""
    p = env.mnt / "synced-by-another-fd"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    reader = os.open(p, os.O_RDONLY)
    try:
        os.write(fd, b"w" * 100_000)  # buffered in the mount, length not reported
        os.fsync(reader)
        # closed here, in this test's event loop: its connections are of this loop
        async with await env.cluster.connect() as other:
            assert (await other.stat("/synced-by-another-fd")).st_size == 100_000
            assert await other.read_file("/synced-by-another-fd") == b"w" * 100_000
    finally:
        os.close(reader)
        os.close(fd)


async def test_a_descriptor_kept_open_follows_another_clients_appends_and_truncates(env: Env) -> None:
    """`tail -f`: a reader keeps its descriptor while another client appends, then truncates; once
    the kernel asks for the attributes again, it reads the new bytes, then only what is left."""
    first, more = os.urandom(100), os.urandom(100)
    other = await env.cluster.connect()
    try:
        await other.write_file("/followed", first)
        fd = os.open(env.mnt / "followed", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == first
            async with await other.open("/followed", "a") as a:
                await a.write(more)
            await wait_until(lambda: os.fstat(fd).st_size == 200, 10, "the append to be seen")
            assert os.pread(fd, 4096, 100) == more
            assert os.pread(fd, 4096, 0) == first + more
            await other.truncate("/followed", 10)
            await wait_until(lambda: os.fstat(fd).st_size == 10, 10, "the truncate to be seen")
            assert os.pread(fd, 4096, 0) == first[:10]
        finally:
            os.close(fd)
    finally:
        await other.close()


async def test_a_writer_does_not_bring_its_length_back_after_another_client_truncated(env: Env) -> None:
    """`logrotate copytruncate` seen through the writer's own mount: its descriptor shows the
    truncated file and what it wrote since, not the length it had written before."""
    p = env.mnt / "rotating-under-a-mount"
    other = await env.cluster.connect()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 100_000)
        os.fsync(fd)
        await other.truncate("/rotating-under-a-mount", 0)
        await wait_until(lambda: os.fstat(fd).st_size == 0, 10, "the truncate to be seen")
        os.pwrite(fd, b"after rotation\n", 0)
        assert os.fstat(fd).st_size == 15
    finally:
        os.close(fd)
        await other.close()
    assert p.read_bytes() == b"after rotation\n"


def test_xattrs_rename_and_errors(env: Env) -> None:
    p = env.mnt / "xa"
    p.write_bytes(b"1")
    os.setxattr(p, "user.color", b"blue")
    assert os.getxattr(p, "user.color") == b"blue"
    assert "user.color" in os.listxattr(p)
    os.removexattr(p, "user.color")
    with pytest.raises(OSError) as e:
        os.getxattr(p, "user.color")
    assert e.value.errno == 61  # ENODATA
    with pytest.raises(OSError) as e:
        os.setxattr(p, "user.", b"x")  # a namespace alone: EINVAL on ext4 and tmpfs
    assert e.value.errno == errno.EINVAL
    q = env.mnt / "xb"
    q.write_bytes(b"2")
    os.rename(p, q)
    assert q.read_bytes() == b"1" and not p.exists()
    (env.mnt / "full").mkdir()
    (env.mnt / "full" / "f").write_bytes(b"")
    with pytest.raises(OSError) as e:
        os.rmdir(env.mnt / "full")
    assert e.value.errno == 39  # ENOTEMPTY
    with pytest.raises(FileNotFoundError):
        os.stat(env.mnt / "nope")
    with pytest.raises(FileExistsError):
        os.mkdir(env.mnt / "full")


def _renameat2(src: Path, dst: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(src))


def test_renameat2_exchange_and_noreplace(env: Env) -> None:
    """RENAME_EXCHANGE swaps a file and a directory across two directories (what `mv --exchange`
    does); RENAME_NOREPLACE refuses an existing name; the swap shows in the mount at once."""
    top = env.mnt / "xchg"
    (top / "a").mkdir(parents=True)
    (top / "b" / "d").mkdir(parents=True)
    (top / "a" / "f").write_bytes(b"file")
    (top / "b" / "d" / "inside").write_bytes(b"in")
    _renameat2(top / "a" / "f", top / "b" / "d", 2)  # RENAME_EXCHANGE
    assert (top / "b" / "d").read_bytes() == b"file"
    assert (top / "a" / "f" / "inside").read_bytes() == b"in"
    assert os.listdir(top / "a") == ["f"] and os.listdir(top / "b") == ["d"]
    assert os.stat(top / "a").st_nlink == 3 and os.stat(top / "b").st_nlink == 2
    assert os.stat(top / "a" / "f" / "..").st_ino == os.stat(top / "a").st_ino
    with pytest.raises(FileExistsError):
        _renameat2(top / "a" / "f", top / "b" / "d", 1)  # RENAME_NOREPLACE
    with pytest.raises(FileNotFoundError):
        _renameat2(top / "a" / "f", top / "b" / "nope", 2)
    with pytest.raises(OSError) as e:
        _renameat2(top / "a", top / "a" / "f", 2)  # a directory into its own subtree
    assert e.value.errno == errno.EINVAL


def test_unlinked_file_stays_usable_through_open_handles(env: Env) -> None:
    p = env.mnt / "doomed"
    p.write_bytes(b"still here" * 10_000)
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert not p.exists()
        assert os.pread(fd, 10, 0) == b"still here"
        os.pwrite(fd, b"changed", 0)
        assert os.pread(fd, 10, 0) == b"changedere"
        assert os.fstat(fd).st_size == 100_000
    finally:
        os.close(fd)


def test_non_owner_denied(env: Env) -> None:
    secret = env.mnt / "secret"
    secret.write_bytes(b"top secret")
    secret.chmod(0o600)
    shared = env.mnt / "shared"
    shared.write_bytes(b"public")
    shared.chmod(0o644)
    as_user = "setpriv --reuid=4321 --regid=4321 --clear-groups"
    r = sh(f"{as_user} cat secret", env.mnt, check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert sh(f"{as_user} cat shared", env.mnt).stdout == "public"
    r = sh(f"{as_user} sh -c 'echo x >> shared'", env.mnt, check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    r = sh(f"{as_user} touch newfile", env.mnt, check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert shared.read_bytes() == b"public"
    # a writer who is not the owner may set the times to now (touch), not to anything else
    open_to_all = env.mnt / "open-to-all"
    open_to_all.write_bytes(b"")
    open_to_all.chmod(0o666)
    os.utime(open_to_all, ns=(1_000_000_000, 1_000_000_000))
    sh(f"{as_user} touch open-to-all", env.mnt)
    assert open_to_all.stat().st_mtime_ns > 1_000_000_000
    r = sh(f"{as_user} touch -d 2001-01-01 open-to-all", env.mnt, check=False)
    assert r.returncode != 0 and "Operation not permitted" in r.stderr


_GROUPS_CHANGE = """
import os, sys
os.chdir(sys.argv[1])  # the mount (the directories above it are root's alone)
os.setgroups([4321]); os.setegid(4321); os.seteuid(4321)
try:
    os.stat("missing")  # a request of this process reaches the mount
except FileNotFoundError:
    pass
os.seteuid(0); os.setgroups([4322]); os.seteuid(4321)  # a file server's switch: now in group 4322
os.close(os.open("group-only/f", os.O_CREAT | os.O_WRONLY, 0o644))
os.mkdir("group-only/sub")
print("ok")
"""


def test_a_process_that_changed_its_groups_is_allowed_what_they_allow(env: Env) -> None:
    """A process that changes its supplementary groups in place (a file server's seteuid and
    setgroups, newgrp-like tools that exec) and then creates in a directory only its new group may
    write: the kernel allows it, and meta must too (it was asked with the groups the mount had
    cached for the process, for up to 2 s: EACCES)."""
    d = env.mnt / "group-only"
    d.mkdir()
    os.chown(d, 0, 4322)
    d.chmod(0o770)
    r = subprocess.run(
        [sys.executable, "-c", _GROUPS_CHANGE, str(env.mnt)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert (d / "f").stat().st_uid == 4321 and (d / "sub").is_dir()


_LIST_AFTER_CHMOD = """
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
buf = ctypes.create_string_buffer(512)  # a few entries per getdents64: one READDIR each

def names():
    n = libc.syscall(217, fd, buf, len(buf))  # SYS_getdents64 on x86-64
    if n < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    out, pos = [], 0
    while pos < n:
        reclen = struct.unpack_from("<QqH", buf.raw, pos)[2]
        out.append(buf.raw[pos + 19 : pos + reclen].split(b"\\0", 1)[0])
        pos += reclen
    return out

listed = names()
print("opened", flush=True)
sys.stdin.readline()  # the directory's mode is 0 now
while batch := names():
    listed += batch
print(len([n for n in listed if n.startswith(b"f")]))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the getdents64 syscall number is x86-64's")
def test_a_listing_goes_on_after_a_chmod_of_the_directory(env: Env) -> None:
    """Read permission is checked when a directory is opened, as for any file: a user listing a
    directory whose mode is then set to 0 lists it to the end (meta checked every page as the
    caller: the next getdents64 failed with EACCES)."""
    d = env.mnt / "listed-while-chmodded"
    d.mkdir()
    for i in range(300):
        (d / f"f{i:04d}").write_bytes(b"")
    d.chmod(0o755)
    as_user = ["setpriv", "--reuid=4321", "--regid=4321", "--clear-groups"]
    p = subprocess.Popen(
        [*as_user, sys.executable, "-c", _LIST_AFTER_CHMOD, d.name],
        cwd=env.mnt,  # (the directories above the mount are root's alone)
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "opened\n", p.stderr.read() if p.stderr else ""
        d.chmod(0)
        out, err = p.communicate("go\n", timeout=60)
        assert p.returncode == 0, err
        assert out.split() == ["300"], (out, err)
    finally:
        d.chmod(0o755)
        if p.poll() is None:
            p.kill()


def test_writes_clear_setuid_and_a_chmod_after_them_holds(env: Env) -> None:
    """A user rewriting a setuid file (write permission) drops the bit, as on Linux (the mount runs
    with HANDLE_KILLPRIV: the kernel leaves it to the file system); a chmod the writer makes after
    writing (install -m 4755, cp -p) keeps the mode it sets."""
    d = env.mnt / "killpriv"
    d.mkdir()
    d.chmod(0o777)
    suid = d / "suid"
    suid.write_bytes(b"#!/bin/sh\n")
    suid.chmod(0o4777)
    as_user = "setpriv --reuid=4321 --regid=4321 --clear-groups"
    sh(f"{as_user} sh -c 'echo x >> suid'", d)
    time.sleep(1.1)  # the kernel's attribute cache
    assert stat.S_IMODE(suid.stat().st_mode) == 0o777
    script = (
        "import os; fd = os.open('mine', os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b'x' * 1000); "
        "os.fchmod(fd, 0o4755); os.close(fd)"
    )
    sh(f'{as_user} {sys.executable} -c "{script}"', d)
    time.sleep(1.1)
    assert stat.S_IMODE((d / "mine").stat().st_mode) == 0o4755


def test_a_truncate_by_a_writer_who_is_not_the_owner_clears_setuid(env: Env) -> None:
    """truncate(2) and ftruncate(2) of a setuid/setgid file by a user who may write it but does not
    own it succeed and drop both bits, as on Linux (the kernel sends the bits' kill with the new
    size in one request; meta would refuse that user the mode part)."""
    d = env.mnt / "killpriv-truncate"
    d.mkdir()
    d.chmod(0o777)
    as_user = "setpriv --reuid=4321 --regid=4321 --clear-groups"
    for name, how in (
        ("by-path", "os.truncate('by-path', 2)"),
        ("by-fd", "fd = os.open('by-fd', os.O_WRONLY); os.ftruncate(fd, 2); os.close(fd)"),
    ):
        f = d / name
        f.write_bytes(b"abcdef")
        f.chmod(0o6777)
        sh(f'{as_user} {sys.executable} -c "import os; {how}"', d)
        time.sleep(1.1)  # the kernel's attribute cache
        assert f.read_bytes() == b"ab", name
        assert stat.S_IMODE(f.stat().st_mode) == 0o777, name
    # setgid without group-execute goes too for someone outside the file's group (Linux 6.2 on;
    # the kernel's FUSE sends the older rule's mode, which the mount put back over meta's)
    f = d / "no-group-exec"
    f.write_bytes(b"abcdef")
    f.chmod(0o6666)
    sh(f"{as_user} {sys.executable} -c \"import os; os.truncate('no-group-exec', 2)\"", d)
    time.sleep(1.1)
    assert stat.S_IMODE(f.stat().st_mode) == 0o666
    # ... and for an owner's chgrp to a group of theirs from one they are not in
    mine = d / "chgrp"
    mine.write_bytes(b"x")
    os.chown(mine, 4321, 0)
    mine.chmod(0o6664)
    sh("setpriv --reuid=4321 --regid=4321 --groups=4322 chgrp 4322 chgrp", d)
    time.sleep(1.1)
    assert (mine.stat().st_gid, stat.S_IMODE(mine.stat().st_mode)) == (4322, 0o664)
    # a user who may not write the file is still refused, and the bits stay
    f = d / "not-theirs"
    f.write_bytes(b"abcdef")
    f.chmod(0o6755)
    r = sh(f"{as_user} {sys.executable} -c \"import os; os.truncate('not-theirs', 2)\"", d, check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    assert f.read_bytes() == b"abcdef"
    assert stat.S_IMODE(f.stat().st_mode) == 0o6755


async def test_two_mounts_see_each_others_files(env: Env) -> None:
    other = await env.cluster.mount(env.mnt.parent / "mnt2", name="mount2")
    try:
        (env.mnt / "from1").write_bytes(b"one" * 100_000)
        assert (other.path / "from1").read_bytes() == b"one" * 100_000
        (other.path / "from2").write_bytes(b"two")
        assert (env.mnt / "from2").read_bytes() == b"two"
        # an overwrite through one mount is what the other reads after the writer closed
        (env.mnt / "from1").write_bytes(b"new")
        assert (other.path / "from1").read_bytes() == b"new"
        # ... also one of the same size that set the old mtime back (tar, rsync --inplace -t):
        # the other mount's cached pages go all the same (its ctime moved)
        old = 1_500_000_000_000_000_000
        (env.mnt / "same").write_bytes(b"A" * 4096)
        os.utime(env.mnt / "same", ns=(old, old))
        assert (other.path / "same").read_bytes() == b"A" * 4096
        fd = os.open(env.mnt / "same", os.O_WRONLY)  # in place: no truncate
        try:
            os.write(fd, b"B" * 4096)
        finally:
            os.close(fd)
        os.utime(env.mnt / "same", ns=(old, old))
        assert (other.path / "same").read_bytes() == b"B" * 4096
    finally:
        assert other.unmount() == 0


async def _across_mounts(
    env: Env, name: str, fn: Callable[[Path, Path], None], sub: str = "", **overrides: object
) -> None:
    """Run ``fn(here, there)`` in a thread: ``here`` the path ``sub`` on the test's mount, ``there``
    the same path on a second mount of the cluster (``overrides``: its client options), which is
    unmounted after."""
    other = await env.cluster.mount(env.mnt.parent / f"mnt-{name}", name=name, **overrides)
    try:
        await asyncio.to_thread(fn, env.mnt / sub, other.path / sub)
    finally:
        assert other.unmount() == 0


async def test_a_name_another_mount_replaced_is_looked_up_again(env: Env) -> None:
    """A symlink swapped by rename (the usual switch of a "current" release) or a directory
    replaced: the other mount's cached name led to the removed inode, and readlink, the path walk
    through it, lookups in it and opendir answered ENOENT for as long as its entry timeout (here
    60 s), though the name existed all along. They answer ESTALE (meta: META_STALE for a lookup in
    a directory that is gone), and the kernel looks the name up again."""
    await _across_mounts(env, "swap", _replace_under, "releases", entry_timeout_s=60.0)


def _replace_under(here: Path, there: Path) -> None:
    here.mkdir()
    for r in ("r1", "r2"):
        (here / r).mkdir()
        (here / r / "v").write_text(r)
    (here / "cur").symlink_to("r1")
    (here / "d").mkdir()
    (here / "d" / "f").write_text("old")
    assert (there / "cur" / "v").read_text() == "r1"  # cached there now, names and inodes
    assert os.readlink(there / "cur") == "r1"
    assert os.listdir(there / "d") == ["f"]
    (here / "next").symlink_to("r2")
    os.rename(here / "next", here / "cur")
    (here / "d" / "f").unlink()
    (here / "new").mkdir()
    (here / "new" / "g").write_text("new")
    os.rename(here / "new", here / "d")  # over the empty directory
    assert os.readlink(there / "cur") == "r2"
    assert (there / "cur" / "v").read_text() == "r2"
    assert (there / "d" / "g").read_text() == "new"  # a lookup in the replaced directory
    assert os.listdir(there / "d") == ["g"]


async def test_a_rename_onto_a_directory_another_mount_moved_away_leaves_it_alive(env: Env) -> None:
    """A mount's kernel marks the directory it takes a rename's target to be dead for good; the
    mount tells meta which one that is (RenameReq.replaces), and meta refuses the rename (ESTALE)
    if another client moved it away since. Here the kernel looks the target up again at the rename
    (its entry cached for 60 s notwithstanding): the rename replaces what is there now, and the
    directory moved away stays alive, here too. (The race itself, another client's move between
    that lookup and the rename reaching meta, is tested on meta: a stress of two mounts renaming
    over each other left 143 of 1,185 live directories listing as empty on one mount before.)"""
    await _across_mounts(env, "moved", _rename_onto_moved, "moved-away", entry_timeout_s=60.0)


def _rename_onto_moved(here: Path, there: Path) -> None:
    here.mkdir()
    (here / "T").mkdir()
    (here / "T" / "kept").write_text("x")
    (there / "S").mkdir()
    assert os.listdir(there / "T") == ["kept"]  # there, the kernel now takes T for this directory
    held = os.open(there / "T", os.O_RDONLY | os.O_DIRECTORY)  # (and keeps its inode)
    try:
        os.rename(here / "T", here / "T2")  # moved away elsewhere, an empty one put in its place
        (here / "T").mkdir()
        os.rename(there / "S", there / "T")  # replaces the empty T
        assert sorted(os.listdir(there)) == ["T", "T2"]
        assert os.listdir(there / "T") == []
        assert os.listdir(there / "T2") == ["kept"]  # alive, as everywhere else
        assert os.listdir(held) == ["kept"]
        (there / "T2" / "new").write_text("y")
    finally:
        os.close(held)
    assert sorted(os.listdir(here / "T2")) == ["kept", "new"]


def test_times_given_are_kept_even_when_close_to_now(env: Env) -> None:
    """touch -r and cp -p of a file written a moment ago give the copy its times exactly (equal
    times close to the clock were taken for touch's "now", and set to meta's clock instead)."""
    sh(
        "touch tf && touch -r tf tg && cp -p tf th && touch -d @1500000000.25 ti && touch -r ti tj",
        env.mnt,
    )
    times = {n: (env.mnt / n).stat().st_mtime_ns for n in ("tf", "tg", "th", "ti", "tj")}
    assert times["tf"] == times["tg"] == times["th"], times
    assert times["ti"] == times["tj"] == 1_500_000_000_250_000_000
    before = time.time_ns()
    sh("touch tg", env.mnt)  # a plain touch is now
    assert (env.mnt / "tg").stat().st_mtime_ns >= before - 1_000_000_000
    # a time past what the inode holds (int64 ns, 2262) is clamped, as ext4 clamps to 2446 (EIO)
    sh("touch -d 2300-01-01 tk", env.mnt)
    assert (env.mnt / "tk").stat().st_mtime_ns == (1 << 63) - 1
    # chown(f, -1, -1) changes nothing but ctime, as on ext4 (an empty SETATTR from the kernel)
    old = (env.mnt / "ti").stat()
    time.sleep(0.01)
    os.chown(env.mnt / "ti", -1, -1)
    new = (env.mnt / "ti").stat()
    assert new.st_ctime_ns > old.st_ctime_ns and new.st_mtime_ns == old.st_mtime_ns
    assert (new.st_uid, new.st_gid, new.st_mode) == (old.st_uid, old.st_gid, old.st_mode)


async def test_two_mounts_open_what_the_other_closed_at_once(env: Env) -> None:
    """Close-to-open across mounts with nothing slept: a file the other mount looked at a moment
    ago and then wrote and closed opens with its new length, appends alternating between the mounts
    all stay, and a name the other mount replaced opens the new file. (With the kernel caching a
    file's name for the attribute timeout, each mount appended at the size it had cached, over
    the other's lines, the reader saw 0 bytes, and the replaced name failed with ENOENT.)"""
    other = await env.cluster.mount(env.mnt.parent / "mnt3", name="mount3")
    try:
        a, b = env.mnt, other.path
        (a / "grown").write_bytes(b"")
        assert (b / "grown").stat().st_size == 0  # b looks: it caches the file at 0 bytes
        (a / "grown").write_bytes(b"x" * 7000)
        assert (b / "grown").read_bytes() == b"x" * 7000
        want = b""
        for i in range(10):
            line = f"line {i} from {'ab'[i % 2]}\n".encode()
            fd = os.open((a, b)[i % 2] / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            want += line
        assert (a / "log").read_bytes() == (b / "log").read_bytes() == want
        # a descriptor kept open O_APPEND appends after what the other mount appended meanwhile
        # (the kernel offers the length it cached; taken, it wrote over the other's bytes)
        kept = os.open(b / "kept.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(kept, b"1" * 5)
            os.fsync(kept)  # (what a mount has not told meta yet, the other cannot know of)
            await asyncio.sleep(1.2)  # past attr_timeout_s
            fd = os.open(a / "kept.log", os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, b"A" * 10)
            finally:
                os.close(fd)
            await asyncio.sleep(1.2)
            os.write(kept, b"B" * 3)
            os.write(kept, b"C" * 2)
        finally:
            os.close(kept)
        assert (
            (a / "kept.log").read_bytes() == (b / "kept.log").read_bytes() == b"11111" + b"A" * 10 + b"BBBCC"
        )
        (b / "replaced").write_bytes(b"old")
        assert (b / "replaced").read_bytes() == b"old"
        (a / "replaced.tmp").write_bytes(b"new contents")
        os.rename(a / "replaced.tmp", a / "replaced")
        assert (b / "replaced").read_bytes() == b"new contents"
    finally:
        assert other.unmount() == 0


async def test_opens_in_another_mount_never_miss_a_name_replaced_again_and_again(env: Env) -> None:
    """One mount writes a new version of a file and renames it over the name, again and again (as
    tools update a data set atomically); readers in another mount open the name in a loop. The
    rename is atomic, so no open may fail (it did, ENOENT, about one in eight: the kernel looked
    the name up, then the open reached meta after the inode it found had been replaced), and each
    read is one whole version."""
    await _across_mounts(env, "replace", _replace_while_reading)


def _version(v: int) -> bytes:
    return f"{v:06d}".encode() * (500 + v * 37 % 1500)


def _replace_while_reading(a: Path, b: Path) -> None:
    (a / "set").write_bytes(_version(0))
    done = threading.Event()
    errors: list[str] = []
    reads = [0]

    def reader() -> None:
        while not done.is_set():
            try:
                data = (b / "set").read_bytes()
            except OSError as e:
                errors.append(f"open/read: {e!r}")
                continue
            reads[0] += 1
            if data != _version(int(data[:6] or b"-1")):
                errors.append(f"not one whole version: {len(data)} bytes starting {data[:12]!r}")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for v in range(1, 150):
            (a / "set.tmp").write_bytes(_version(v))
            os.rename(a / "set.tmp", a / "set")
    finally:
        done.set()
        for t in threads:
            t.join()
    assert errors == [], errors[:5]
    assert reads[0] > 50


async def test_a_reader_holding_a_file_open_never_reads_zeros_where_another_mount_appended(
    env: Env,
) -> None:
    """A reader holds a file open in one mount while another mount appends to it. Its read of
    the page that held the old end is in flight (storage stopped) when a lookup of the name brings
    the new length: the kernel then takes the whole page as read, so the mount must not answer that
    read short at the old end, as it knew it when the read began (the reader got zeros where the
    appended bytes are, for good: the page stayed cached so)."""
    # the reader's mount keeps attributes long: its read below asks no getattr first
    reader = await env.cluster.mount(env.mnt.parent / "mnt-append", name="append", attr_timeout_s=30.0)
    try:
        head, tail = os.urandom(6000), os.urandom(3000)
        await asyncio.to_thread((env.mnt / "grows").write_bytes, head)
        fd = os.open(reader.path / "grows", os.O_RDONLY)  # the kernel takes 6000
        try:
            await asyncio.to_thread(_append, env.mnt / "grows", tail)  # meta: 9000
            storage = [n.proc.pid for n in env.cluster.cluster.nodes if n.proc is not None]
            for pid in storage:
                os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
            try:
                # the kernel's length is 6000: a read of 4096 at 4096, answered with 1904
                read = asyncio.create_task(asyncio.to_thread(os.pread, fd, 4096, 4096))
                await asyncio.sleep(0.3)  # waiting on storage
                size = asyncio.create_task(asyncio.to_thread(lambda: os.stat(reader.path / "grows").st_size))
                await asyncio.sleep(0.5)  # the lookup brought 9000
            finally:
                for pid in storage:
                    os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
            got = await read
            assert await size == 9000
            assert got == (head + tail)[4096:8192], "zeros where another mount appended"
            assert os.pread(fd, 9000, 0) == head + tail
        finally:
            os.close(fd)
    finally:
        assert reader.unmount() == 0


async def test_a_reader_holding_a_file_open_reads_short_where_another_mount_truncated(env: Env) -> None:
    """A reader holds a file open in one mount while another mount truncates it, or writes it
    again shorter (O_TRUNC): its reads end at the new end, as a local file system's do, rather
    than returning zeros up to the length its mount knew (for up to attr_timeout_s)."""
    other = await env.cluster.mount(env.mnt.parent / "mnt-cut", name="cut")
    try:
        path = env.mnt / "cut"
        await asyncio.to_thread(path.write_bytes, b"x" * 100)
        fd = os.open(other.path / "cut", os.O_RDONLY)
        try:
            await asyncio.to_thread(os.truncate, path, 0)
            assert await asyncio.to_thread(os.pread, fd, 4096, 0) == b""
        finally:
            os.close(fd)
        await asyncio.to_thread(path.write_bytes, b"y" * 100)
        fd = os.open(other.path / "cut", os.O_RDONLY)
        try:
            await asyncio.to_thread(path.write_bytes, b"z" * 50)
            assert await asyncio.to_thread(os.pread, fd, 4096, 0) == b"z" * 50
        finally:
            os.close(fd)
    finally:
        assert other.unmount() == 0


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest.mark.parametrize(("seed", "direct_io"), [(1, False), (2, False), (3, True)])
async def test_fsx_random_operations_match_a_model(env: Env, seed: int, direct_io: bool) -> None:
    """fsx-style (tests/fuse/fsx.py): 1,200 random writes, runs of small writes, reads,
    truncates, fsyncs, reopens and reads and writes through a shared mapping on one file of up
    to 6 MiB, each checked against a model; then another mount, with nothing cached, reads the
    whole file from storage. Through the page cache the kernel asks for the file's attributes before
    a read that follows a write, and that makes the mount send what it holds; with ``direct_io``
    (a mount that bypasses the page cache; no mappings there) reads also meet writes the mount still
    holds, laid over what storage returns."""
    mount = (
        await env.cluster.mount(env.mnt.parent / "mnt-direct", name="direct", direct_io=True)
        if direct_io
        else None
    )
    root = mount.path if mount else env.mnt
    fx = Fsx(root / f"fsx-{seed}", seed, max_size=6 << 20, mapped=not direct_io)
    try:
        try:
            await asyncio.to_thread(fx.run, 1200)
            fx.check_all()
        finally:
            fx.close()
        assert all(fx.counts.get(name) for name, _ in fx.ops), fx.counts
        other = await env.cluster.mount(env.mnt.parent / f"mnt-fsx{seed}", name=f"fsx{seed}")
        try:
            fd = os.open(other.path / f"fsx-{seed}", os.O_RDONLY)
            try:
                await asyncio.to_thread(fx.check_all, fd)
            finally:
                os.close(fd)
        finally:
            assert other.unmount() == 0
    finally:
        if mount is not None:
            assert mount.unmount() == 0


@pytest.mark.parametrize("mounts", [1, 2])
async def test_two_writers_on_their_own_stripes_of_one_file(env: Env, mounts: int) -> None:
    """Two threads with their own descriptors, through one mount or through two, write (gathered
    small writes and whole 64 KiB stripes), read back, fsync and reopen their own alternate
    stripes of one 4 MiB file at the same time (tests/fuse/fsx.py ``two_writers``); once both have
    closed, the file read through the first mount holds both writers' bytes."""
    name = f"stripes-{mounts}"
    other = await env.cluster.mount(env.mnt.parent / "mnt-stripes", name="stripes") if mounts == 2 else None
    try:
        second = (other.path if other else env.mnt) / name
        counts = await asyncio.to_thread(
            two_writers, (env.mnt / name, second), mounts, size=4 << 20, steps=1000
        )
    finally:
        if other is not None:
            assert other.unmount() == 0
    assert all(counts.get(op) for op in ("write", "read", "fsync", "reopen")), counts


async def test_sigterm_unmounts_cleanly(env: Env) -> None:
    m = await env.cluster.mount(env.mnt.parent / "mnt3", name="mount3")
    (m.path / "x").write_bytes(b"x")
    assert m.proc.popen is not None
    m.proc.popen.terminate()
    assert m.proc.popen.wait(timeout=30) == 0
    assert not is_mounted(m.path)


async def test_sigterm_leaves_a_file_system_mounted_over_the_mount_alone(env: Env) -> None:
    """libfuse unmounts by path, which takes the topmost mount there: a SIGTERM used to unmount
    the tmpfs an operator had mounted over the fs3 mount, and leave the fs3 mount dead under it."""
    m = await env.cluster.mount(env.mnt.parent / "mnt-covered", name="covered")
    await asyncio.to_thread(_cover_and_terminate, m)


def _cover_and_terminate(m: Mount) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(m.path)], check=True)
    try:
        (m.path / "on-tmpfs").write_bytes(b"t")
        assert m.proc.popen is not None
        m.proc.popen.terminate()
        assert m.proc.popen.wait(timeout=30) == 0
        assert (m.path / "on-tmpfs").read_bytes() == b"t"  # the tmpfs is still there
        assert "another file system is mounted over this one" in m.proc.log()
    finally:
        subprocess.run(["umount", str(m.path)], check=True)
        force_unmount(m.path)  # ours, dead under the tmpfs until then
    assert not is_mounted(m.path)


async def test_a_dead_fs3_mount_is_replaced_by_a_new_mount(env: Env) -> None:
    """A mount process killed (SIGKILL, as the OOM killer does) leaves a dead mount: every access
    fails with ENOTCONN, and a new ``fs3 mount`` there (systemd restarting the service) used to be
    refused until someone unmounted it by hand. It unmounts the dead mount (lazily: a process has
    its working directory in it) and mounts in its place."""
    m = await env.cluster.mount(env.mnt.parent / "mnt-dead", name="dying")
    await asyncio.to_thread(_kill_and_mount_again, m)


def _kill_and_mount_again(m: Mount) -> None:
    (m.path / "kept").write_bytes(b"k")
    before = mount_device(str(m.path))
    sleeper = subprocess.Popen(["sleep", "120"], cwd=m.path)  # keeps the dead mount busy
    try:
        assert m.proc.popen is not None
        m.proc.popen.kill()
        m.proc.popen.wait(timeout=30)
        with pytest.raises(OSError) as e:
            os.listdir(m.path)
        assert e.value.errno == errno.ENOTCONN
        argv = [sys.executable, "-m", "fs3.cli.main", "mount", str(m.path), "--config", str(m.config)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"unmounted the dead fs3 mount at {m.path}" in r.stderr
        assert mount_device(str(m.path)) not in (None, before)
        assert (m.path / "kept").read_bytes() == b"k"
    finally:
        sleeper.kill()
        sleeper.wait()
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True, timeout=30)
        deadline = time.monotonic() + 30
        while _pids_serving(m.path) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in _pids_serving(m.path):
            os.kill(pid, signal.SIGKILL)
        force_unmount(m.path)


def _fs3_umount(*args: str, as_user: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*as_user, sys.executable, "-m", "fs3.cli.main", "umount", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_fs3_umount_unmounts_refuses_a_busy_mount_and_forces_a_stuck_one(
    env: Env, tmp_path: Path
) -> None:
    """``fs3 umount``: a mount in use is refused (busy) and stays; ``--force`` detaches it; a mount
    whose process is stopped (every request on it would hang) goes with ``--force`` at once; an
    idle mount goes and its process exits cleanly; what is not an fs3 mount is not touched; another
    user's unmount, forced or not, is refused, saying who mounted it."""
    busy = await env.cluster.mount(env.mnt.parent / "mnt-umount-busy", name="umount-busy")
    stuck = await env.cluster.mount(env.mnt.parent / "mnt-umount-stuck", name="umount-stuck")
    idle = await env.cluster.mount(env.mnt.parent / "mnt-umount-idle", name="umount-idle")
    await asyncio.to_thread(_check_fs3_umount, busy, stuck, idle, tmp_path)


def _check_fs3_umount(busy: Mount, stuck: Mount, idle: Mount, tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "120"], cwd=busy.path)
    assert stuck.proc.popen is not None
    try:
        other = ("setpriv", "--reuid=4321", "--regid=4321", "--clear-groups")
        for force in ((), ("--force",)):
            r = _fs3_umount(*force, str(busy.path), as_user=other)
            assert r.returncode == 1, r.stderr
            assert f"{busy.path} was mounted by root (uid 0); only that user or root can" in r.stderr, (
                r.stderr
            )
            assert is_mounted(busy.path)
        r = _fs3_umount(str(busy.path))
        assert r.returncode == 1 and "is still mounted" in r.stderr and "--force" in r.stderr, r.stderr
        assert is_mounted(busy.path)
        r = _fs3_umount("--force", str(busy.path))
        assert r.returncode == 0, r.stderr
        assert not is_mounted(busy.path)
        assert busy.proc.popen is not None and busy.proc.popen.wait(timeout=30) == 0

        os.kill(stuck.proc.popen.pid, signal.SIGSTOP)
        r = _fs3_umount("--force", str(stuck.path))
        assert r.returncode == 0, r.stderr
        assert not is_mounted(stuck.path)
        os.kill(stuck.proc.popen.pid, signal.SIGCONT)
        assert stuck.proc.popen.wait(timeout=30) == 0

        (idle.path / "x").write_bytes(b"x")
        r = _fs3_umount(str(idle.path))
        assert r.returncode == 0, r.stderr
        assert not is_mounted(idle.path)
        assert idle.proc.popen is not None and idle.proc.popen.wait(timeout=30) == 0

        r = _fs3_umount(str(tmp_path))
        assert r.returncode == 1 and "is not a mount point" in r.stderr
        r = _fs3_umount("/proc")
        assert r.returncode == 1 and "is not an fs3 mount (proc)" in r.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(stuck.proc.popen.pid, signal.SIGCONT)
        for m in (busy, stuck, idle):
            force_unmount(m.path)


def test_an_unmount_of_a_device_leaves_another_mounted_there_meanwhile(tmp_path: Path) -> None:
    """What replaces a dead mount unmounts it by its device: a mount that took the mount point
    meanwhile (another ``fs3 mount`` there) stays."""
    where = tmp_path / "v"
    where.mkdir()
    subprocess.run(["mount", "--bind", str(where), str(where)], check=True)
    try:
        dev = mount_device(str(where))
        assert dev is not None
        assert unmount(str(where), (dev[0], dev[1] + 1)) == ""
        assert is_mounted(where)
        assert unmount(str(where), dev) == ""
        assert not is_mounted(where)
    finally:
        force_unmount(where)


async def test_one_mib_requests_readahead_and_metrics(env: Env) -> None:
    """1 MiB writes and direct reads reach the mount whole, the mount's readahead is raised, and
    the Prometheus page counts requests per operation."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = await env.cluster.mount(
        # on the address set (127.0.0.1 by default; a mount bound it whatever the config said)
        env.mnt.parent / "mnt4",
        name="mount4",
        metrics_port=port,
        metrics_host="127.0.0.2",
        read_ahead_kb=8192,
    )
    try:
        await asyncio.to_thread(_check_requests, m, port)
    finally:
        assert m.unmount() == 0


def _check_requests(m: Mount, port: int) -> None:
    sh("dd if=/dev/zero of=f bs=1M count=8 conv=fsync status=none", m.path)
    sh("dd if=f of=/dev/null bs=1M iflag=direct status=none", m.path)
    # 4 KiB reads, 16 at a time: small enough to go to storage in batches
    sh(
        "fio --name=r --filename=f --rw=randread --bs=4k --direct=1 --ioengine=libaio --iodepth=16 "
        "--number_ios=400 --size=8m --output=/dev/null",
        m.path,
    )
    for _ in range(3):  # directories' requests are counted as files' are
        fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    page = urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10).read().decode()

    def metric(name: str) -> float:
        return float(re.search(rf"^{re.escape(name)} (\S+)$", page, re.M).group(1))

    assert metric('fs3_fuse_requests_total{op="write"}') == 8  # one request per 1 MiB write(2)
    assert metric('fs3_fuse_requests_total{op="read"}') <= 9 + 400  # 8 of 1 MiB, the one at EOF; fio's
    assert metric("fs3_fuse_read_bytes_total") == (8 << 20) + 400 * 4096
    assert metric('fs3_fuse_requests_total{op="fsyncdir"}') == 3
    assert (
        metric('fs3_fuse_requests_total{op="releasedir"}')
        == metric('fs3_fuse_requests_total{op="opendir"}')
        >= 3
    )
    assert metric("fs3_client_batched_reads_total") > metric("fs3_client_read_batches_total") > 0
    dev = next(
        line.split()[2]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] == str(m.path)
    )
    assert Path(f"/sys/class/bdi/{dev}/read_ahead_kb").read_text().strip() == "8192"
    # the connection keeps up to 128 background requests (readahead, async direct I/O), not the
    # kernel's 12: the mount mounts fusectl first where nothing has (as on this CI's machines)
    conn = Path("/sys/fs/fuse/connections") / dev.split(":")[1]
    assert (conn / "max_background").read_text().strip() == "128"
    assert (conn / "congestion_threshold").read_text().strip() == "96"


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare(1) for a private mount namespace")
def test_fusectl_is_mounted_where_nothing_has() -> None:
    """In a mount namespace of its own with fusectl unmounted (what a container or a system
    without systemd has), fuse_connections() mounts it as root and says how to as another user."""
    ctl = "/sys/fs/fuse/connections"
    if not os.path.isdir(ctl):
        pytest.skip(f"{ctl} does not exist (fuse module not loaded)")
    probe = f"{sys.executable} -c 'from fs3.cli.fuse_mounts import fuse_connections as f; print(f())'"
    script = (
        f"while grep -q ' {ctl} ' /proc/self/mountinfo; do umount {ctl} || exit 3; done; "
        f"setpriv --reuid=65534 --regid=65534 --clear-groups {probe}; "
        f"grep -q ' {ctl} ' /proc/self/mountinfo && exit 4; "
        f"{probe}; grep ' {ctl} ' /proc/self/mountinfo"
    )
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 0, r.stderr
    as_nobody, as_root, mounted = r.stdout.splitlines()
    assert as_nobody.startswith("(None, 'fusectl is not mounted at") and "mount -t fusectl" in as_nobody
    assert as_root == f"(PosixPath('{ctl}'), '')"
    assert " - fusectl " in mounted


def _pids_serving(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (a detached mount daemon has no other handle)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mount" in args and str(path).encode() in args:
                pids.append(int(d.name))
    return pids


def test_daemon_mode_detaches_and_fusermount_ends_it(env: Env) -> None:
    path = env.mnt.parent / "mnt5"
    path.mkdir()
    argv = [sys.executable, "-m", "fs3.cli.main", "mount", str(path), "--config", str(env.mount.config)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert is_mounted(path)
        (path / "via-daemon").write_bytes(b"d")
        assert (env.mnt / "via-daemon").read_bytes() == b"d"
        assert len(_pids_serving(path)) == 1
        subprocess.run(["fusermount3", "-u", str(path)], check=True, timeout=30)
        deadline = time.monotonic() + 30
        while _pids_serving(path):
            assert time.monotonic() < deadline, "the mount daemon did not exit after fusermount3 -u"
            time.sleep(0.05)
    finally:
        for pid in _pids_serving(path):
            os.kill(pid, signal.SIGKILL)
        force_unmount(path)


def test_two_mounts_started_at_once_on_one_directory_make_one_mount(env: Env) -> None:
    """Each checked the mount table before either had mounted, and both mounted: two stacked
    fs3 mounts, the lower one unreachable. Also: -o given twice keeps both lists of options."""
    path = env.mnt.parent / "mnt-twice"
    path.mkdir()
    argv = [
        *(sys.executable, "-m", "fs3.cli.main", "mount", str(path), "--config", str(env.mount.config)),
        *("-o", "ro", "-o", "noexec"),
    ]
    try:
        procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
        assert sorted(rc for rc, _ in results) == [0, 1, 1], results
        assert all("is already a mount point (fuse.fs3)" in err for rc, err in results if rc == 1)
        entries = [
            line.split()
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4] == str(path)
        ]
        assert len(entries) == 1, entries
        assert {"ro", "noexec"} <= set(entries[0][5].split(",")), entries
        with pytest.raises(OSError) as e:
            (path / "x").write_bytes(b"x")
        assert e.value.errno == errno.EROFS
    finally:
        subprocess.run(["fusermount3", "-u", str(path)], capture_output=True, timeout=30)
        deadline = time.monotonic() + 30
        while _pids_serving(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in _pids_serving(path):
            os.kill(pid, signal.SIGKILL)
        force_unmount(path)


def test_mount_points_with_escaped_characters_in_the_mount_table(tmp_path: Path) -> None:
    """The kernel writes a mount point's space, tab, newline and backslash as octal escapes: only
    the space was decoded, so a mount on 'a\\b' was not found (a second fs3 mount stacked on it,
    fs3 umount said it was not a mount point)."""
    for name in ("we\\ird", "tab\there", "new\nline", "sp ace"):
        where = tmp_path / name
        where.mkdir()
        assert mount_device(str(where)) is None
        subprocess.run(["mount", "--bind", str(where), str(where)], check=True)
        try:
            assert mount_device(str(where)) is not None, name
            assert unmount(str(where)) == ""
            assert mount_device(str(where)) is None
        finally:
            subprocess.run(["umount", str(where)], capture_output=True)


@pytest.fixture
def small_disks(tmp_path: Path):
    """A cluster directory whose three storage daemons' directories are 48 MiB tmpfs mounts."""
    with storage_on_tmpfs(tmp_path / "c", ["48m"] * 3) as root:
        yield root


async def test_full_storage_gives_enospc_and_frees_up_after_rm(small_disks: Path, tmp_path: Path) -> None:
    """Storage daemons on small file systems: a write past the space they keep free fails with
    ENOSPC (dd says "No space left on device"), files already there still read back, and once
    a file is removed (and collected) writes go through again. Nothing goes offline."""
    async with FsCluster(small_disks, storage_extra={"keep_free": 0.25}) as c:
        m = await c.mount(tmp_path / "mnt")
        try:
            await asyncio.to_thread(_fill_and_free, m.path)
            routing = await c.cluster.routing()
            states = [t.public_state for ch in routing.chains.values() for t in ch.targets]
            assert states == [common_pb2.SERVING] * 9
        finally:
            assert m.unmount() == 0


def _fill_and_free(mnt: Path) -> None:
    sh("head -c 8M /dev/urandom > keep && sha256sum keep > keep.sum", mnt)
    st = os.statvfs(mnt)  # df: the 3 x 12 MiB the targets keep free is not available
    assert (st.f_bfree - st.f_bavail) * st.f_frsize == pytest.approx(36 << 20, rel=0.02)
    # 3 nodes x 48 MiB, a quarter kept free, every byte on all three: under 36 MiB of files fit
    r = sh("dd if=/dev/urandom of=big bs=1M count=64 conv=fsync status=none", mnt, check=False)
    assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr
    # df's Avail says it too: little of the ~84 MiB (summed over the three disks) there was. Not
    # nothing: chunk writes the mount had in flight beside the refused one fail with it and leave
    # their room free (CI saw 5.3 MiB, 1.8 MiB a disk, where a quiet run leaves under 3).
    st = os.statvfs(mnt)
    assert st.f_bavail * st.f_frsize < 12 << 20 < st.f_bfree * st.f_frsize
    sh("sha256sum -c --quiet keep.sum", mnt)
    sh("rm big", mnt)
    deadline = time.monotonic() + 30
    while True:  # the meta service's garbage collector removes big's chunks in the background
        r = sh("dd if=/dev/urandom of=again bs=1M count=16 conv=fsync status=none", mnt, check=False)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 0, r.stderr
    assert (mnt / "again").stat().st_size == 16 << 20
    sh("sha256sum -c --quiet keep.sum", mnt)


async def test_sigusr1_logs_where_the_mount_waits_and_it_serves_on(env: Env) -> None:
    """``kill -USR1`` on a mount: its log gets a line per task, the FUSE loop's among them down to
    pyfuse3's main loop, and the file system answers as before."""
    pid, log = env.mount.proc.popen.pid, env.mount.proc.log  # type: ignore[union-attr]
    before = len(log())
    os.kill(pid, signal.SIGUSR1)
    await wait_until(lambda: "thread MainThread:" in log()[before:], 10, "the stack dump")
    dump = log()[before:]
    assert "stack dump (SIGUSR1)" in dump
    assert re.search(r" task \S+: .*mount\.py:\d+ in serve -> ", dump), dump
    (env.mnt / "after-usr1").write_bytes(b"still here")
    assert (env.mnt / "after-usr1").read_bytes() == b"still here"


async def test_a_release_answered_after_the_unmount_logs_no_error(env: Env) -> None:
    """close(2) and then an unmount at once: the kernel sends RELEASE after close returns, and the
    unmount aborts the connection before the mount has answered it (here meta, which the release
    waits for, is stopped meanwhile). The answer then finds nobody; that is no error, and the log,
    which an operator reads for errors, does not call it one."""
    m = await env.cluster.mount(env.mnt.parent / "mnt-release", name="release")
    try:
        (m.path / "f").write_bytes(b"data")
        fd = os.open(m.path / "f", os.O_RDONLY)
        assert os.read(fd, 10) == b"data"
        meta = env.cluster.meta_procs[0].popen.pid  # type: ignore[union-attr]
        os.kill(meta, signal.SIGSTOP)
        try:
            os.close(fd)
            await asyncio.sleep(0.3)  # the release waits for meta
            done = await asyncio.to_thread(
                subprocess.run, ["fusermount3", "-u", str(m.path)], capture_output=True, timeout=20
            )
            assert done.returncode == 0, done.stderr
        finally:
            os.kill(meta, signal.SIGCONT)
        assert await asyncio.to_thread(m.proc.popen.wait, 30) == 0  # type: ignore[union-attr]
    finally:
        if is_mounted(m.path):
            m.unmount()
    log = m.proc.log()
    assert "unmounted" in log
    assert [line for line in log.splitlines() if " ERROR " in line] == [], log


def test_mount_without_a_cluster_fails_with_a_reason(env: Env, tmp_path: Path) -> None:
    cfg = tmp_path / "dead.toml"
    cfg.write_text('mgmtd_addresses = ["127.0.0.1:1"]\nrpc_timeout_s = 2.0\n')
    (tmp_path / "m").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "mount", str(tmp_path / "m"), "--config", str(cfg), "-f"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.splitlines()[-1].startswith("fs3 mount: mgmtd"), r.stderr
    assert not is_mounted(tmp_path / "m")


@pytest.mark.parametrize("foreground", [["-f"], []])
def test_mount_over_a_fuse_mount_is_refused_but_over_a_bind_mount_point_is_not(
    env: Env, tmp_path: Path, foreground: list[str]
) -> None:
    """A FUSE mount there already (a dead or hung fs3 mount, most likely) is refused before
    anything starts, through a symlink too; a plain mount point, as a container's volume is,
    takes the mount (here the dead cluster's error comes, not a refusal)."""
    cfg = tmp_path / "dead.toml"
    cfg.write_text('mgmtd_addresses = ["127.0.0.1:1"]\nrpc_timeout_s = 2.0\n')
    (tmp_path / "link").symlink_to(env.mnt)
    mount = [sys.executable, "-m", "fs3.cli.main", "mount"]
    for where in (env.mnt, tmp_path / "link"):
        r = subprocess.run(
            [*mount, str(where), "--config", str(cfg), *foreground], capture_output=True, text=True
        )
        assert r.returncode == 1
        assert r.stderr.splitlines() == [
            f"fs3 mount: {env.mnt} is already a mount point (fuse.fs3); unmount it first or pick another directory"
        ]
    volume = tmp_path / "volume"
    volume.mkdir()
    subprocess.run(["mount", "--bind", str(volume), str(volume)], check=True)
    try:
        r = subprocess.run(
            [*mount, str(volume), "--config", str(cfg), *foreground],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and r.stderr.splitlines()[-1].startswith("fs3 mount: mgmtd"), r.stderr
    finally:
        subprocess.run(["umount", str(volume)], check=True)


def _rss_bytes(pid: int | None) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_gib_file(env: Env) -> None:
    block = os.urandom(64 << 20)
    src = env.local / "block"
    src.write_bytes(block)
    big = env.mnt / "big"
    rss_before = _rss_bytes(env.mount.proc.pid)
    sh(f"for i in $(seq 32); do cat {src}; done > {big}", env.local, timeout=300)
    assert big.stat().st_size == 2 << 30
    # the mount keeps nothing of what it wrote (its bytes once stayed until a rare full collection
    # of the cyclic GC: the mount grew by about what was written)
    grown = _rss_bytes(env.mount.proc.pid) - rss_before
    assert grown < 256 << 20, f"the mount grew by {grown >> 20} MiB writing 2 GiB"
    want = hashlib.md5()
    for _ in range(32):
        want.update(block)
    got = sh(f"md5sum {big}", env.local, timeout=300).stdout.split()[0]
    assert got == want.hexdigest()
    big.unlink()
    src.unlink()


async def test_memory_a_burst_of_random_writes_took_goes_back_to_the_system(env: Env) -> None:
    """Random writes are gathered per open file (up to write_scatter_bytes) and freed at close;
    glibc keeps such freed memory mapped unless trimmed: the mount trims it every
    memory_trim_interval_s (10 s by default)."""
    d = env.mnt / "burst"
    d.mkdir()
    pid = env.mount.proc.pid
    before = _rss_bytes(pid)
    fio = (
        f"fio --directory={d} --name=b --size=96m --bs=4k --ioengine=psync --rw=randwrite --numjobs=2"
        " --number_ios=12000 --randseed=3 --end_fsync=1"
    )
    await asyncio.to_thread(sh, fio, d, timeout=100)
    grown = _rss_bytes(pid) - before
    await asyncio.to_thread(sh, f"rm -r {d}", env.local)
    await wait_until(
        lambda: _rss_bytes(pid) < before + (32 << 20), 30, f"the mount to give back {grown >> 20} MiB"
    )


def test_a_directory_removed_while_held_open_answers_as_a_local_one(env: Env) -> None:
    """fstat of a directory removed while a descriptor holds it shows no links, and listings of it
    (through that descriptor, or a shell's `ls` once it stands in it) are empty, as on ext4: they
    were ENOENT (the mount asked meta, which had dropped the inode)."""
    d = env.mnt / "held-dir"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(d)
        st = os.fstat(fd)
        assert stat.S_ISDIR(st.st_mode) and st.st_nlink == 0
        assert os.listdir(fd) == []
        out = subprocess.run(
            ["bash", "-c", f"cd /proc/self/fd/{fd} && ls -a; echo rc=$?"],
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(fd,),
        )
        assert out.stdout.split()[-1] == "rc=0", out.stdout + out.stderr
    finally:
        os.close(fd)


def test_a_directory_removed_while_a_shell_stands_in_it_answers_as_a_local_one(env: Env) -> None:
    """`cd d; rm -rf ../d; ls`: the listing is empty and stat of "." shows no links, as on ext4
    (both were ESTALE: no descriptor held the directory, and meta had dropped its inode)."""
    d = env.mnt / "cwd-dir"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    out = subprocess.run(
        ["bash", "-c", "cd cwd-dir && rm -rf ../cwd-dir && ls -a; echo rc=$?; stat -c links=%h ."],
        cwd=env.mnt,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "rc=0" in out.stdout.split() and "links=0" in out.stdout.split(), out.stdout + out.stderr
    assert "Stale" not in out.stderr and not d.exists(), out.stderr


def test_mkdir_modes_and_dirs_listing(env: Env) -> None:
    d = env.mnt / "listing"
    d.mkdir(mode=0o750)
    assert stat.S_IMODE(d.stat().st_mode) == 0o750 & ~_umask()
    names = {f"n{i:04d}" for i in range(300)}
    for n in names:
        (d / n).write_bytes(b"")
    assert set(os.listdir(d)) == names
    assert sh("ls -a listing | head -2 | tr '\\n' ' '", env.mnt).stdout == ". .. "
    shutil.rmtree(d)
    assert not d.exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# A listing is read from meta as the kernel asks for it, not replayed from opendir: pyfuse3 answers
# READDIRPLUS, and the kernel links every listed name to the listed inode and takes its attributes.


def test_listing_does_not_revive_a_name_unlinked_after_opendir(env: Env) -> None:
    d = env.mnt / "listing-unlink"
    d.mkdir()
    (d / "x").write_bytes(b"1")
    with os.scandir(d) as it:
        os.unlink(d / "x")
        listed = [e.name for e in it]
    assert not (d / "x").exists()
    (d / "x").write_bytes(b"2")
    assert (d / "x").read_bytes() == b"2"
    assert listed == []


def test_listing_after_rename_over_a_name_lists_the_new_file(env: Env) -> None:
    d = env.mnt / "listing-rename"
    d.mkdir()
    (d / "cfg").write_bytes(b"old!")
    with os.scandir(d) as it:
        (d / "cfg.tmp").write_bytes(b"new")
        os.rename(d / "cfg.tmp", d / "cfg")
        listed = [(e.name, e.stat().st_size) for e in it]
    assert (d / "cfg").read_bytes() == b"new"
    assert listed == [("cfg", 3)]


def test_listing_does_not_roll_back_a_size_written_after_opendir(env: Env) -> None:
    d = env.mnt / "listing-size"
    d.mkdir()
    f = d / "f"
    f.write_bytes(b"")
    with os.scandir(d) as it:
        f.write_bytes(b"A" * 100)
        assert [e.name for e in it] == ["f"]
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"B" * 10)
    finally:
        os.close(fd)
    assert f.read_bytes() == b"A" * 100 + b"B" * 10


def test_rewinddir_lists_the_directory_as_it_is_now(env: Env) -> None:
    d = env.mnt / "listing-rewind"
    d.mkdir()
    (d / "old").touch()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.listdir(fd) == ["old"]  # CPython rewinds the descriptor for each listing
        (d / "new").touch()
        os.unlink(d / "old")
        assert os.listdir(fd) == ["new"]
    finally:
        os.close(fd)


def _getdents(fd: int, bufsize: int) -> Iterator[str]:
    """The names getdents64 returns with a buffer of ``bufsize`` bytes, called when the previous
    call's names are consumed. A small buffer makes the kernel stop mid-reply and ask the file
    system again, from the last offset it returned, at the next call."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(bufsize)
    while (n := libc.syscall(217, fd, buf, bufsize)) > 0:  # SYS_getdents64 on x86-64
        raw = buf.raw[:n]
        pos = 0
        while pos < n:
            reclen = int.from_bytes(raw[pos + 16 : pos + 18], "little")
            yield raw[pos + 19 : pos + reclen].split(b"\0", 1)[0].decode()
            pos += reclen
    if n < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _dents(fd: int, bufsize: int = 1 << 16) -> list[tuple[str, int]]:
    """(name, d_off) of one getdents64 call."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(bufsize)
    n = libc.syscall(217, fd, buf, bufsize)  # SYS_getdents64 on x86-64
    if n < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    out, pos = [], 0
    while pos < n:
        off, reclen = struct.unpack_from("<qH", buf.raw, pos + 8)
        out.append((buf.raw[pos + 19 : pos + reclen].split(b"\0", 1)[0].decode(), off))
        pos += reclen
    return out


def _rest_from(d: Path, cookie: int) -> list[str]:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.lseek(fd, cookie, os.SEEK_SET)
        rest: list[str] = []
        while batch := _dents(fd):
            rest += [name for name, _ in batch]
        return rest
    finally:
        os.close(fd)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="getdents64 syscall number")
def test_a_directory_position_resumes_on_another_open_of_it(env: Env) -> None:
    """A position (telldir, d_off) one open directory gave resumes on another, and after the
    first is closed, as on ext4 (knfsd re-exporting the mount reopens the directory for each
    READDIR at the last cookie): offsets were each handle's own, and another read as the end,
    silently. An offset the mount never gave out is EINVAL, not an empty rest."""
    d = env.mnt / "cookies"
    d.mkdir()
    for i in range(500):
        (d / f"n{i:04d}").touch()
    a = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = _dents(a, 2048)
        cookie = first[-1][1]
        rest_a: list[str] = []
        while batch := _dents(a):
            rest_a += [name for name, _ in batch]
        assert len(first) + len(rest_a) == 502 and len(rest_a) > 400
        assert _rest_from(d, cookie) == rest_a  # another open, while the first is open
    finally:
        os.close(a)
    assert _rest_from(d, cookie) == rest_a  # and once it is closed
    with pytest.raises(OSError) as bogus:
        _rest_from(d, cookie + 100_000)
    assert bogus.value.errno == errno.EINVAL
    # offsets forgotten (17 other directories listed and closed since) are never another name's
    for i in range(17):
        (env.mnt / f"cookies-{i}").mkdir()
        os.listdir(env.mnt / f"cookies-{i}")
    assert len(_rest_from(d, 0)) == 502  # the directory listed again: new offsets
    with pytest.raises(OSError) as forgotten:
        _rest_from(d, cookie)
    assert forgotten.value.errno == errno.EINVAL


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="getdents64 syscall number")
def test_listing_a_directory_while_it_changes(env: Env) -> None:
    d = env.mnt / "listing-changing"
    d.mkdir()
    names = [f"f{i:04d}" for i in range(600)]
    for n in names:
        (d / n).touch()
    seen: list[str] = []
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in _getdents(fd, 1024):
            seen.append(name)
            if len(seen) == 10:
                # removed ahead of the listing: not listed; created ahead of it: listed
                for n in names[300:]:
                    os.unlink(d / n)
                (d / "g-new").touch()
    finally:
        os.close(fd)
    assert sorted(seen) == [".", ".."] + names[:300] + ["g-new"]
    shutil.rmtree(d)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="getdents64 syscall number")
def test_listing_with_a_small_buffer_resumes_at_each_offset(env: Env) -> None:
    d = env.mnt / "listing-small-buffer"
    d.mkdir()
    names = {f"entry-with-a-longer-name-{i:04d}" for i in range(300)}
    for n in names:
        (d / n).touch()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        listed = list(_getdents(fd, 300))
        assert listed[:2] == [".", ".."] and sorted(listed[2:]) == sorted(names)
        os.lseek(fd, 0, os.SEEK_SET)
        assert list(_getdents(fd, 1 << 16)) == listed
    finally:
        os.close(fd)
    shutil.rmtree(d)


async def test_a_mount_paused_past_its_session_fails_only_its_old_handles(tmp_path: Path) -> None:
    """A mount stopped (SIGSTOP) until meta has ended its open files' sessions and collected one
    unlinked meanwhile: after SIGCONT, fsync of a descriptor opened before is EIO (its bytes are
    not written: a truncate-up shows zeros), a read of the collected file is EIO rather than
    zeros, and a descriptor opened after writes, fsyncs and closes with no error."""
    async with FsCluster(
        tmp_path,
        chains=1,
        stripe=1,
        mgmtd_extra={"client_session_timeout_s": 3.0},
        meta_extra={"session_timeout_s": 1.0},
    ) as c:
        m = await c.mount(tmp_path / "mnt")
        fs = await c.connect()
        path, doomed = m.path / "f", m.path / "doomed"

        def before() -> tuple[int, int]:
            old = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(old, b"1" * 4096)
            os.fsync(old)
            doomed.write_bytes(b"d" * 4096)
            return old, os.open(doomed, os.O_RDONLY)

        old, reader = await asyncio.to_thread(before)
        ino = (await fs.stat("/doomed")).st_ino
        assert m.proc.popen is not None
        os.kill(m.proc.popen.pid, signal.SIGSTOP)
        try:
            await fs.unlink("/doomed")
            targets = list(fs.storage.routing.routing.targets)

            async def collected() -> bool:
                return not any([await fs.storage.dump_chunk_meta(t, ino) for t in targets])

            await wait_until(collected, 60, "the unlinked file's chunks to be collected")
        finally:
            os.kill(m.proc.popen.pid, signal.SIGCONT)

        def after() -> None:
            os.write(old, b"2" * 4096)  # buffered in the mount
            with pytest.raises(OSError) as e:
                os.fsync(old)
            assert e.value.errno == errno.EIO
            with pytest.raises(OSError) as e:
                os.pread(reader, 4096, 0)
            assert e.value.errno == errno.EIO
            new = os.open(path, os.O_WRONLY)
            os.pwrite(new, b"3" * 10, 0)
            os.fsync(new)  # the old descriptor's lost session is not this one's error
            os.close(new)
            os.close(reader)
            os.close(old)
            os.truncate(path, 8192)
            assert path.read_bytes() == b"3" * 10 + b"1" * 4086 + bytes(4096)

        await asyncio.to_thread(after)
        assert await fs.read_file("/f") == b"3" * 10 + b"1" * 4086 + bytes(4096)
        assert not any([await fs.storage.dump_chunk_meta(t, ino) for t in targets])


@pytest.mark.parametrize("end", ["sigterm", "abort"])
async def test_a_mount_told_to_stop_does_not_wait_for_reads_storage_does_not_answer(
    tmp_path: Path, end: str
) -> None:
    """A read waits on storage that does not answer (every storage daemon stopped) when the mount is
    told to stop (SIGTERM) or its connection is aborted (fusectl, as ``fs3 umount --force`` does).
    The read is ended a moment later (the reader gets an error) and the mount exits and is gone,
    rather than holding the process, and after a SIGTERM the mount point too (nobody serves it), for
    the storage client's whole retry budget (a minute)."""
    async with FsCluster(tmp_path, chains=1, stripe=1) as c:
        m = await c.mount(tmp_path / "mnt")
        await asyncio.to_thread((m.path / "f").write_bytes, os.urandom(3 << 20))
        reader = await c.mount(tmp_path / "cold", name="cold")  # its page cache holds nothing of f
        storage = [n.proc.pid for n in c.cluster.nodes if n.proc is not None]
        for pid in storage:
            os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            read = asyncio.create_task(asyncio.to_thread((reader.path / "f").read_bytes))
            await asyncio.sleep(0.5)
            assert not read.done()
            if end == "sigterm":
                os.kill(reader.proc.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
            else:
                fusectl, why = fuse_connections()
                if fusectl is None:
                    pytest.skip(why)
                minor = mount_device(str(reader.path))[1]  # type: ignore[index]
                (fusectl / str(minor) / "abort").write_text("1")
            # far less than the retry budget (60 s); a bound on a wait that was a minute, not a speed
            assert await asyncio.to_thread(reader.proc.popen.wait, 30) == 0  # type: ignore[union-attr]
            with pytest.raises(OSError) as e:
                await asyncio.wait_for(read, 10)
            assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), e.value
            # the mount is gone: unmounted by the mount process, also after an abort (libfuse
            # takes an aborted connection for an unmount done and leaves the dead mount)
            assert not is_mounted(reader.path)
        finally:
            for pid in storage:
                os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
            force_unmount(reader.path)
        assert "ended reads still in flight" in reader.proc.log()


async def test_an_unmount_does_not_wait_long_for_meta_to_close_the_files_left_open(tmp_path: Path) -> None:
    """A mount told to stop while files are open and meta does not answer (stopped): the closes at
    unmount, and a close (RELEASE) in flight, are given up after a few seconds, rather than each
    waiting out the RPC deadline; the mount exits and is gone, and meta, back, ends the sessions
    left once their client has gone."""
    async with FsCluster(tmp_path, chains=1, stripe=1) as c:
        # a long RPC deadline: waited out, the exit would take a minute
        m = await c.mount(tmp_path / "mnt", rpc_timeout_s=60.0)
        await asyncio.to_thread((m.path / "f").write_bytes, b"data")
        fds = [os.open(m.path / "f", os.O_RDONLY) for _ in range(3)]
        meta = c.meta_procs[0].popen.pid  # type: ignore[union-attr]
        os.kill(meta, signal.SIGSTOP)
        try:
            # a close whose RELEASE is in flight (waiting for meta) when the mount is told to stop,
            # as the kernel's RELEASE of a file just written can be (seen in CI under load)
            os.close(fds.pop())
            await asyncio.sleep(0.5)
            os.kill(m.proc.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
            # a bound on a wait that was a minute, not a speed
            assert await asyncio.to_thread(m.proc.popen.wait, 30) == 0  # type: ignore[union-attr]
        finally:
            os.kill(meta, signal.SIGCONT)
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        assert not is_mounted(m.path)
        assert "closing open files at unmount took longer" in m.proc.log()
        assert "gave up closes still in flight" in m.proc.log()


async def test_directory_attributes_after_this_mounts_own_changes(env: Env) -> None:
    """The kernel asks a directory's attributes again after every entry this mount makes in it; the
    mount answers those from meta's last answer with its creates' times folded in (no meta round
    trip per create). What a user sees stays what meta says: the directory's mtime is the last
    create's, and after any other change (unlink, rename, chmod, mkdir, link, an xattr) the mode,
    link count and times are meta's new ones."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # attributes kept long: an answer kept past a change would be seen, not expire first
    m = await env.cluster.mount(
        env.mnt.parent / "mnt-dirattrs", name="dirattrs", metrics_port=port, attr_timeout_s=30.0
    )
    try:
        await asyncio.to_thread(_check_dir_attrs, m.path, port, env.mnt)
    finally:
        assert m.unmount() == 0


def _check_dir_attrs(mnt: Path, port: int, other: Path) -> None:
    def kept() -> float:
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        found = re.search(r"^fs3_fuse_dir_attrs_kept_total (\S+)$", page, re.M)
        return float(found.group(1)) if found else 0.0

    d = mnt / "attrs"
    d.mkdir()
    os.stat(d)
    before, started = kept(), time.monotonic()
    for i in range(10):
        os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))  # nothing written: ctime stays
        # the directory's times are the create's, as meta stamped them
        assert os.stat(d).st_mtime_ns == os.stat(d / f"f{i}").st_ctime_ns
    # the GETATTRs after the creates took no meta round trip, but one after each new lookup of the
    # directory, which the kernel makes once its entry expired (entry_timeout_s 1, relied on below:
    # the loop outlasts it on a loaded machine) and which drops the kept copy
    assert kept() - before >= 9 - int(time.monotonic() - started)

    def changed(what: Callable[[], object]) -> os.stat_result:
        old, k = os.stat(d), kept()
        time.sleep(0.002)
        what()
        os.stat(d)  # a GETATTR the kept attributes do not answer (the change dropped them)
        assert kept() == k
        (d / f"after-{time.monotonic_ns()}").write_bytes(b"")  # the kernel asks again after this
        new = os.stat(d)
        assert new.st_ctime_ns > old.st_ctime_ns
        return new

    changed(lambda: os.unlink(d / "f0"))
    changed(lambda: os.rename(d / "f1", d / "g1"))
    assert stat.S_IMODE(changed(lambda: os.chmod(d, 0o700)).st_mode) == 0o700
    nlink = os.stat(d).st_nlink
    assert changed(lambda: os.mkdir(d / "sub")).st_nlink == nlink + 1
    changed(lambda: os.link(d / "f2", d / "f2-link"))
    changed(lambda: os.setxattr(d, "user.k", b"v"))
    (mnt / "elsewhere").mkdir()
    changed(lambda: os.rename(mnt / "elsewhere", d / "moved"))  # into it from another directory
    assert os.stat(d).st_nlink == nlink + 2
    # another client's chmod, which a lookup here brings to the kernel: a create here afterwards
    # must not bring the kept (older) mode back
    os.stat(d)
    os.chmod(other / "attrs", 0o750)
    time.sleep(1.2)  # the kernel's entry of the name runs out (entry_timeout_s 1): looked up again
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o750
    (d / "after-chmod").write_bytes(b"")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o750


async def test_the_mount_forgets_what_it_kept_of_inodes_the_kernel_forgot(env: Env) -> None:
    """The mount kept a page-cache mark of every file it ever opened (and attributes of
    directories) for its whole life: its memory grew with every distinct file (soak review: about
    0.25 KB each, never freed). What it keeps of an inode goes when the kernel forgets the inode."""
    drop = Path("/proc/sys/vm/drop_caches")
    if not os.access(drop, os.W_OK):
        pytest.skip("needs root to make the kernel forget inodes (/proc/sys/vm/drop_caches)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = await env.cluster.mount(env.mnt.parent / "mnt-forget", name="forget", metrics_port=port)

    def remembered() -> float:
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        found = re.search(r"^fs3_fuse_inodes_remembered (\S+)$", page, re.M)
        assert found, page[:2000]
        return float(found.group(1))

    def work() -> tuple[float, float]:
        d = m.path / "churn"
        d.mkdir()
        held = []  # held open while counted: another test's drop_caches cannot make them go
        try:
            for i in range(300):
                f = d / f"f{i}"
                f.write_bytes(b"x")
                assert f.read_bytes() == b"x"
                held.append(os.open(f, os.O_RDONLY))
            busy = remembered()
        finally:
            for fd in held:
                os.close(fd)
        drop.write_text("2\n")  # the kernel forgets the inodes it does not hold
        deadline = time.monotonic() + 20
        while remembered() > 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = remembered()
        shutil.rmtree(d)
        return busy, after

    try:
        busy, after = await asyncio.to_thread(work)
    finally:
        assert m.unmount() == 0
    assert busy >= 300 and after <= 20, (busy, after)


_BLOCKED_READ = """
import os, signal, sys
if sys.argv[2] == "dfl":
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as dd or cat: Ctrl-C kills
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
print("reading", flush=True)
try:
    os.pread(fd, 1 << 20, 0)
except KeyboardInterrupt:
    sys.exit(42)
"""
_BLOCKED_FSYNC = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"k" * (1 << 20))
print("syncing", flush=True)
os.fsync(fd)
"""

_FSYNC_CATCHING_SIGTERM = """
import ctypes, os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: None)  # a daemon's handler (SA_RESTART)
signal.siginterrupt(signal.SIGTERM, False)
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"t" * 4096)
print("syncing", flush=True)
rc = libc.fsync(fd)  # not os.fsync, which retries EINTR itself
print(rc, ctypes.get_errno(), flush=True)
"""


async def test_a_caller_waiting_on_stopped_storage_can_be_killed(env: Env) -> None:
    """A read or fsync the mount had taken while storage did not answer held its caller in the
    kernel's uninterruptible wait, killed or not, for the client's whole retry budget (60 s): now
    the mount ends the request (EINTR) once the caller is being killed, and the caller dies at
    once. Nothing is lost: the killed writer's buffered bytes reach storage later (at release),
    and the mount serves on."""
    data = os.urandom(1 << 20)
    await asyncio.to_thread((env.mnt / "kill-read").write_bytes, data)
    storage = [n.proc.pid for n in env.cluster.cluster.nodes if n.proc is not None]
    procs: list[asyncio.subprocess.Process] = []
    for pid in storage:
        os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        for script, name, how, sig, dies in (
            (_BLOCKED_READ, "kill-read", "dfl", signal.SIGINT, -signal.SIGINT),
            (_BLOCKED_FSYNC, "kill-fsync", "", signal.SIGKILL, -signal.SIGKILL),
        ):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", script, str(env.mnt / name), how, stdout=subprocess.PIPE
            )
            procs.append(proc)
            assert proc.stdout is not None
            await proc.stdout.readline()
            await asyncio.sleep(1.5)  # in the mount's hands, waiting on storage
            assert proc.returncode is None, name
            proc.send_signal(sig)
            start = time.monotonic()
            returncode = await asyncio.wait_for(proc.wait(), 30)
            assert (returncode, name, how) == (dies, name, how)
            assert time.monotonic() - start < 10, (name, how)  # (it was about 60 s)
    finally:
        for pid in storage:
            os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert await asyncio.to_thread((env.mnt / "kill-read").read_bytes) == data
    await wait_until(lambda: os.stat(env.mnt / "kill-fsync").st_size == 1 << 20, timeout_s=60)
    assert await asyncio.to_thread((env.mnt / "kill-fsync").read_bytes) == b"k" * (1 << 20)
    # a signal the caller catches and goes on after does not fail its fsync with EINTR (diff
    # review: a daemon's SIGHUP or SIGTERM handler did): only a kill ends an fsync or a close
    for pid in storage:
        os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FSYNC_CATCHING_SIGTERM, str(env.mnt / "caught"), stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        await proc.stdout.readline()
        await asyncio.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(2.5)  # past the mount's look at its caller
    finally:
        for pid in storage:
            os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert out.decode().split() == ["0", "0"], out  # fsync succeeded once storage was back


_WRITE_AND_HOLD = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"w" * (1 << 20))
print("written", flush=True)
time.sleep(600)
"""


async def test_an_unmount_that_cannot_write_out_what_files_hold_says_so_and_ends_in_time(env: Env) -> None:
    """A mount stopped (SIGTERM) while a writer's bytes were buffered and storage did not answer
    exited 0 after 95 s, the bytes lost with warnings only: systemd (TimeoutStopSec=60) would have
    killed it and left a dead mount. It gives up within its bounds now, says what is lost, and
    exits 1 (helper review)."""
    path = env.mnt.parent / "mnt-lost"
    path.mkdir()
    log = env.mnt.parent / "mnt-lost.log"
    with open(log, "wb") as out:  # noqa: ASYNC230 - before anything runs
        mount = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fs3.cli.main", "mount", str(path), "--config", str(env.mount.config),
            "--foreground", stderr=out,
        )  # fmt: skip
    storage = [n.proc.pid for n in env.cluster.cluster.nodes if n.proc is not None]
    writer = None
    stopped = False
    try:
        await wait_until(lambda: is_mounted(path) and os.path.isdir(path), timeout_s=60)
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WRITE_AND_HOLD, str(path / "held"), stdout=subprocess.PIPE
        )
        assert writer.stdout is not None
        assert await asyncio.wait_for(writer.stdout.readline(), 60) == b"written\n"
        for pid in storage:
            os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
        stopped = True
        start = time.monotonic()
        mount.send_signal(signal.SIGTERM)
        await asyncio.wait_for(mount.wait(), 120)
        took = time.monotonic() - start
        said = log.read_text()[-3000:]
        assert mount.returncode == 1, said
        assert "could not be written out and closed" in said and "count=1" in said, said
        assert took < 50, took  # (95 s before)
    finally:
        if stopped:
            for pid in storage:
                os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
        for proc in (writer, mount):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
        force_unmount(path)


def test_an_option_libfuse_does_not_know_is_a_usage_error(env: Env) -> None:
    """fs3 mount -o bogus exited 1, as for a cluster that could not be reached, so systemd started
    it again and again; an option to mend exits 2, in the background as in the foreground."""
    path = env.mnt.parent / "mnt-bogus"
    path.mkdir()
    base = [sys.executable, "-m", "fs3.cli.main", "mount", str(path), "--config", str(env.mount.config)]
    try:
        for extra in ([], ["--foreground"]):
            r = subprocess.run([*base, *extra, "-o", "bogus"], capture_output=True, text=True, timeout=60)
            assert r.returncode == 2, r.stderr
            assert "libfuse refused the mount options (bogus)" in r.stderr, r.stderr
            deadline = time.monotonic() + 30  # a background mount's process ends after its word
            while _pids_serving(path):
                assert time.monotonic() < deadline, "the failed mount's process did not end"
                time.sleep(0.05)
            assert not is_mounted(path)
        # one the kernel refuses (exited 1: the unit started it again every 5 s), and a subtype
        # (fs3 umount knows an fs3 mount by its own)
        for option, said in (("blksize=4096", "the mount was refused"), ("subtype=xx", "subtype")):
            r = subprocess.run([*base, "-o", option], capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and said in r.stderr, (option, r.stderr)
            assert not is_mounted(path)
        # options in the order given, the last of two that disagree winning as with mount(8): a
        # set's order changed with each process, and "-o rw,ro" mounted rw or ro at random
        for options, mode in (("rw,ro", "ro"), ("ro,rw", "rw")):
            r = subprocess.run([*base, "-o", options], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            try:
                flags = next(line.split()[3] for line in open("/proc/mounts") if line.split()[1] == str(path))
                assert flags.split(",")[0] == mode, (options, flags)
            finally:
                subprocess.run(["fusermount3", "-u", str(path)], check=True, timeout=60)
    finally:
        for pid in _pids_serving(path):
            os.kill(pid, signal.SIGKILL)
        force_unmount(path)


def test_mount_point_paths_resolve_as_the_kernel_resolves_them(tmp_path: Path) -> None:
    """resolved() names a mount point without a stat of it (one through a mount whose meta is down
    waits out its timeout); it took 'link/..' away as text before following the link, so
    'fs3 local up --mount s/../../mnt' named another directory than the kernel does."""
    from fs3.cli.fuse_mounts import resolved

    (tmp_path / "d1" / "d2").mkdir(parents=True)
    (tmp_path / "mnt").mkdir()
    (tmp_path / "s").symlink_to(tmp_path / "d1" / "d2")
    (tmp_path / "rel").symlink_to("d1/d2/../../mnt")  # relative, with '..' after a symlink-free part
    (tmp_path / "d1" / "up").symlink_to("../s/../../mnt")
    (tmp_path / "loop").symlink_to("loop")
    for path in (
        "s/../../mnt",
        "mnt/",
        "mnt/.",
        "./mnt",
        "rel",
        "d1/up",
        "mnt/..",
        "s/..",
        "loop",
        "missing",
    ):
        full = str(tmp_path / path)
        assert resolved(full) == os.path.realpath(full), path
    assert resolved("/") == "/"
