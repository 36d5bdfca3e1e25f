"""Inode handles: what a non-root user connection must show to name an inode by its id.

Meta checks search permission along a path only where a request names a path or a (directory,
name) pair; a request that names an inode by id (stat, open, getxattr, a lookup or create in a
directory given by id...) skips the directories above it, as an NFS file handle does. Cluster
members (mounts on trusted hosts, whose kernels walk the path themselves) and root tokens may do
so; ids are dense, so a user connection could otherwise reach a file inside another user's 0700
directory by guessing its id.

So every inode meta returns to a non-root user connection carries a *handle*: the first 16 bytes
of keyed BLAKE2b, under a key derived from the cluster secret, over (uid, inode id). Meta returns
an inode only after the checks that reaching it by name takes (a lookup, a path, a create in a
directory the caller may search, a listing of one it may search, a stat by a handle it already
has), so a handle shows that this uid reached the inode lawfully once. Every request of such a
connection must carry, in its header's ``handles``, the handle of each inode it names by id (the
root directory needs none); meta refuses it with PERMISSION_DENIED (EACCES) otherwise. Handles do
not expire: like an NFS handle, one keeps working after a directory above the inode is closed to
its user (the inode's own mode still applies). They are per uid, and do not depend on the meta
server (any meta of the cluster accepts another's).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable
from typing import Any

from fs3.client.meta_client import INODE_ID_FIELDS, MAX_BATCH_STAT, RETURNED_INODES, ROOT_ID
from fs3.errors import FS3Error, StatusCode
from fs3.proto import meta_pb2 as m

HANDLE_BYTES = 16
_LABEL = b"fs3-inode-handle-v1\x00"
_KEY = struct.Struct("<IQ")


class HandleSealer:
    """Meta's side: seals handles, checks those a request brings, and seals the inodes of a reply."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, _LABEL, hashlib.sha256).digest()

    def seal(self, uid: int, inode_id: int) -> bytes:
        return hashlib.blake2b(_KEY.pack(uid, inode_id), key=self._key, digest_size=HANDLE_BYTES).digest()

    def check(self, uid: int, method: str, req: Any) -> None:
        """Raise PERMISSION_DENIED unless ``req``, a request of ``method``, carries ``uid``'s handle
        for every inode it names by id (INVALID_ARGUMENT for more than a BatchStat may name)."""
        handles = req.hdr.handles
        for name in INODE_ID_FIELDS[method]:
            value = getattr(req, name)
            if isinstance(value, int):
                ids: Iterable[int] = (value,)
            elif len(value) > MAX_BATCH_STAT:  # before a hash per id
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"at most {MAX_BATCH_STAT} inodes per request")
            else:
                ids = set(value)
            for inode_id in ids:
                if inode_id == ROOT_ID or not inode_id:
                    continue  # the root is everyone's; 0 names nothing (the handler refuses it)
                handle = handles.get(inode_id)
                if handle is None or not hmac.compare_digest(handle, self.seal(uid, inode_id)):
                    raise FS3Error(
                        StatusCode.PERMISSION_DENIED,
                        f"inode {inode_id}: no handle of this user for it (a user connection names an"
                        " inode by id only after meta returned it to that user: look it up by name)",
                    )

    def seal_inodes(self, uid: int, inodes: Iterable[m.Inode]) -> None:
        for ino in inodes:
            if ino.id:  # a batch stat's failed entries are empty
                ino.handle = self.seal(uid, ino.id)

    def seal_reply(self, uid: int, method: str, req: Any, rsp: Any) -> None:
        """Put ``uid``'s handle into every inode of ``rsp``, the reply to ``req`` of ``method``;
        except a listing's (Readdir seals those it may, see MetaService.Readdir) and the parent
        a lookup of ".." found: that the caller may search a directory does not mean it could
        reach the directory's parent by name (it may have been moved under a private one since
        the caller got the directory's handle)."""
        if method == "Readdir" or (method == "Lookup" and req.name == b".."):
            return
        for name in RETURNED_INODES[method]:
            value = getattr(rsp, name)
            if isinstance(value, m.Inode):
                if rsp.HasField(name):
                    self.seal_inodes(uid, (value,))
            else:
                self.seal_inodes(uid, value)


__all__ = ["HANDLE_BYTES", "HandleSealer"]
