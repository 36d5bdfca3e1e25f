"""Permission rules meta must apply itself, as Linux (ext4, fs.protected_hardlinks=1) does: through
the native API no kernel checks first (mem and lmdb engines). Each case was checked against a local
ext4 as an unprivileged user."""

from __future__ import annotations

import errno
import itertools
from collections.abc import Awaitable

import pytest
from meta_tree import ALICE, BOB, BOB_IN_500, Tree

from fs3.errors import FS3Error
from fs3.meta.permissions import ROOT, Credentials
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)

S_IFREG, S_IFIFO = 0o100000, 0o010000
_names = itertools.count()


async def _errno(op: Awaitable[object]) -> int:
    """The errno ``op`` fails with, 0 when it succeeds."""
    try:
        await op
    except FS3Error as e:
        return e.errno
    return 0


def _chmod(mode: int) -> m.SetattrReq:
    return m.SetattrReq(fields=m.SETATTR_MODE, mode=mode)


async def _file(tree: Tree, owner: Credentials, mode: int) -> int:
    """A new regular file in /pub owned by ``owner`` with exactly ``mode`` (set by root)."""
    ino = (await tree.store.create(owner, tree["/pub"], f"f{next(_names)}".encode(), 0o600)).inode
    await tree.store.setattr(ROOT, ino.id, _chmod(mode))
    return ino.id


async def _setgid_dir(tree: Tree) -> int:
    """/grp (root:500) made 02777: anyone may create in it, and what they create gets group 500."""
    await tree.store.setattr(ROOT, tree["/grp"], _chmod(0o2777))
    return tree["/grp"]


async def test_hard_link_needs_ownership_or_a_plain_file_the_caller_may_read_and_write(tree: Tree) -> None:
    s = tree.store
    pub = tree["/pub"]

    async def link(cred: Credentials, inode_id: int, parent: int = pub) -> int:
        return await _errno(s.link(cred, inode_id, parent, f"l{next(_names)}".encode()))

    # another's file bob may not both read and write
    assert await link(BOB, await _file(tree, ALICE, 0o600)) == errno.EPERM
    assert await link(BOB, await _file(tree, ALICE, 0o644)) == errno.EPERM
    # one he may read and write, setgid without group execute (no privilege) included
    assert await link(BOB, await _file(tree, ALICE, 0o666)) == 0
    assert await link(BOB, await _file(tree, ALICE, 0o2766)) == 0
    # setuid, or setgid the group may execute, never
    assert await link(BOB, await _file(tree, ALICE, 0o4777)) == errno.EPERM
    assert await link(BOB, await _file(tree, ALICE, 0o2777)) == errno.EPERM
    # regular files only
    fifo = (await s.mknod(ALICE, pub, b"fifo", S_IFIFO | 0o666)).id
    assert await link(BOB, fifo) == errno.EPERM
    # the owner and root link whatever they like
    assert await link(BOB, await _file(tree, BOB, 0o000)) == 0
    assert await link(ROOT, await _file(tree, ALICE, 0o4700)) == 0
    assert await link(ROOT, fifo) == 0
    # refused before the target directory's write permission is looked at, as by linkat(2)
    assert await link(BOB, await _file(tree, ALICE, 0o600), tree["/ro"]) == errno.EPERM
    assert await link(BOB, await _file(tree, ALICE, 0o666), tree["/ro"]) == errno.EACCES


async def test_new_file_in_setgid_directory_loses_setgid_unless_its_maker_is_in_the_group(tree: Tree) -> None:
    s = tree.store
    sg = await _setgid_dir(tree)
    # bob is not in group 500, which the file gets from the directory
    f = (await s.create(BOB, sg, b"new", 0o2755)).inode
    assert (f.mode & 0o7777, f.gid) == (0o755, 500)
    assert (await s.stat(f.id)).mode & 0o7777 == 0o755
    n = await s.mknod(BOB, sg, b"n", S_IFREG | 0o2755)
    assert n.mode & 0o7777 == 0o755
    fifo = await s.mknod(BOB, sg, b"fifo", S_IFIFO | 0o2777)
    assert fifo.mode & 0o7777 == 0o777
    # setgid without group execute grants nothing and stays
    assert (await s.create(BOB, sg, b"lock", 0o2745)).inode.mode & 0o7777 == 0o2745
    # a member of the group, and root, keep it
    assert (await s.create(BOB_IN_500, sg, b"member", 0o2755)).inode.mode & 0o7777 == 0o2755
    assert (await s.create(ROOT, sg, b"root", 0o2755)).inode.mode & 0o7777 == 0o2755
    # outside a setgid directory the file's group is the caller's own
    assert (await s.create(BOB, tree["/pub"], b"own", 0o2755)).inode.mode & 0o7777 == 0o2755


async def test_chmod_of_a_directory_outside_the_callers_groups_drops_setgid(tree: Tree) -> None:
    s = tree.store
    d = (await s.mkdir(ROOT, tree["/pub"], b"bobs", 0o755)).id
    await s.setattr(ROOT, d, m.SetattrReq(fields=m.SETATTR_UID | m.SETATTR_GID, uid=1001, gid=500))
    # bob owns it but is not in its group 500
    assert (await s.setattr(BOB, d, _chmod(0o2775))).mode & 0o7777 == 0o775
    assert (await s.stat(d)).mode & 0o7777 == 0o775
    assert (await s.setattr(BOB_IN_500, d, _chmod(0o2775))).mode & 0o7777 == 0o2775
    assert (await s.setattr(ROOT, d, _chmod(0o2755))).mode & 0o7777 == 0o2755


async def test_mkdir_takes_only_the_sticky_bit_of_the_special_bits_asked_for(tree: Tree) -> None:
    s = tree.store
    d = await s.mkdir(BOB, tree["/pub"], b"d", 0o7755)
    assert d.mode & 0o7777 == 0o1755
    assert (await s.mkdir(ROOT, tree["/pub"], b"r", 0o6755)).mode & 0o7777 == 0o755
    # setgid comes from a setgid parent, for anyone
    sub = await s.mkdir(BOB, await _setgid_dir(tree), b"sub", 0o7755)
    assert (sub.mode & 0o7777, sub.gid) == (0o3755, 500)


async def test_one_time_to_now_and_the_other_omitted_is_for_the_owner(tree: Tree) -> None:
    s = tree.store
    atime_now = m.SetattrReq(fields=m.SETATTR_ATIME_NOW)
    mtime_now = m.SetattrReq(fields=m.SETATTR_MTIME_NOW)
    touch = m.SetattrReq(fields=m.SETATTR_ATIME_NOW | m.SETATTR_MTIME_NOW)
    writable = await _file(tree, ALICE, 0o666)
    readable = await _file(tree, ALICE, 0o644)
    # a writer who does not own the file: utimensat {NOW, OMIT} and {OMIT, NOW} are EPERM, with or
    # without write permission
    for f in (writable, readable):
        assert await _errno(s.setattr(BOB, f, atime_now)) == errno.EPERM
        assert await _errno(s.setattr(BOB, f, mtime_now)) == errno.EPERM
    # touch (both to now) is allowed to a writer, and only to one
    before = await s.stat(writable)
    r = await s.setattr(BOB, writable, touch)
    assert r.mtime_ns > before.mtime_ns and r.atime_ns > before.atime_ns
    assert await _errno(s.setattr(BOB, readable, touch)) == errno.EACCES
    # the owner sets one alone, the other stays
    await s.setattr(
        ALICE, readable, m.SetattrReq(fields=m.SETATTR_ATIME | m.SETATTR_MTIME, atime_ns=5, mtime_ns=7)
    )
    r = await s.setattr(ALICE, readable, atime_now)
    assert r.atime_ns > 5 and r.mtime_ns == 7


async def test_user_xattrs_of_a_sticky_directory_are_its_owners(tree: Tree) -> None:
    s = tree.store
    sticky = tree["/sticky"]  # 1777 root
    await s.setxattr(ROOT, sticky, b"user.r", b"1")
    assert await _errno(s.setxattr(BOB, sticky, b"user.x", b"v")) == errno.EPERM
    assert await _errno(s.removexattr(BOB, sticky, b"user.r")) == errno.EPERM
    assert await s.getxattr(BOB, sticky, b"user.r") == b"1"
    # EPERM, not EACCES, where bob may not write it either
    await s.setattr(ROOT, sticky, _chmod(0o1755))
    assert await _errno(s.setxattr(BOB, sticky, b"user.x", b"v")) == errno.EPERM
    await s.setattr(ROOT, sticky, _chmod(0o1777))
    # bob's own sticky directory, and a file he may write in another's, are his to label
    mine = (await s.mkdir(BOB, sticky, b"mine", 0o1777)).id
    await s.setxattr(BOB, mine, b"user.x", b"v")
    shared = (await s.create(ROOT, sticky, b"shared", 0o666)).inode.id
    await s.setxattr(BOB, shared, b"user.x", b"v")
    assert await s.getxattr(ROOT, shared, b"user.x") == b"v"


async def test_user_xattrs_exist_on_files_and_directories_only(tree: Tree) -> None:
    s = tree.store
    fifo = (await s.mknod(ALICE, tree["/pub"], b"fifo", S_IFIFO | 0o600)).id
    # none to set, even for root; none to read, whatever the mode says
    assert await _errno(s.setxattr(ROOT, fifo, b"user.x", b"v")) == errno.EPERM
    assert await _errno(s.setxattr(ALICE, tree["/sym"], b"user.x", b"v")) == errno.EPERM
    assert await _errno(s.getxattr(BOB, fifo, b"user.x")) == errno.ENODATA
    assert await _errno(s.getxattr(BOB, tree["/sym"], b"user.x")) == errno.ENODATA
