"""setattr (chmod, chown, utimensat with UTIME_NOW/UTIME_OMIT, truncate), user xattrs, directory
default layouts and statfs.

Rules are Linux's: only the owner or root changes mode or explicit times; only root changes the
owner; the owner may change the group to one of its own groups; setting both times to "now" is also
allowed to anyone with write permission; a chown of anything but a directory clears setuid, and
setgid when group-executable, even by root; a truncate by anyone but root clears them likewise; a
non-root chmod by someone outside the file's group clears setgid; any change sets ctime.
"""

from __future__ import annotations

from collections.abc import Sequence

from fs3.errors import FS3Error, StatusCode, quote_name
from fs3.kv import Transaction
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.meta.layout import check_layout_params
from fs3.meta.namespace import DIRECTORY, FILE, SYMLINK, Idem, Namespace, Trims
from fs3.meta.permissions import (
    R_OK,
    S_ISGID,
    S_ISVTX,
    W_OK,
    Credentials,
    check,
    check_owner,
    kill_suid_sgid,
)
from fs3.proto import meta_pb2

F = meta_pb2
XATTR_CREATE = 1
XATTR_REPLACE = 2
XATTR_NAME_MAX = 255
XATTR_SIZE_MAX = 65536
# All of an inode's attributes together, as stored (names, values and their encoding: ~4 bytes
# each), so that the inode stays one value well within the store's limit (100,000 bytes, as
# FoundationDB's) whatever else it grows by (a chown, a length, a layout).
XATTR_TOTAL_MAX = 65536
_USER = b"user."


def _check_xattr_name(name: bytes) -> None:
    if not name or b"\0" in name:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "invalid xattr name")
    if len(name) > XATTR_NAME_MAX:
        raise FS3Error(StatusCode.META_XATTR_RANGE, f"xattr name of {len(name)} bytes is too long")
    if name == _USER:  # a namespace with no name in it: EINVAL on Linux's own file systems
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"xattr name {quote_name(name)} names no attribute")
    if not name.startswith(_USER):
        raise FS3Error(
            StatusCode.META_NOT_SUPPORTED, f"only user.* xattrs are supported, not {quote_name(name)}"
        )


def _stored_size(xattrs: Sequence[meta_pb2.Xattr]) -> int:
    """The bytes ``xattrs`` take in their inode's encoding: a tag (field 16: two bytes), a length
    and the entry each."""
    return sum(2 + _varint_size(n) + n for n in (x.ByteSize() for x in xattrs))


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


class AttrOps(Namespace):
    async def setattr(
        self, cred: Credentials, inode_id: int, request: meta_pb2.SetattrReq, idem: Idem = None
    ) -> meta_pb2.Inode:
        """Apply the fields of ``request`` named in ``request.fields`` (see SetattrField). With a
        request id, once: a retry (or a first attempt applied after its retry) returns the first
        result."""
        fields = request.fields
        trims = Trims()

        async def fn(tr: Transaction) -> meta_pb2.Inode:
            ino = await inodes.complete(tr, await inodes.load(tr, inode_id))
            now = inodes.now_ns()
            # As Linux's chown_ok/chgrp_ok: even a chown to the current ids is the owner's (it
            # clears setuid/setgid, and a stranger must not).
            if fields & F.SETATTR_UID and not cred.is_root and not cred.uid == ino.uid == request.uid:
                raise FS3Error(StatusCode.META_NOT_PERMITTED, "only root may change the owner")
            if fields & F.SETATTR_GID:
                check_owner(ino, cred, "change the group")
                if request.gid != ino.gid and not cred.is_root and not cred.in_group(request.gid):
                    raise FS3Error(
                        StatusCode.META_NOT_PERMITTED, f"uid {cred.uid} is not in group {request.gid}"
                    )
            if fields & (F.SETATTR_UID | F.SETATTR_GID):
                in_group = cred.is_root or cred.in_group(ino.gid)  # the group it had
                if fields & F.SETATTR_UID:
                    ino.uid = request.uid
                if fields & F.SETATTR_GID:
                    ino.gid = request.gid
                # Linux's chown_common: root included, whether or not the ids change
                if ino.type != DIRECTORY:
                    ino.mode = kill_suid_sgid(ino.mode, in_group)
            # Size before mode and times: a truncate sets mtime to now and may clear setuid/setgid;
            # an explicit mode or time in the same request wins.
            if fields & F.SETATTR_SIZE:
                if ino.type == DIRECTORY:
                    raise FS3Error(StatusCode.META_IS_DIRECTORY, f"inode {inode_id} is a directory")
                if ino.type != FILE:
                    raise FS3Error(StatusCode.INVALID_ARGUMENT, f"inode {inode_id} is not a regular file")
                if not await self._has_write_session(tr, inode_id, request.session_id):
                    check(ino, cred, W_OK)
                # Chunks past the new end may exist whatever the settled size says (writes not yet
                # reported, by this caller or another client), so every truncate trims them, an
                # extension of the settled size included (first: see _truncate_in_txn).
                # at the request's one time: its ctime is set to ``now`` below (a truncate that read
                # the clock again left the ctime before the mtime)
                self._truncate_in_txn(tr, cred, ino, request.size, trims, now)
            if fields & F.SETATTR_MODE:
                if ino.type == SYMLINK:  # Linux: fchmodat(AT_SYMLINK_NOFOLLOW) is EOPNOTSUPP
                    raise FS3Error(StatusCode.META_NOT_SUPPORTED, f"inode {inode_id} is a symlink: no mode")
                check_owner(ino, cred, "change the mode")
                mode = request.mode & 0o7777
                # Linux's setattr_prepare, directories included: a directory's setgid bit hands
                # its group to everything made in it, a group the caller was never given.
                if not cred.is_root and not cred.in_group(ino.gid):
                    mode &= ~S_ISGID
                ino.mode = mode
            explicit = fields & (F.SETATTR_ATIME | F.SETATTR_MTIME | F.SETATTR_CTIME)
            both_now = F.SETATTR_ATIME_NOW | F.SETATTR_MTIME_NOW
            to_now = fields & both_now
            # As Linux's vfs_utimes: only both times to now (utimes(NULL), touch) is a "touch" a
            # writer may do; one to now and the other omitted sets a time selectively, which is
            # the owner's, like an explicit time.
            if explicit or to_now not in (0, both_now):
                check_owner(ino, cred, "set times other than both to now")
            elif to_now and cred.uid not in (0, ino.uid):
                check(ino, cred, W_OK)
            if fields & F.SETATTR_ATIME_NOW:
                ino.atime_ns = now
            elif fields & F.SETATTR_ATIME:
                ino.atime_ns = request.atime_ns
            if fields & F.SETATTR_MTIME_NOW:
                ino.mtime_ns = now
            elif fields & F.SETATTR_MTIME:
                ino.mtime_ns = request.mtime_ns
            if fields & (F.SETATTR_MTIME_NOW | F.SETATTR_MTIME):
                ino.times_set_ns = now  # writes reported later that were made before keep it
            ino.ctime_ns = request.ctime_ns if fields & F.SETATTR_CTIME else now
            self._store_attrs(tr, ino)
            return inodes.public(ino)

        return await self._trimming_first(trims, lambda: self._mutate(idem, meta_pb2.Inode, trims.txn(fn)))

    async def _has_write_session(self, tr: Transaction, inode_id: int, session_id: int) -> bool:
        if not session_id:
            return False
        raw = await tr.get(schema.session_key(inode_id, session_id))
        return raw is not None and meta_pb2.FileSession.FromString(raw).write

    def _store_attrs(self, tr: Transaction, ino: meta_pb2.Inode) -> None:
        """Store a completed inode; a directory's times go to its times key."""
        if ino.type == DIRECTORY:
            tr.set(schema.dir_times_key(ino.id), schema.encode_times(ino.mtime_ns, ino.ctime_ns))
            stored = meta_pb2.Inode()
            stored.CopyFrom(ino)
            stored.nlink = 2 if ino.nlink else 0  # the live count is kept in the links key
            # the times key has it; the inode's own ctime is for renames and xattr changes only
            # (inodes.complete shows the later), and one kept here could not be replaced by entry
            # changes were it bad (see inodes.touch_dir)
            stored.ctime_ns = 0
            inodes.store(tr, stored)
        else:
            inodes.store(tr, ino)

    # ---- access ----------------------------------------------------------------------------------

    async def check_file_access(
        self,
        cred: Credentials,
        inode_id: int,
        want: int,
        *,
        owner_override: bool = False,
        write_until_ns: int = 0,
    ) -> meta_pb2.Inode:
        """The regular file ``inode_id``, if ``cred`` may access it for ``want`` (R_OK, W_OK) now,
        as an open would check it; PERMISSION_DENIED (EACCES) if not, META_IS_DIRECTORY or
        INVALID_ARGUMENT for anything but a regular file, NOT_FOUND once it is collected. A file
        unlinked since is still checked (its open handles live on). With ``owner_override`` its
        owner may access it whatever its mode: as POSIX lets a creator open it so, and as an owner
        may chmod it anyway (a renewal of an open's capability must not fail where the open held).

        With ``write_until_ns`` (a write capability of the file is being issued, good until then)
        the file records it (``Inode.write_caps_until_ns``, twice as far ahead, so that renewals
        need no write): chunks written with such a capability after the file is collected are
        removed by the collector's second pass after that time."""

        def checked(ino: meta_pb2.Inode) -> meta_pb2.Inode:
            if ino.type == DIRECTORY:
                raise FS3Error(StatusCode.META_IS_DIRECTORY, f"inode {inode_id} is a directory")
            if ino.type != FILE:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"inode {inode_id} is not a regular file")
            if not (owner_override and ino.uid == cred.uid):
                check(ino, cred, want)
            return ino

        if not write_until_ns:
            return checked(await self.db.run(lambda tr: inodes.load(tr.snapshot, inode_id), read_only=True))

        async def mark(tr: Transaction) -> meta_pb2.Inode:
            ino = checked(await inodes.load(tr, inode_id))
            if ino.write_caps_until_ns < write_until_ns:
                ino.write_caps_until_ns = 2 * write_until_ns - inodes.now_ns()
                inodes.store(tr, ino)
            return ino

        return await self.db.run(mark)

    # ---- extended attributes -----------------------------------------------------------------

    async def getxattr(self, cred: Credentials, inode_id: int, name: bytes) -> bytes:
        _check_xattr_name(name)
        ino = await self.db.run(lambda tr: inodes.load(tr.snapshot, inode_id), read_only=True)
        if ino.type not in (FILE, DIRECTORY):
            # Linux's xattr_permission: there are none to read (setxattr refuses them), whatever
            # the mode says
            raise FS3Error(StatusCode.META_NO_XATTR, f"no xattr {quote_name(name)} on inode {inode_id}")
        check(ino, cred, R_OK)
        for x in ino.xattrs:
            if x.name == name:
                return x.value
        raise FS3Error(StatusCode.META_NO_XATTR, f"no xattr {quote_name(name)} on inode {inode_id}")

    async def listxattr(self, cred: Credentials, inode_id: int) -> list[bytes]:
        """The names of an inode's user xattrs. No permission is needed (as on Linux, where only
        reaching the file counts: the kernel checks that before asking); values need read
        permission (:meth:`getxattr`)."""
        ino = await self.db.run(lambda tr: inodes.load(tr.snapshot, inode_id), read_only=True)
        return [x.name for x in ino.xattrs]

    async def setxattr(
        self, cred: Credentials, inode_id: int, name: bytes, value: bytes, flags: int = 0, idem: Idem = None
    ) -> None:
        _check_xattr_name(name)
        if len(value) > XATTR_SIZE_MAX:
            raise FS3Error(StatusCode.META_TOO_BIG, f"xattr value of {len(value)} bytes is too large")
        if flags & ~(XATTR_CREATE | XATTR_REPLACE):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown setxattr flags {flags:#x}")
        await self._edit_xattrs(cred, inode_id, name, value, flags, idem)

    async def removexattr(self, cred: Credentials, inode_id: int, name: bytes, idem: Idem = None) -> None:
        _check_xattr_name(name)
        await self._edit_xattrs(cred, inode_id, name, None, XATTR_REPLACE, idem)

    async def _edit_xattrs(
        self, cred: Credentials, inode_id: int, name: bytes, value: bytes | None, flags: int, idem: Idem
    ) -> None:
        """With a request id, once only: a retried XATTR_CREATE or remove that had taken effect
        returns success, not EEXIST or ENODATA."""

        async def fn(tr: Transaction) -> meta_pb2.EmptyRsp:
            ino = await inodes.load(tr, inode_id)
            if ino.type not in (FILE, DIRECTORY):
                raise FS3Error(
                    StatusCode.META_NOT_PERMITTED, "user xattrs exist on files and directories only"
                )
            # Linux's xattr_permission: a sticky directory is shared (/tmp), so write permission on
            # it is no licence to label it; only its owner or root may.
            if ino.type == DIRECTORY and ino.mode & S_ISVTX:
                check_owner(ino, cred, "change user xattrs of a sticky directory")
            check(ino, cred, W_OK)
            idx = next((i for i, x in enumerate(ino.xattrs) if x.name == name), None)
            if idx is None and flags & XATTR_REPLACE:
                raise FS3Error(StatusCode.META_NO_XATTR, f"no xattr {quote_name(name)} on inode {inode_id}")
            if idx is not None and flags & XATTR_CREATE:
                raise FS3Error(StatusCode.ALREADY_EXISTS, f"xattr {quote_name(name)} exists")
            if value is None:
                del ino.xattrs[idx]
            elif idx is None:
                ino.xattrs.add(name=name, value=value)
            else:
                ino.xattrs[idx].value = value
            if _stored_size(ino.xattrs) > XATTR_TOTAL_MAX:
                raise FS3Error(StatusCode.RESOURCE_EXHAUSTED, "no room for more xattrs on this inode")
            # a directory's ctime too goes to its inode (see inodes.complete), not its times key
            ino.ctime_ns = inodes.now_ns()
            inodes.store(tr, ino)
            return meta_pb2.EmptyRsp()

        await self._mutate(idem, meta_pb2.EmptyRsp, fn)

    # ---- layouts and statfs --------------------------------------------------------------------

    async def set_layout(
        self,
        cred: Credentials,
        inode_id: int,
        chain_table_id: int = 0,
        chunk_size: int = 0,
        stripe: int = 0,
        idem: Idem = None,
    ) -> meta_pb2.Inode:
        """Set a directory's default layout for new children (zero keeps a field); once per
        request id."""
        check_layout_params(chunk_size, stripe)
        if chain_table_id and not await self.layouts.knows_table(chain_table_id):
            # files made there would get no chains: their writes would fail, at close at best
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"chain table {chain_table_id} does not exist")

        async def fn(tr: Transaction) -> meta_pb2.Inode:
            d = await inodes.load_dir(tr, inode_id)
            check_owner(d, cred, "set a directory's layout")
            if chain_table_id:
                d.layout.chain_table_id = chain_table_id
            if chunk_size:
                d.layout.chunk_size = chunk_size
            if stripe:
                d.layout.stripe_count = stripe
            inodes.store(tr, d)
            return inodes.public(await inodes.complete(tr.snapshot, d))

        return await self._mutate(idem, meta_pb2.Inode, fn)

    async def statfs(self, capacity: int, used: int, available: int | None = None) -> meta_pb2.StatFsRsp:
        """Space from the caller (storage's figures; ``available``, what writes may still use,
        is the free space when not given), inode count from the store."""

        async def fn(tr: Transaction) -> int:
            return schema.decode_count(await tr.snapshot.get(schema.INODE_COUNT_KEY))

        count = await self.db.run(fn, read_only=True)
        return meta_pb2.StatFsRsp(
            capacity=capacity,
            used=used,
            free=max(capacity - used, 0),
            available=max(capacity - used, 0) if available is None else available,
            inodes=count,
            block_size=4096,
            name_max=255,
        )
