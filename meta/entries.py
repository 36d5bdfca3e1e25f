"""Operations that change existing entries: link, unlink, rmdir (plain and recursive), rename.

Dropping an inode's last link never frees storage here: a file with no links left keeps its inode
(nlink 0) and gets a GC entry, so open handles keep working; the collector (:mod:`fs3.meta.gc`)
removes its chunks and the inode once the last session has closed. A recursive rmdir detaches the
directory the same way and the collector walks the subtree.
"""

from __future__ import annotations

from fs3.errors import FS3Error, StatusCode, quote_name
from fs3.kv import Transaction, prefix_end
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.meta.namespace import DIRECTORY, FILE, Idem, Namespace
from fs3.meta.permissions import (
    R_OK,
    S_ISGID,
    S_ISUID,
    S_IXGRP,
    W_OK,
    X_OK,
    Credentials,
    allowed,
    check,
    check_name,
    check_sticky,
)
from fs3.proto import meta_pb2

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_EMPTY = meta_pb2.EmptyRsp()


def queue_gc(tr: Transaction, ino: meta_pb2.Inode) -> None:
    entry = meta_pb2.GcEntry(inode_id=ino.id, type=ino.type, queued_ns=inodes.now_ns())
    tr.set(schema.gc_key(ino.id), entry.SerializeToString())


def drop_link(tr: Transaction, ino: meta_pb2.Inode, now: int) -> None:
    """One fewer name refers to ``ino`` (not a directory)."""
    ino.nlink -= 1
    ino.ctime_ns = now
    if ino.nlink > 0:
        inodes.store(tr, ino)
    elif ino.type == FILE:
        inodes.store(tr, ino)
        queue_gc(tr, ino)
    else:
        tr.clear(schema.inode_key(ino.id))
        tr.add_int(schema.INODE_COUNT_KEY, -1)


def delete_dir(tr: Transaction, d: meta_pb2.Inode, parent: int) -> None:
    """Remove an empty directory's records, and its link from ``parent`` (0: already detached)."""
    tr.clear(schema.inode_key(d.id))
    tr.clear(schema.dir_times_key(d.id))
    tr.clear(schema.dir_links_key(d.id))
    tr.add_int(schema.INODE_COUNT_KEY, -1)
    if parent:
        tr.add_int(schema.dir_links_key(parent), -1)


async def is_empty(tr: Transaction, dir_id: int) -> bool:
    prefix = schema.dentry_prefix(dir_id)
    return not await tr.get_range(prefix, prefix_end(prefix), 1)


MAX_CHECKED_DIRS = 1024


async def check_subtree(tr: Transaction, top: meta_pb2.Inode, cred: Credentials) -> None:
    """What ``rm -r`` would need, checked up front for a non-root caller: read, write and search
    permission on every directory of the tree, and the sticky-bit rule for every entry in a sticky
    one. Trees of more than MAX_CHECKED_DIRS directories are refused (EPERM): remove them in parts."""
    todo = [top]
    seen = 0
    while todo:
        d = todo.pop()
        seen += 1
        if seen > MAX_CHECKED_DIRS:
            raise FS3Error(
                StatusCode.META_NOT_PERMITTED,
                f"more than {MAX_CHECKED_DIRS} directories to check: remove the tree in parts",
            )
        check(d, cred, R_OK | W_OK | X_OK)
        prefix = schema.dentry_prefix(d.id)
        for _, value in await tr.get_range(prefix, prefix_end(prefix)):
            e = meta_pb2.DirEntry.FromString(value)
            if e.type != DIRECTORY and not d.mode & 0o1000:
                continue
            child = await inodes.load(tr, e.inode_id)
            check_sticky(d, child, cred)
            if child.type == DIRECTORY:
                todo.append(child)


def check_hardlink_source(ino: meta_pb2.Inode, cred: Credentials) -> None:
    """Linux's may_linkat with fs.protected_hardlinks=1 (the default of every distribution): a
    caller other than the owner or root may link only a regular file that is neither setuid nor
    executable setgid and that it may read and write, else EPERM. Otherwise anyone could pin
    another's file under a name of their choosing: keep a vulnerable setuid program alive after
    its owner replaced it, or plant a name in a shared directory (/tmp) that a privileged program
    then writes through."""
    if cred.is_root or cred.uid == ino.uid:
        return
    setgid_exec = ino.mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP
    if ino.type != FILE or ino.mode & S_ISUID or setgid_exec or not allowed(ino, cred, R_OK | W_OK):
        raise FS3Error(
            StatusCode.META_NOT_PERMITTED,
            f"uid {cred.uid} may not hard-link inode {ino.id}: not its own, nor a plain file it may"
            " read and write",
        )


async def _entry(tr: Transaction, parent: int, name: bytes) -> tuple[bytes, meta_pb2.Inode]:
    key = schema.dentry_key(parent, name)
    raw = await tr.get(key)
    if raw is None:
        raise FS3Error(StatusCode.NOT_FOUND, f"no entry {quote_name(name)} in directory {parent}")
    return key, await inodes.load(tr, meta_pb2.DirEntry.FromString(raw).inode_id)


async def _parents(
    tr: Transaction, cred: Credentials, old_parent: int, new_parent: int
) -> tuple[meta_pb2.Inode, meta_pb2.Inode]:
    """A rename's two directories (one object when they are one), each searchable by ``cred``."""
    op = await inodes.load_dir(tr, old_parent)
    check(op, cred, X_OK)
    np = op if new_parent == old_parent else await inodes.load_dir(tr, new_parent)
    if np is not op:
        check(np, cred, X_OK)
    return op, np


async def _check_destination(tr: Transaction, dest: meta_pb2.Inode, moved: meta_pb2.Inode) -> None:
    """``moved`` goes into directory ``dest`` from another: none of ``dest``'s ancestors (itself
    included) may be ``moved`` (a cycle, EINVAL) or a directory a recursive rmdir removed (ENOENT:
    its subtree, which the collector is removing, still looks alive below it, and what moved in
    would be collected). The walk's reads conflict with any concurrent move or removal on the way."""
    cur = dest
    while True:
        if cur.id == moved.id:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "cannot move a directory into itself")
        if cur.nlink == 0:
            raise FS3Error(StatusCode.NOT_FOUND, f"directory {cur.id} has been removed")
        if cur.id == schema.ROOT_ID or not cur.parent:
            return
        cur = await inodes.load(tr, cur.parent)


class EntryOps(Namespace):
    async def link(
        self, cred: Credentials, inode_id: int, new_parent: int, new_name: bytes, idem: Idem = None
    ) -> meta_pb2.Inode:
        """A new name for an existing non-directory inode."""
        check_name(new_name)

        async def fn(tr: Transaction) -> meta_pb2.InodeRsp:
            ino = await inodes.load(tr, inode_id)
            p = await inodes.load_dir(tr, new_parent)
            check(p, cred, X_OK)
            key = schema.dentry_key(new_parent, new_name)
            if await tr.get(key) is not None:  # first, as in Linux (a directory's name too)
                raise FS3Error(
                    StatusCode.ALREADY_EXISTS, f"{quote_name(new_name)} exists in directory {new_parent}"
                )
            if ino.type == DIRECTORY:
                raise FS3Error(StatusCode.META_NOT_PERMITTED, "hard links to directories are not allowed")
            if ino.nlink == 0:
                raise FS3Error(StatusCode.NOT_FOUND, f"inode {inode_id} has been removed")
            if ino.nlink >= inodes.MAX_LINKS:
                raise FS3Error(StatusCode.META_TOO_MANY_LINKS, f"inode {inode_id} has {ino.nlink} links")
            check_hardlink_source(ino, cred)
            check(p, cred, W_OK | X_OK)
            now = inodes.now_ns()
            ino.nlink += 1
            ino.ctime_ns = now
            inodes.store(tr, ino)
            tr.set(key, meta_pb2.DirEntry(inode_id=ino.id, type=ino.type).SerializeToString())
            await inodes.touch_dir(tr, new_parent, now)
            return meta_pb2.InodeRsp(inode=inodes.public(ino))

        return (await self._mutate(idem, meta_pb2.InodeRsp, fn)).inode

    async def unlink(self, cred: Credentials, parent: int, name: bytes, idem: Idem = None) -> None:
        """Remove a non-directory entry."""
        check_name(name)

        async def fn(tr: Transaction) -> meta_pb2.EmptyRsp:
            p = await inodes.load_dir(tr, parent)
            check(p, cred, X_OK)
            key, ino = await _entry(tr, parent, name)
            if ino.type == DIRECTORY:
                raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(name)} is a directory")
            check(p, cred, W_OK | X_OK)
            check_sticky(p, ino, cred)
            now = inodes.now_ns()
            tr.clear(key)
            drop_link(tr, ino, now)
            await inodes.touch_dir(tr, parent, now)
            return _EMPTY

        await self._mutate(idem, meta_pb2.EmptyRsp, fn)

    async def rmdir(
        self, cred: Credentials, parent: int, name: bytes, recursive: bool = False, idem: Idem = None
    ) -> None:
        """Remove an empty directory; with ``recursive``, detach a whole tree for the collector
        (which needs read, write and search permission on the directory itself)."""
        check_name(name)

        async def fn(tr: Transaction) -> meta_pb2.EmptyRsp:
            p = await inodes.load_dir(tr, parent)
            check(p, cred, X_OK)
            key, d = await _entry(tr, parent, name)
            if d.type != DIRECTORY:
                raise FS3Error(StatusCode.META_NOT_DIRECTORY, f"{quote_name(name)} is not a directory")
            check(p, cred, W_OK | X_OK)
            check_sticky(p, d, cred)
            now = inodes.now_ns()
            tr.clear(key)
            if recursive:
                if not cred.is_root:
                    await check_subtree(tr, d, cred)
                d.nlink = 0
                inodes.store(tr, d)
                tr.add_int(schema.dir_links_key(parent), -1)
                queue_gc(tr, d)
            else:
                if not await is_empty(tr, d.id):
                    raise FS3Error(StatusCode.META_NOT_EMPTY, f"directory {quote_name(name)} is not empty")
                delete_dir(tr, d, parent)
            await inodes.touch_dir(tr, parent, now)
            return _EMPTY

        await self._mutate(idem, meta_pb2.EmptyRsp, fn)

    async def rename(
        self,
        cred: Credentials,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int = 0,
        idem: Idem = None,
        *,
        replaces: int = 0,
    ) -> None:
        """Atomically rename an entry, replacing a file or an empty directory at the destination;
        refuses (EINVAL) to move a directory into its own subtree. ``replaces``: the inode the
        caller takes the destination to be (0: not said; see RenameReq), else META_STALE."""
        check_name(old_name)
        check_name(new_name)
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown rename flags {flags:#x}")
        if flags & RENAME_EXCHANGE:
            if flags & RENAME_NOREPLACE:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, "RENAME_EXCHANGE with RENAME_NOREPLACE")
            await self._exchange(cred, old_parent, old_name, new_parent, new_name, idem)
            return

        async def fn(tr: Transaction) -> meta_pb2.EmptyRsp:
            op, np = await _parents(tr, cred, old_parent, new_parent)
            src_key, src = await _entry(tr, old_parent, old_name)
            dst_key = schema.dentry_key(new_parent, new_name)
            raw = await tr.get(dst_key)
            dst = None
            if replaces and (raw is None or meta_pb2.DirEntry.FromString(raw).inode_id != replaces):
                raise FS3Error(
                    StatusCode.META_STALE,
                    f"{quote_name(new_name)} is no longer inode {replaces}: changed by another client",
                )
            if raw is not None:
                dst_id = meta_pb2.DirEntry.FromString(raw).inode_id
                if flags & RENAME_NOREPLACE:  # checked first, as Linux does
                    raise FS3Error(StatusCode.ALREADY_EXISTS, f"{quote_name(new_name)} exists")
                if dst_id == src.id:
                    return _EMPTY  # two names of one inode: POSIX says do nothing
                dst = await inodes.load(tr, dst_id)
                if src.type == DIRECTORY and dst.type != DIRECTORY:
                    raise FS3Error(
                        StatusCode.META_NOT_DIRECTORY, f"{quote_name(new_name)} is not a directory"
                    )
                if src.type != DIRECTORY and dst.type == DIRECTORY:
                    raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(new_name)} is a directory")
            check(op, cred, W_OK | X_OK)
            if np is not op:
                check(np, cred, W_OK | X_OK)
            check_sticky(op, src, cred)
            if dst is not None:
                check_sticky(np, dst, cred)
            moved_dir = src.type == DIRECTORY and new_parent != old_parent
            if moved_dir:
                check(src, cred, W_OK)  # ".." changes: the directory itself must be writable
            if new_parent != old_parent:
                # The new parent's ancestors: none may be the moved directory (a cycle), and none
                # may be a directory a recursive rmdir removed (its subtree, which the collector
                # is removing, still looks alive below it: what moved in would be collected). The
                # walk's reads conflict with any concurrent move or removal on the way.
                await _check_destination(tr, np, src)
            if dst is not None and dst.type == DIRECTORY and not await is_empty(tr, dst.id):
                raise FS3Error(StatusCode.META_NOT_EMPTY, f"directory {quote_name(new_name)} is not empty")
            now = inodes.now_ns()
            if dst is not None:
                if dst.type == DIRECTORY:
                    delete_dir(tr, dst, new_parent)
                else:
                    drop_link(tr, dst, now)
            tr.clear(src_key)
            tr.set(dst_key, meta_pb2.DirEntry(inode_id=src.id, type=src.type).SerializeToString())
            if src.type == DIRECTORY and moved_dir:
                src.parent = new_parent
                tr.add_int(schema.dir_links_key(old_parent), -1)
                tr.add_int(schema.dir_links_key(new_parent), 1)
            # a directory's new ctime goes to its inode, not its times key (see inodes.complete):
            # rewriting that key with the mtime read here could take back a create's newer one
            src.ctime_ns = now
            inodes.store(tr, src)
            await inodes.touch_dir(tr, old_parent, now)
            if new_parent != old_parent:
                await inodes.touch_dir(tr, new_parent, now)
            return _EMPTY

        await self._mutate(idem, meta_pb2.EmptyRsp, fn)

    async def _exchange(
        self,
        cred: Credentials,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        idem: Idem,
    ) -> None:
        """renameat2's RENAME_EXCHANGE: swap two existing entries atomically, of any types (a
        file and a directory too). As Linux: ENOENT unless both exist, nothing to do for two
        names of one inode, EINVAL when either would move into its own subtree, the sticky rule
        for both, and write permission on a directory that moves to another parent ("..")."""

        async def fn(tr: Transaction) -> meta_pb2.EmptyRsp:
            op, np = await _parents(tr, cred, old_parent, new_parent)
            a_key, a = await _entry(tr, old_parent, old_name)
            b_key, b = await _entry(tr, new_parent, new_name)
            if a.id == b.id:
                return _EMPTY  # two names of one inode (or one name): Linux does nothing
            check(op, cred, W_OK | X_OK)
            if np is not op:
                check(np, cred, W_OK | X_OK)
            check_sticky(op, a, cred)
            check_sticky(np, b, cred)
            moved = new_parent != old_parent
            if moved:
                for d in (a, b):
                    if d.type == DIRECTORY:
                        check(d, cred, W_OK)  # its ".." changes
                await _check_destination(tr, np, a)
                await _check_destination(tr, op, b)
            now = inodes.now_ns()
            tr.set(a_key, meta_pb2.DirEntry(inode_id=b.id, type=b.type).SerializeToString())
            tr.set(b_key, meta_pb2.DirEntry(inode_id=a.id, type=a.type).SerializeToString())
            if moved:
                subdirs = (a.type == DIRECTORY) - (b.type == DIRECTORY)  # net move old -> new
                if subdirs:
                    tr.add_int(schema.dir_links_key(old_parent), -subdirs)
                    tr.add_int(schema.dir_links_key(new_parent), subdirs)
                if a.type == DIRECTORY:
                    a.parent = new_parent
                if b.type == DIRECTORY:
                    b.parent = old_parent
            for ino in (a, b):
                ino.ctime_ns = now  # a directory's to its inode, as in rename
                inodes.store(tr, ino)
            await inodes.touch_dir(tr, old_parent, now)
            if moved:
                await inodes.touch_dir(tr, new_parent, now)
            return _EMPTY

        await self._mutate(idem, meta_pb2.EmptyRsp, fn)
