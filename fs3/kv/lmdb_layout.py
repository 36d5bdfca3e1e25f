"""How the ``lmdb`` engine lays out fs3.kv keys in LMDB, and views that read and write them.

Stock LMDB keys are at most 511 bytes, FoundationDB's 10,000. A key of :data:`BUCKET_KEY_LEN` bytes
or more is stored in a *bucket*: the LMDB record whose key is its first :data:`BUCKET_KEY_LEN` bytes
and whose value lists the (suffix, value) pairs of every long key with that prefix. Short keys are
stored as themselves. Since bucket keys all have exactly :data:`BUCKET_KEY_LEN` bytes and short keys
fewer, the two never collide, and LMDB order followed by suffix order within a bucket is exactly the
byte order of the logical keys. Namespace keys are far shorter, so buckets are rare; a workload with
many long keys sharing a 448-byte prefix would rewrite one large record per update.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator

import lmdb

# Part of the on-disk format: every process opening an environment must agree on it.
BUCKET_KEY_LEN = 448

_LEN = struct.Struct("<I")


def _decode_bucket(raw: bytes) -> list[tuple[bytes, bytes]]:
    entries = []
    pos, n = 0, len(raw)
    view = memoryview(raw)
    while pos < n:
        (klen,) = _LEN.unpack_from(raw, pos)
        pos += 4
        suffix = bytes(view[pos : pos + klen])
        pos += klen
        (vlen,) = _LEN.unpack_from(raw, pos)
        pos += 4
        entries.append((suffix, bytes(view[pos : pos + vlen])))
        pos += vlen
    return entries


def _encode_bucket(entries: list[tuple[bytes, bytes]]) -> bytes:
    parts = []
    for suffix, value in entries:
        parts += (_LEN.pack(len(suffix)), suffix, _LEN.pack(len(value)), value)
    return b"".join(parts)


class View:
    """Logical-key reads over one LMDB transaction (read-only or write)."""

    __slots__ = ("txn", "_get")

    def __init__(self, txn: lmdb.Transaction) -> None:
        self.txn = txn
        self._get = txn.get

    def get(self, key: bytes) -> bytes | None:
        if len(key) < BUCKET_KEY_LEN:
            return self._get(key)
        raw = self._get(key[:BUCKET_KEY_LEN])
        if raw is None:
            return None
        suffix = key[BUCKET_KEY_LEN:]
        for s, v in _decode_bucket(raw):
            if s == suffix:
                return v
        return None

    def iter_range(self, begin: bytes, end: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        # An LMDB key k holds logical keys >= k (itself, or a bucket's members), and only k itself
        # when short; see the module docstring for why these bounds are exact.
        cur = self.txn.cursor()
        if not reverse:
            if not cur.set_range(begin[:BUCKET_KEY_LEN]):
                return
            for k, v in cur:
                if k >= end:
                    return
                if len(k) != BUCKET_KEY_LEN:
                    yield k, v
                    continue
                for suffix, value in _decode_bucket(v):
                    key = k + suffix
                    if key >= end:
                        return
                    if key >= begin:
                        yield key, value
        else:
            if cur.set_range(end):
                if not cur.prev():
                    return
            elif not cur.last():
                return
            for k, v in cur.iterprev():
                if len(k) != BUCKET_KEY_LEN:
                    if k < begin:
                        return
                    yield k, v
                    continue
                for suffix, value in reversed(_decode_bucket(v)):
                    key = k + suffix
                    if key < begin:
                        return
                    if key < end:
                        yield key, value


class Snapshot(View):
    """A transaction's frozen view: an LMDB read transaction, aborted on release."""

    __slots__ = ()

    def release(self) -> None:
        self.txn.abort()

    def version(self) -> int:
        """The id of the last transaction committed before this snapshot was taken."""
        return self.txn.id()


class WriteView(View):
    """The committer's view: reads see earlier writes of the same batch."""

    __slots__ = ()

    def put(self, key: bytes, value: bytes) -> None:
        if len(key) < BUCKET_KEY_LEN:
            self.txn.put(key, value)
            return
        self._update_bucket(key, value)

    def delete(self, key: bytes) -> None:
        if len(key) < BUCKET_KEY_LEN:
            self.txn.delete(key)
            return
        self._update_bucket(key, None)

    def _update_bucket(self, key: bytes, value: bytes | None) -> None:
        bkey, suffix = key[:BUCKET_KEY_LEN], key[BUCKET_KEY_LEN:]
        raw = self._get(bkey)
        entries = _decode_bucket(raw) if raw is not None else []
        i = bisect.bisect_left(entries, (suffix,))
        present = i < len(entries) and entries[i][0] == suffix
        if value is None:
            if not present:
                return
            del entries[i]
        elif present:
            entries[i] = (suffix, value)
        else:
            entries.insert(i, (suffix, value))
        if entries:
            self.txn.put(bkey, _encode_bucket(entries))
        else:
            self.txn.delete(bkey)

    def delete_range(self, begin: bytes, end: bytes) -> None:
        cur = self.txn.cursor()
        if not cur.set_range(begin[:BUCKET_KEY_LEN]):
            return
        while True:
            k = cur.key()
            if not k or k >= end:
                return
            if len(k) != BUCKET_KEY_LEN:
                if not cur.delete():  # moves to the next record
                    return
                continue
            entries = _decode_bucket(cur.value())
            kept = [(s, v) for s, v in entries if not begin <= k + s < end]
            if not kept:
                if not cur.delete():
                    return
                continue
            if len(kept) != len(entries):
                cur.put(k, _encode_bucket(kept))
            if not cur.next():
                return
