"""Reading and writing inodes inside a transaction, and building new ones.

A directory's mtime/ctime and its subdirectory count are kept in keys of their own (see
:mod:`fs3.meta.schema`) so that entries can be added to one directory concurrently without every
transaction rewriting (and conflicting on) the directory's inode; :func:`load_full` folds them back
in for replies.
"""

from __future__ import annotations

import time

from fs3.errors import FS3Error, StatusCode
from fs3.kv import ReadView, Transaction
from fs3.meta import schema
from fs3.proto import meta_pb2

DIRECTORY = meta_pb2.INODE_DIRECTORY
FILE = meta_pb2.INODE_FILE
SYMLINK = meta_pb2.INODE_SYMLINK

S_IFMT = 0o170000
_TYPE_BITS = {
    0o100000: meta_pb2.INODE_FILE,
    0o040000: meta_pb2.INODE_DIRECTORY,
    0o120000: meta_pb2.INODE_SYMLINK,
    0o010000: meta_pb2.INODE_FIFO,
    0o140000: meta_pb2.INODE_SOCKET,
    0o020000: meta_pb2.INODE_CHAR_DEVICE,
    0o060000: meta_pb2.INODE_BLOCK_DEVICE,
}
TYPE_MODE_BITS = {v: k for k, v in _TYPE_BITS.items()}

MAX_LINKS = 65000
_Inode = meta_pb2.Inode
_parse_inode = _Inode.FromString


def now_ns() -> int:
    return time.time_ns()


def type_of_mode(mode: int) -> int:
    """The inode type a ``st_mode``'s file-type bits denote (0 when none or unknown)."""
    return _TYPE_BITS.get(mode & S_IFMT, 0)


def st_mode(inode: meta_pb2.Inode) -> int:
    """``st_mode`` as stat(2) reports it: type bits and permission bits."""
    return TYPE_MODE_BITS.get(inode.type, 0) | inode.mode


async def load(rv: ReadView, inode_id: int) -> meta_pb2.Inode:
    """The stored inode (NOT_FOUND when there is none)."""
    raw = await rv.get(schema.inode_key(inode_id))
    if raw is None:
        raise FS3Error(StatusCode.NOT_FOUND, f"no inode {inode_id}")
    return _parse_inode(raw)


async def load_into(rv: ReadView, inode_id: int, target: meta_pb2.Inode) -> meta_pb2.Inode:
    """:func:`load`, parsing into ``target`` (which must be empty) rather than a new message."""
    raw = await rv.get(schema.inode_key(inode_id))
    if raw is None:
        raise FS3Error(StatusCode.NOT_FOUND, f"no inode {inode_id}")
    target.MergeFromString(raw)
    return target


async def load_dir(rv: ReadView, inode_id: int) -> meta_pb2.Inode:
    """A live directory (NOT_FOUND when gone or being removed, META_NOT_DIRECTORY when another type)."""
    ino = await load(rv, inode_id)
    if ino.type != DIRECTORY:
        raise FS3Error(StatusCode.META_NOT_DIRECTORY, f"inode {inode_id} is not a directory")
    if ino.nlink == 0:
        raise FS3Error(StatusCode.NOT_FOUND, f"directory {inode_id} has been removed")
    return ino


async def complete(rv: ReadView, ino: meta_pb2.Inode) -> meta_pb2.Inode:
    """Fold a directory's separately kept times and link count into ``ino`` (in place)."""
    if ino.type == DIRECTORY:
        raw = await rv.get(schema.dir_times_key(ino.id))
        if raw is not None:
            # a rename or an xattr change stamps the inode's own ctime, leaving the times key,
            # which only entry changes (touch_dir) and explicit times (setattr) write
            mtime, ctime = schema.decode_times(raw)
            ino.mtime_ns, ino.ctime_ns = mtime, max(ctime, ino.ctime_ns)
        if ino.nlink:
            ino.nlink = 2 + schema.decode_count(await rv.get(schema.dir_links_key(ino.id)))
    return ino


async def load_full(rv: ReadView, inode_id: int) -> meta_pb2.Inode:
    """The inode as stat reports it (see :func:`complete`)."""
    return await complete(rv, await load(rv, inode_id))


def public(ino: meta_pb2.Inode) -> meta_pb2.Inode:
    """``ino`` without the fields replies do not carry (extended attributes, an owed trim, how
    long write capabilities of it last, the collector's claim, a truncate under way, when its
    mtime was set)."""
    if ino.xattrs:
        del ino.xattrs[:]
    ino.trim_version = ino.trim_length = 0
    ino.write_caps_until_ns = 0
    ino.collecting = False
    ino.truncating_length = ino.truncating_until_ns = 0
    ino.times_set_ns = 0
    return ino


def store(tr: Transaction, ino: meta_pb2.Inode) -> None:
    tr.set(schema.inode_key(ino.id), ino.SerializeToString())


#: A directory time stamp further ahead of a meta server's clock than this is taken for a bad one
#: (a clock that jumped ahead, a time set through the raw RPC) and replaced, not kept by the max.
DIR_TIME_AHEAD_NS = 60 * 10**9


async def touch_dir(tr: Transaction, dir_id: int, now: int) -> None:
    """Set a directory's mtime and ctime to ``now`` after a change of its entries: an atomic max,
    which reads nothing that conflicts (creates in one directory do not conflict) and leaves the
    later stamp when two changes commit in the other order than their clocks were read (a set let
    the directory's mtime go back). Packed ``(mtime, ctime)`` little-endian, the max compares
    ctime first, which every writer of the key sets to its now. A stored ctime the max would keep
    for good (negative, which it reads as huge, or more than DIR_TIME_AHEAD_NS ahead) is replaced."""
    key = schema.dir_times_key(dir_id)
    raw = await tr.snapshot.get(key)
    if raw is not None and not 0 <= schema.decode_times(raw)[1] <= now + DIR_TIME_AHEAD_NS:
        tr.set(key, schema.encode_times(now, now))
    else:
        tr.atomic_max(key, schema.encode_times(now, now))


def new_inode(
    inode_id: int,
    itype: int,
    mode: int,
    uid: int,
    gid: int,
    now: int,
    into: meta_pb2.Inode | None = None,
    **fields: object,
) -> meta_pb2.Inode:
    """A new inode; made in ``into`` (an empty Inode) when given."""
    nlink = 1 if itype != DIRECTORY else 2
    if into is None:
        return _Inode(
            id=inode_id,
            type=itype,
            mode=mode,
            uid=uid,
            gid=gid,
            nlink=nlink,
            atime_ns=now,
            mtime_ns=now,
            ctime_ns=now,
            **fields,
        )
    into.id, into.type, into.mode, into.uid, into.gid, into.nlink = inode_id, itype, mode, uid, gid, nlink
    into.atime_ns = into.mtime_ns = into.ctime_ns = now
    for name, value in fields.items():
        setattr(into, name, value)
    return into
