"""fs3-meta's records in the KV store (DESIGN §4): key layout and value encoding.

Values are serialized protobuf messages from ``proto/meta.proto``. Integers in keys are big-endian,
so a prefix scan returns a directory's entries in name order and a file's sessions together.

==================================================  ===========================================
key                                                 value
==================================================  ===========================================
``INOD`` + inode id (u64)                           Inode (with xattrs)
``INOD`` + dir id (u64) + ``T``                     directory mtime/ctime (2 × i64): written
                                                    blindly, so creates in one directory do not
                                                    conflict on the directory's inode
``INOD`` + dir id (u64) + ``L``                     subdirectory count (u64 little-endian, kept
                                                    by atomic add for the same reason)
``DENT`` + parent id (u64) + name                   DirEntry (inode id, type)
``INOS`` + inode id (u64) + session id (u64)        FileSession
``GCQU`` + inode id (u64)                           GcEntry: chunks / subtree awaiting removal
``TRNC`` + inode id (u64)                           empty: the inode records a truncate that is
                                                    trimming storage (Inode.truncating_until_ns)
``IDEM`` + request id (u64) + client id (u64)       IdemRecord: a non-idempotent op's result
``SING`` + ``meta-inode-alloc-`` + shard (u8)       u64 counter of the id allocator shard
``SING`` + ``meta-inode-count``                     u64 little-endian inode count (atomic add)
==================================================  ===========================================

mgmtd's prefixes (NODE, TGIF, CHIF, CHIT, CONF, USER and its own SING keys, all ``mgmtd-…``) share the
keyspace; nothing here collides with them.
"""

from __future__ import annotations

import struct

from fs3.proto import meta_pb2

INOD = b"INOD"
DENT = b"DENT"
INOS = b"INOS"
GCQU = b"GCQU"
TRNC = b"TRNC"
IDEM = b"IDEM"
SING = b"SING"

ROOT_ID = 1
"""The root directory's inode id; allocated ids are far above it (see :mod:`fs3.meta.idalloc`)."""

INODE_COUNT_KEY = SING + b"meta-inode-count"
# the id this store's file system was given when it was made (ASCII), told to mgmtd before a meta
# serves it (Namespace.file_system_id, fs3.mgmtd.cluster.Cluster.claim_file_system)
FILE_SYSTEM_ID_KEY = SING + b"meta-file-system-id"

_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
_TIMES = struct.Struct("<qq")

FILE = meta_pb2.INODE_FILE
DIRECTORY = meta_pb2.INODE_DIRECTORY
SYMLINK = meta_pb2.INODE_SYMLINK


def inode_key(inode_id: int) -> bytes:
    return INOD + _U64.pack(inode_id)


def dir_times_key(inode_id: int) -> bytes:
    return INOD + _U64.pack(inode_id) + b"T"


def dir_links_key(inode_id: int) -> bytes:
    return INOD + _U64.pack(inode_id) + b"L"


def dentry_prefix(parent: int) -> bytes:
    return DENT + _U64.pack(parent)


def dentry_key(parent: int, name: bytes) -> bytes:
    return DENT + _U64.pack(parent) + name


def session_prefix(inode_id: int) -> bytes:
    return INOS + _U64.pack(inode_id)


def session_key(inode_id: int, session_id: int) -> bytes:
    return INOS + _U64x2.pack(inode_id, session_id)


def gc_key(inode_id: int) -> bytes:
    return GCQU + _U64.pack(inode_id)


def truncating_key(inode_id: int) -> bytes:
    return TRNC + _U64.pack(inode_id)


def idem_key(client_id: int, request_id: int) -> bytes:
    # Request id first: clients draw them from their clocks (see fs3.client.meta_client), so the
    # records of concurrent requests from every client land in the same few B-tree pages, and a
    # batch of commits rewrites those pages once instead of one scattered page per request.
    return IDEM + _U64x2.pack(request_id, client_id)


def alloc_shard_key(shard: int) -> bytes:
    return SING + b"meta-inode-alloc-" + bytes([shard])


def encode_u64(v: int) -> bytes:
    return _U64.pack(v)


def decode_u64(raw: bytes | None) -> int:
    return 0 if raw is None else _U64.unpack(raw)[0]


def encode_times(mtime_ns: int, ctime_ns: int) -> bytes:
    return _TIMES.pack(mtime_ns, ctime_ns)


def decode_times(raw: bytes) -> tuple[int, int]:
    return _TIMES.unpack(raw)  # type: ignore[return-value]


def decode_count(raw: bytes | None) -> int:
    """An atomic-add counter (little-endian, as FoundationDB's ADD keeps it); negative deltas wrap."""
    if raw is None:
        return 0
    v = int.from_bytes(raw[:8], "little")
    return v - (1 << 64) if v >= 1 << 63 else v


def name_of_dentry_key(key: bytes) -> bytes:
    return key[12:]


def id_of_session_key(key: bytes) -> int:
    return _U64.unpack_from(key, 12)[0]


def id_of_gc_key(key: bytes) -> int:
    return _U64.unpack_from(key, 4)[0]


def id_of_truncating_key(key: bytes) -> int:
    return _U64.unpack_from(key, 4)[0]
