"""Setuid and setgid bits go as on Linux when a file is written, truncated or chowned: libfuse's
FUSE_CAP_HANDLE_KILLPRIV leaves clearing them to the file system, so meta must do it (mem and lmdb
engines)."""

from __future__ import annotations

import itertools

import pytest
from meta_tree import ALICE, BOB, Tree

from fs3.errors import FS3Error, StatusCode
from fs3.meta.permissions import ROOT, Credentials
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)

O_WRONLY, O_RDWR, O_TRUNC = 0o1, 0o2, 0o1000
_names = itertools.count()


async def _file(tree: Tree, mode: int, owner: Credentials = ROOT, name: bytes = b"") -> int:
    """A new file in /pub owned by ``owner`` with exactly ``mode`` (set by root)."""
    name = name or f"f{next(_names)}".encode()
    ino = (await tree.store.create(owner, tree["/pub"], name, 0o600)).inode
    await tree.store.setattr(ROOT, ino.id, m.SetattrReq(fields=m.SETATTR_MODE, mode=mode))
    return ino.id


async def _mode(tree: Tree, inode_id: int) -> int:
    return (await tree.store.stat(inode_id)).mode


async def test_unprivileged_write_clears_setuid_when_it_settles(tree: Tree) -> None:
    s = tree.store
    # 04777 root-owned: anyone may write it; writing must not keep a root program
    f = await _file(tree, 0o4777)
    _, sid = await s.open(BOB, f, O_WRONLY)
    assert (await s.sync(f, sid, 100, wrote=True)).mode == 0o777
    assert await _mode(tree, f) == 0o777
    # setgid with group execute goes too; on close as on fsync
    g = await _file(tree, 0o6777)
    _, sid = await s.open(BOB, g, O_RDWR)
    assert (await s.close(g, sid, 10, wrote=True)).mode == 0o777
    # setgid without group execute stays for a member of the file's group (it grants nothing),
    # and goes for anyone else (Linux 6.2 on: ext4 here clears it for a non-member)
    h = await _file(tree, 0o6766)
    _, sid = await s.open(BOB, h, O_WRONLY)
    assert (await s.close(h, sid, 10, wrote=True)).mode == 0o766
    h = await _file(tree, 0o6766)
    member = Credentials(BOB.uid, BOB.gid, frozenset({0}))  # in root's group, the file's
    _, sid = await s.open(member, h, O_WRONLY)
    assert (await s.close(h, sid, 10, wrote=True)).mode == 0o2766


async def test_owner_write_clears_too_and_a_new_file_session_counts(tree: Tree) -> None:
    s = tree.store
    # Linux clears for the owner as well (a setgid group the owner is not in is at stake)
    r = await s.create(ALICE, tree["/pub"], b"mine", 0o6755, session=True)
    assert r.inode.mode == 0o6755
    assert (await s.close(r.inode.id, r.session_id, 1, wrote=True)).mode == 0o755


async def test_root_write_keeps_the_bits(tree: Tree) -> None:
    s = tree.store
    f = await _file(tree, 0o6777)
    _, sid = await s.open(ROOT, f, O_WRONLY)
    assert (await s.sync(f, sid, 100, wrote=True)).mode == 0o6777
    assert (await s.close(f, sid, 200, wrote=True)).mode == 0o6777
    # a file root created with the bits and wrote
    r = await s.create(ROOT, tree["/pub"], b"installed", 0o4755, session=True)
    assert (await s.close(r.inode.id, r.session_id, 5, wrote=True)).mode == 0o4755


async def test_sessions_that_wrote_nothing_keep_the_bits(tree: Tree) -> None:
    s = tree.store
    f = await _file(tree, 0o6777)
    _, sid = await s.open(BOB, f, O_RDWR)
    assert (await s.sync(f, sid)).mode == 0o6777
    assert (await s.close(f, sid)).mode == 0o6777
    _, sid = await s.open(BOB, f, 0)  # read-only: whatever it reports, it wrote nothing
    assert (await s.close(f, sid, 50, wrote=True)).mode == 0o6777


async def test_unprivileged_o_trunc_clears(tree: Tree) -> None:
    s = tree.store
    f = await _file(tree, 0o6777)
    ino, sid = await s.open(BOB, f, O_WRONLY | O_TRUNC)
    assert ino.mode == 0o777 == await _mode(tree, f)
    await s.close(f, sid)
    # open(O_CREAT | O_TRUNC) of an existing file is a truncate too
    g = await _file(tree, 0o4777, name=b"again")
    r = await s.create(BOB, tree["/pub"], b"again", 0o666, O_WRONLY | O_TRUNC, session=True)
    assert not r.created and r.inode.mode == 0o777 == await _mode(tree, g)
    # ... and root's keeps them
    h = await _file(tree, 0o6777)
    ino, _ = await s.open(ROOT, h, O_WRONLY | O_TRUNC)
    assert ino.mode == 0o6777 == await _mode(tree, h)


async def test_unprivileged_truncate_clears(tree: Tree) -> None:
    s = tree.store
    size = m.SetattrReq(fields=m.SETATTR_SIZE, size=7)
    f = await _file(tree, 0o6777)
    assert (await s.setattr(BOB, f, size)).mode == 0o777
    g = await _file(tree, 0o6767)  # setgid without group execute: stays for a member only
    assert (await s.setattr(BOB, g, size)).mode == 0o767
    g = await _file(tree, 0o6767)
    assert (await s.setattr(Credentials(BOB.uid, BOB.gid, frozenset({0})), g, size)).mode == 0o2767
    h = await _file(tree, 0o6777)
    assert (await s.setattr(ROOT, h, size)).mode == 0o6777
    # an explicit mode in the same request wins over the truncate's clearing
    both = m.SetattrReq(fields=m.SETATTR_SIZE | m.SETATTR_MODE, size=0, mode=0o4755)
    mine = await _file(tree, 0o4755, owner=ALICE)
    assert (await s.setattr(ALICE, mine, both)).mode == 0o4755


async def test_chown_clears_setuid_and_group_executable_setgid_even_by_root(tree: Tree) -> None:
    s = tree.store
    chown = m.SetattrReq(fields=m.SETATTR_UID | m.SETATTR_GID, uid=1001, gid=1001)
    f = await _file(tree, 0o4755)
    assert (await s.setattr(ROOT, f, chown)).mode == 0o755
    g = await _file(tree, 0o6755)
    assert (await s.setattr(ROOT, g, chown)).mode == 0o755
    lock = await _file(tree, 0o6745)  # setgid without group execute (mandatory locking) stays
    assert (await s.setattr(ROOT, lock, chown)).mode == 0o2745
    # a chown to the ids the file has already is a chown too
    same = await _file(tree, 0o4755)
    keep = m.SetattrReq(fields=m.SETATTR_UID | m.SETATTR_GID, uid=0, gid=0)
    assert (await s.setattr(ROOT, same, keep)).mode == 0o755
    # the owner's chgrp, by the same rule
    alice_in = Credentials(1000, 1000, frozenset({77}))
    mine = await _file(tree, 0o6755, owner=ALICE)
    r = await s.setattr(alice_in, mine, m.SetattrReq(fields=m.SETATTR_GID, gid=77))
    assert (r.gid, r.mode) == (77, 0o755)
    mine = await _file(tree, 0o6745, owner=ALICE)
    assert (await s.setattr(alice_in, mine, m.SetattrReq(fields=m.SETATTR_GID, gid=77))).mode == 0o2745
    # ... unless she is not in the group the file had (root's here): then it goes as well
    theirs = await _file(tree, 0o6745, owner=ALICE)
    await s.setattr(ROOT, theirs, m.SetattrReq(fields=m.SETATTR_GID, gid=0))
    await s.setattr(ROOT, theirs, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o6745))
    assert (await s.setattr(alice_in, theirs, m.SetattrReq(fields=m.SETATTR_GID, gid=77))).mode == 0o745


async def test_chown_of_a_directory_keeps_its_bits(tree: Tree) -> None:
    s = tree.store
    d = tree["/pub/alice_dir"]
    await s.setattr(ROOT, d, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o6755))
    r = await s.setattr(ROOT, d, m.SetattrReq(fields=m.SETATTR_UID | m.SETATTR_GID, uid=1001, gid=1001))
    assert (r.uid, r.gid, r.mode) == (1001, 1001, 0o6755)


async def test_a_stranger_cannot_clear_the_bits_with_a_no_op_chown(tree: Tree) -> None:
    s = tree.store
    f = await _file(tree, 0o6755, owner=ALICE)
    for req in (
        m.SetattrReq(fields=m.SETATTR_UID, uid=ALICE.uid),
        m.SetattrReq(fields=m.SETATTR_GID, gid=ALICE.gid),
    ):
        with pytest.raises(FS3Error) as e:
            await s.setattr(BOB, f, req)
        assert e.value.code == StatusCode.META_NOT_PERMITTED
    assert await _mode(tree, f) == 0o6755
