"""A small namespace with known owners and modes, shared by the meta tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from fs3.meta.permissions import ROOT, Credentials
from fs3.meta.schema import ROOT_ID
from fs3.meta.store import MetaStore

ALICE = Credentials(1000, 1000)
BOB = Credentials(1001, 1001)
BOB_IN_500 = Credentials(1001, 1001, frozenset({500}))


@dataclass
class Tree:
    store: MetaStore
    ids: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, path: str) -> int:
        return self.ids[path]


async def build_tree(s: MetaStore) -> Tree:
    """::

    /pub        0777 root       /pub/alice_dir 0755 alice   /pub/alice_file 0644 alice
    /sticky     1777 root       /sticky/alice_f 0644 alice
    /ro         0555 root       /ro/f 0666 root
    /noexec     0666 root       (no search permission for others)
    /grp        0770 root:500   /grp/f 0660 root:500
    /full       0755 root       /full/f
    /sym -> /pub/alice_file     /loop1 -> /loop2 -> /loop1
    """
    t = Tree(s)

    async def mkdir(path: str, mode: int, cred: Credentials = ROOT) -> int:
        parent, name = path.rsplit("/", 1)
        ino = await s.mkdir(cred, t.ids.get(parent, ROOT_ID), name.encode(), mode)
        t.ids[path] = ino.id
        return ino.id

    async def create(path: str, mode: int, cred: Credentials = ROOT) -> int:
        parent, name = path.rsplit("/", 1)
        ino = (await s.create(cred, t.ids.get(parent, ROOT_ID), name.encode(), mode)).inode
        t.ids[path] = ino.id
        return ino.id

    await mkdir("/pub", 0o777)
    await mkdir("/pub/alice_dir", 0o755, ALICE)
    await create("/pub/alice_file", 0o644, ALICE)
    await mkdir("/sticky", 0o1777)
    await create("/sticky/alice_f", 0o644, ALICE)
    await mkdir("/ro", 0o755)
    await create("/ro/f", 0o666)
    await s.setattr(ROOT, t["/ro"], _chmod(0o555))
    await mkdir("/noexec", 0o666)
    await mkdir("/grp", 0o770)
    await create("/grp/f", 0o660)
    await s.setattr(ROOT, t["/grp"], _chgrp(500))
    await s.setattr(ROOT, t["/grp/f"], _chgrp(500))
    await mkdir("/full", 0o755)
    await create("/full/f", 0o644)
    t.ids["/sym"] = (await s.symlink(ROOT, ROOT_ID, b"sym", b"/pub/alice_file")).id
    t.ids["/loop1"] = (await s.symlink(ROOT, ROOT_ID, b"loop1", b"/loop2")).id
    t.ids["/loop2"] = (await s.symlink(ROOT, ROOT_ID, b"loop2", b"/loop1")).id
    return t


def _chmod(mode: int):
    from fs3.proto import meta_pb2

    return meta_pb2.SetattrReq(fields=meta_pb2.SETATTR_MODE, mode=mode)


def _chgrp(gid: int):
    from fs3.proto import meta_pb2

    return meta_pb2.SetattrReq(fields=meta_pb2.SETATTR_GID, gid=gid)
