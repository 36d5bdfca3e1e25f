"""The native fs3 file API (DESIGN §8): files and directories by path, without FUSE.

Async::

    async with await FileSystem.connect(ClientConfig(mgmtd_addresses=["10.0.0.1:8000"])) as fs:
        await fs.mkdir("/data")
        async with await fs.open("/data/a.bin", "w") as f:
            await f.write(b"hello")
        print((await fs.stat("/data/a.bin")).st_size)
        samples = await fs.read_batch([("/data/a.bin", 0, 2), ("/data/a.bin", 3, 2)])

Synchronous (the same calls on a private event loop in a background thread)::

    with SyncFileSystem.connect(config) as fs:
        with fs.open("/data/a.bin", "r") as f:
            data = f.read()

What a caller may rely on:

- Data goes to storage split at chunk boundaries, each piece to its chain's head; reads go to a
  SERVING replica chosen for load; both are retried with backoff and a routing refresh on routing
  errors, and checked by CRC32C end to end (:mod:`fs3.client.storage_client`). Meta calls fail over
  between meta servers (:mod:`fs3.client.meta_client`).
- Opening a file for writing opens a write session; :meth:`File.fsync` and :meth:`File.close`
  report the length written, so meta settles the file's length. Writes are buffered per open file
  (``write_buffer_bytes``) and flushed in the background; errors surface at the next write, fsync
  or close. A close whose caller is cancelled still ends, in the background, once the handle's
  flushes are done (:meth:`FileSystem.close` waits for it). Within one FileSystem, reads see
  every write made through it (read-your-writes), and :meth:`FileSystem.stat` reports the length
  open writers have written.
- Other clients see a file's data and length after its writer closed or fsynced it (close-to-open).
  An open file's length is meta's as of the last stat, or of the last read that reached past it
  (:meth:`File.pread` looks again then), extended by this FileSystem's unreported writes: a reader
  that keeps its file open follows other clients' appends and truncates.
- Errors raise :class:`fs3.errors.FS3Error`; ``e.errno`` is the POSIX errno.
- With ``ClientConfig.user_auth`` the client holds no cluster secret: its connections authenticate
  with the user token in ``token_file``, meta acts for it only as the token's user, and storage
  serves it the files meta lets it open, through capabilities (:mod:`fs3.capability`) that its
  opens bring and that it renews with meta as they run out (EACCES once access is lost).
- A client using the token in ``token_file`` looks at that file every ``TOKEN_CHECK_S`` and takes
  up a new token written there (``fs3 admin user-token UID --token-out FILE``) once mgmtd says it
  is the same user's, for its later calls and connections: a token that expires or is revoked
  is replaced without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import math
import operator
import os
import socket
import stat as stat_mod
import time
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from fs3.capability import CapabilityCache
from fs3.client.file import InodeState, OpenFile, ScatterBudget, read_many, stamp
from fs3.client.meta_client import DEV_SECRET, MAX_SYMLINK_FOLLOWS, ROOT_ID, InodeHandles, MetaClient
from fs3.client.mgmtd_client import ClientSessionKeeper, MgmtdClient, MgmtdUnreachable, session_clock
from fs3.client.routing import RoutingCache
from fs3.client.storage_client import RetryPolicy, StorageClient
from fs3.config import ClientConfig, load_config
from fs3.errors import FS3Error, FS3UnsupportedOperation, FS3ValueError, StatusCode, fresh_error, quote_name
from fs3.memory import tune_malloc
from fs3.net import RpcClient
from fs3.net.auth import read_secret
from fs3.net.transport import format_address
from fs3.net.transport_select import make_transport
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.proto import meta_pb2 as m

log = logging.getLogger(__name__)

# A close meta did not answer is sent again after END_AGAIN_FIRST_S, then at doubling intervals up
# to END_AGAIN_MAX_S; a client being closed gives those in flight END_AGAIN_AT_CLOSE_S more.
END_AGAIN_FIRST_S = 1.0
END_AGAIN_MAX_S = 30.0
END_AGAIN_AT_CLOSE_S = 5.0
#: how long FileSystem.close waits for the Files still open to close (flush) first
CLOSE_FILES_S = 30.0
#: how long the length report after a failed flush may take (see FileSystem._sync)
FAILED_FLUSH_REPORT_S = 5.0
#: how long a read that found a hole waits for meta's length (see FileSystem._recheck)
RECHECK_S = 1.0
#: and, once meta did not answer it, how long such reads of that file do not ask again
RECHECK_QUIET_S = 10.0
#: how many times read_batch reads again the ranges of files that moved while it read them
_BATCH_RECHECKS = 3
#: how often a client using token_file looks whether a new token was written there
TOKEN_CHECK_S = 5.0
# File.readline reads this much ahead of the position, kept for the next lines until the File
# seeks or writes
LINE_BLOCK = 64 << 10

_TYPE_BITS = {
    m.INODE_FILE: stat_mod.S_IFREG,
    m.INODE_DIRECTORY: stat_mod.S_IFDIR,
    m.INODE_SYMLINK: stat_mod.S_IFLNK,
    m.INODE_FIFO: stat_mod.S_IFIFO,
    m.INODE_SOCKET: stat_mod.S_IFSOCK,
    m.INODE_CHAR_DEVICE: stat_mod.S_IFCHR,
    m.INODE_BLOCK_DEVICE: stat_mod.S_IFBLK,
}


#: st_blksize of fs3's files, in the native API and the mount: cp and stdio size their I/O by it
BLOCK_SIZE = 1 << 20


def mode_of(inode: m.Inode) -> int:
    """``st_mode`` of an inode: its type bits and permission bits."""
    return _TYPE_BITS.get(inode.type, 0) | (inode.mode & 0o7777)


@dataclass(slots=True, frozen=True)
class StatResult:
    """What :meth:`FileSystem.stat` returns, shaped like :func:`os.stat_result`."""

    st_ino: int
    st_mode: int
    st_nlink: int
    st_uid: int
    st_gid: int
    st_size: int
    st_rdev: int
    st_atime_ns: int
    st_mtime_ns: int
    st_ctime_ns: int
    inode: m.Inode

    # the rest of os.stat_result's fields, as the mount shows them

    @property
    def st_atime(self) -> float:
        return self.st_atime_ns / 1e9

    @property
    def st_mtime(self) -> float:
        return self.st_mtime_ns / 1e9

    @property
    def st_ctime(self) -> float:
        return self.st_ctime_ns / 1e9

    @property
    def st_blocks(self) -> int:
        """512-byte blocks: the length's, rounded up (fs3 does not count a sparse file's holes
        apart; the mount says the same)."""
        return (self.st_size + 511) // 512

    @property
    def st_blksize(self) -> int:
        """The I/O size that suits fs3 (tools size their reads and writes by it)."""
        return BLOCK_SIZE

    @property
    def st_dev(self) -> int:
        """0: the native API has no device number (a mount's files get the kernel's)."""
        return 0

    @classmethod
    def of(cls, inode: m.Inode, size: int | None = None, state: InodeState | None = None) -> StatResult:
        """``inode``'s; ``state``: this client's of the open file (its length and its writes'
        times count)."""
        mtime, ctime = (inode.mtime_ns, inode.ctime_ns) if state is None else state.times(inode)
        return cls(
            inode.id,
            mode_of(inode),
            inode.nlink,
            inode.uid,
            inode.gid,
            inode.size if size is None else size,
            inode.rdev,
            inode.atime_ns,
            mtime,
            ctime,
            inode,
        )


#: (uid_t)-1: chown's "leave it as it is", as -1
_NO_ID = 0xFFFFFFFF


_SPECIAL = {
    m.INODE_FIFO: "FIFO",
    m.INODE_SOCKET: "socket",
    m.INODE_CHAR_DEVICE: "character device",
    m.INODE_BLOCK_DEVICE: "block device",
}


def _fspath(path: str | bytes) -> bytes:
    """A path or name as bytes; one with a NUL is refused as os refuses it (ValueError): no name
    holds one, and meta's error for it named no cause."""
    p = os.fsencode(path)
    if b"\0" in p:
        raise ValueError("embedded null byte")
    return p


def _c_int(what: str, value: int) -> int:
    """``value`` as os takes a mode or flags (a C int): TypeError for None or a float,
    OverflowError outside the int's range. Masked as it was (chmod(p, 2**40) set mode 000,
    open(p, "w", None) made a file of mode 000)."""
    value = operator.index(value)
    if not -(1 << 31) <= value < 1 << 31:
        raise OverflowError(f"{what} {value} is out of range")
    return value


def _off_t(what: str, value: int) -> int:
    """``value`` as os takes a length, an offset or nanoseconds (64 bits): TypeError for None or a float,
    OverflowError outside its range (protobuf's ValueError reached the caller)."""
    value = operator.index(value)
    if not -(1 << 63) <= value < 1 << 63:
        raise OverflowError(f"{what} {value} is out of range")
    return value


#: lookup errors that mean a path names nothing (FileSystem.exists)
_NAMES_NOTHING = frozenset(
    (
        StatusCode.NOT_FOUND,
        StatusCode.META_NOT_DIRECTORY,
        StatusCode.META_TOO_MANY_SYMLINKS,
        StatusCode.META_NAME_TOO_LONG,
        StatusCode.META_INVALID_NAME,
        StatusCode.INVALID_ARGUMENT,
        StatusCode.PERMISSION_DENIED,
    )
)


def _mode_of(flags: int) -> str:
    """The mode Python's binary file objects show for open(2) ``flags`` (see :attr:`File.mode`)."""
    plus = "+" if flags & os.O_ACCMODE == os.O_RDWR else ""
    if flags & os.O_CREAT and flags & os.O_EXCL:
        return "xb" + plus
    if flags & os.O_APPEND:
        return "ab" + plus
    return "rb" + plus if plus or flags & os.O_ACCMODE == os.O_RDONLY else "wb"


def _size_arg(size: int | None, what: str, *, negative: bool = False) -> int:
    """A read size as Python's files take it: None or -1 for "all" (-1 returned), an integer
    otherwise (TypeError for any other type), not below -1 unless ``negative`` (readline takes any
    negative size as "all"; read refuses them with ValueError)."""
    if size is None:
        return -1
    size = operator.index(size)
    if size < -1 and not negative:
        raise FS3ValueError(
            StatusCode.INVALID_ARGUMENT, f"{what} length must be non-negative or -1, not {size}"
        )
    return size


def _flags_of(mode: str) -> int:
    """open(2) flags of a Python-style mode string: one of "r", "w", "a", "x", then "+" and "b" in
    any order, each at most once, as Python's :func:`open` takes them ("rb+", "+r"); files here are
    binary whatever the mode says ("t" is refused)."""
    if not isinstance(mode, str):
        raise TypeError(f"open() argument 'mode' must be str, not {type(mode).__name__}")
    kinds = [c for c in mode if c in "rwax"]
    if len(kinds) != 1 or len(set(mode)) != len(mode) or set(mode) - set("rwax+b"):
        raise ValueError(f"invalid mode {mode!r}")
    flags = {
        "r": os.O_RDONLY,
        "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    }[kinds[0]]
    if "+" in mode:
        flags = flags & ~os.O_WRONLY | os.O_RDWR
    return flags


def _split(path: str | bytes) -> tuple[bytes, bytes, bool]:
    """(the parent's path, the last name, whether a slash followed it). Only the last name is cut
    off: the parent's path, ".." and symlinks in it included, is for meta to resolve as the kernel
    would ("a/link/.." is the parent of where link points, not "a"; "missing/.." does not exist)."""
    p = _fspath(path)
    if not p:
        raise FS3Error(StatusCode.NOT_FOUND, "the empty path names nothing")
    if not p.startswith(b"/"):
        p = b"/" + p
    stripped = p.rstrip(b"/")
    if not stripped:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "the root has no parent")
    parent, name = stripped.rsplit(b"/", 1)
    return parent or b"/", name, len(stripped) != len(p)


def read_token(path: str) -> str:
    """The user token in ``path`` ('' when ``path`` is '')."""
    return Path(path).read_text().strip() if path else ""


def _file_mark(path: str) -> tuple[int, int, int] | None:
    """What tells a rewritten or replaced file from the one seen before (None: not there now)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _token_uid(token: str) -> int | None:
    """The uid a token names (tokens are ``fs3u.UID.SECRET``), None for a malformed one."""
    parts = token.split(".")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def local_cluster_config() -> str | None:
    """Without a config: the ``fs3 local`` cluster's client config in its default directory
    (``$FS3_LOCAL_DIR``, else ``~/.local/share/fs3/local``), as ``fs3 admin`` takes that cluster
    without flags, unless ``$FS3_MGMTD_ADDRESSES`` names a cluster; None (the built-in defaults,
    mgmtd on 127.0.0.1:8000) where there is none."""
    if os.environ.get("FS3_MGMTD_ADDRESSES"):
        return None
    from fs3.cli.local_cluster import default_dir

    path = default_dir() / "config" / "client.toml"
    if not path.is_file():
        return None
    log.info("no client config given: using the fs3 local cluster's, %s", path)
    return str(path)


def _credentials_hint(config: ClientConfig) -> str:
    """Which of the config's credentials mgmtd refused, and what to look at."""
    if config.user_auth:
        return f"the user token in token_file {config.token_file} (a new one: fs3 admin user-token)"
    if config.cluster_secret_file:
        return (
            f"the cluster secret in {config.cluster_secret_file} (or, for a client not trusted with "
            "it: user_auth = true and a token_file)"
        )
    return (
        "no cluster_secret_file is set, so the development secret was tried (set the cluster's "
        "secret file, or user_auth = true and a token_file)"
    )


def _token_of(config: ClientConfig) -> str:
    """The token in ``config.token_file``; CONFIG_INVALID when it cannot be read."""
    try:
        return read_token(config.token_file)
    except OSError as e:
        raise FS3Error(
            StatusCode.CONFIG_INVALID, f"cannot read token_file {config.token_file}: {e.strerror}"
        ) from None


async def _default_user(mgmtd: MgmtdClient, token: str) -> common_pb2.UserInfo:
    """Who a FileSystem acts as unless told: this process's uid, gid and groups, or, on user
    connections with a non-root ``token``, the token's user (meta acts as that one anyway)."""
    if token:
        owner = await mgmtd.verify_token(token)
        if not owner.root:
            return common_pb2.UserInfo(uid=owner.uid, gid=owner.gid, groups=owner.groups)
    return common_pb2.UserInfo(uid=os.getuid(), gid=os.getgid(), groups=os.getgroups())


class File:
    """An open file of the native API (async). Position-based :meth:`read` / :meth:`write` and
    positional :meth:`pread` / :meth:`pwrite`; safe to share between tasks of one event loop."""

    def __init__(self, fs: FileSystem, handle: OpenFile, path: bytes, flags: int) -> None:
        self.fs = fs
        self.handle = handle
        self.path = path
        self.flags = flags
        self.pos = 0
        self.closed = False
        self.bytes_name = False  # opened by a bytes path (see name)
        # read() and readinto() of tasks (or threads, through SyncFileSystem) sharing this File
        # take their ranges one after another, as reads of a shared descriptor do: each got the
        # same bytes while the position moved on past others never returned
        self._reading = asyncio.Lock()
        # (offset, bytes) that readline read past the position; dropped when this File seeks or writes
        self._ahead: tuple[int, bytes] | None = None
        # closed when collected unclosed (``fs.open(p).read()``), as Python's files are: its
        # session stayed open on meta (keeping an unlinked file's chunks) and its state in memory
        # until the client closed, one more per sample of a data loader (writers are kept open
        # until closed, by FileSystem._writers)
        self._finalizer = weakref.finalize(self, _file_dropped, fs, handle, path)
        self._finalizer.atexit = False

    @property
    def inode_id(self) -> int:
        return self.handle.inode_id

    @property
    def name(self) -> str | bytes:
        """The path the file was opened by, as a file object's ``name`` is (bytes when it was
        given as bytes)."""
        return self.path if self.bytes_name else os.fsdecode(self.path)

    @property
    def mode(self) -> str:
        """The open mode as Python's binary files show it: "rb", "wb", "ab", "xb", "rb+", "ab+",
        "xb+" ("w+" shows as "rb+", as Python's does)."""
        return _mode_of(self.flags)

    def readable(self) -> bool:
        self._check()
        return self.flags & os.O_ACCMODE != os.O_WRONLY

    def writable(self) -> bool:
        self._check()
        return self.flags & os.O_ACCMODE != os.O_RDONLY

    def seekable(self) -> bool:
        self._check()
        return True

    def isatty(self) -> bool:
        self._check()
        return False

    def fileno(self) -> int:
        """There is none (the file is not the kernel's): io.UnsupportedOperation, as io.BytesIO says."""
        raise io.UnsupportedOperation("an fs3 native file has no file descriptor")

    @property
    def size(self) -> int:
        """The file's length as this client knows it (meta's when last asked, or further where
        this client wrote bytes meta has not counted yet)."""
        return self.handle.state.size

    # A misuse Python's own files refuse is refused as they do (FS3ValueError for a closed file,
    # FS3UnsupportedOperation for a mode that does not allow the operation, TypeError for an
    # offset or length that is not an integer), before anything is buffered or sent.

    def _check(self) -> None:
        if self.closed:
            raise FS3ValueError(StatusCode.META_BAD_HANDLE, "I/O operation on closed file")

    def _check_readable(self) -> None:
        self._check()
        if self.flags & os.O_ACCMODE == os.O_WRONLY:
            raise FS3UnsupportedOperation(
                StatusCode.META_BAD_HANDLE, "read: the file is not open for reading"
            )

    def _check_writable(self, what: str) -> None:
        self._check()
        if self.flags & os.O_ACCMODE == os.O_RDONLY:
            raise FS3UnsupportedOperation(
                StatusCode.META_BAD_HANDLE, f"{what}: the file is not open for writing"
            )

    async def pread(self, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (short at the end of the file)."""
        self._check_readable()
        length, offset = operator.index(length), operator.index(offset)
        if length < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative length {length}")
        if offset + length > self.handle.state.size:
            # another client may have extended the file since it was opened: look again at the end
            await self.fs._refresh(self.handle)
        return await self.handle.read(offset, length)

    async def read(self, length: int | None = -1) -> bytes:
        """Up to ``length`` bytes (all to the end when -1 or None) from the current position."""
        self._check_readable()
        length = _size_arg(length, "read")
        async with self._reading:
            if length < 0:
                await self.fs._refresh(self.handle)
                length = max(0, self.handle.state.size - self.pos)
            data = await self.pread(length, self.pos)
            self.pos += len(data)
            return data

    async def readinto(self, buf: bytearray | memoryview) -> int:
        """Read up to ``len(buf)`` bytes from the current position into ``buf``, without a copy
        where storage can put them there; returns how many (0 at the end of the file)."""
        self._check_readable()
        view = memoryview(buf).cast("B")
        if view.readonly:
            raise TypeError(f"readinto() needs a writable buffer, not {type(buf).__name__}")
        async with self._reading:
            if self.pos + len(view) > self.handle.state.size:
                await self.fs._refresh(self.handle)  # another client may have extended the file
            n = await self.handle.read_into(self.pos, view)
            self.pos += n
            return n

    async def readline(self, size: int | None = -1) -> bytes:
        """The bytes from the position through the next newline (fewer at the end of the file or
        when ``size`` bytes came first); b"" at the end. Reads LINE_BLOCK bytes at a time and keeps
        what it read past the line for the next calls until this File seeks or writes, as a
        buffered reader does (another writer's changes to those bytes show after that, or to read
        and pread, which always ask storage)."""
        self._check_readable()
        limit = max(-1, _size_arg(size, "readline", negative=True))
        async with self._reading:
            start = self.pos
            line = bytearray()
            while limit < 0 or len(line) < limit:
                at = start + len(line)
                ahead = self._ahead
                if ahead is None or not ahead[0] <= at < ahead[0] + len(ahead[1]):
                    data = await self.pread(LINE_BLOCK, at)
                    if not data:
                        break
                    ahead = self._ahead = (at, data)
                block, off = ahead[1], at - ahead[0]
                end = len(block) if limit < 0 else min(len(block), off + limit - len(line))
                nl = block.find(b"\n", off, end)
                if nl >= 0:
                    line += block[off : nl + 1]
                    break
                line += block[off:end]
            self.pos = start + len(line)
            return bytes(line)

    async def readlines(self, hint: int | None = -1) -> list[bytes]:
        """The lines to the end of the file, or until they add up to more than ``hint`` bytes (when
        positive), as io's readlines."""
        lines: list[bytes] = []
        total = 0
        while hint is None or hint <= 0 or total <= hint:
            line = await self.readline()
            if not line:
                break
            lines.append(line)
            total += len(line)
        return lines

    def __aiter__(self) -> File:
        return self

    async def __anext__(self) -> bytes:
        line = await self.readline()
        if not line:
            raise StopAsyncIteration
        return line

    async def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        """Write ``data`` at ``offset`` (buffered); returns its length."""
        self._check_writable("write")
        offset = operator.index(offset)
        self._ahead = None
        return await self.handle.write(offset, data)

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write at the current position (at the end with O_APPEND) and advance it."""
        self._check_writable("write")
        self._ahead = None
        if self.flags & os.O_APPEND:
            state = self.handle.state
            # the length is the offset, and counts this write only once handle.write returns:
            # other tasks and handles appending meanwhile wait, or they would take the same offset
            async with state.appending:
                if time.monotonic() - state.fresh_at > self.fs.config.attr_timeout_s:
                    await self.fs._refresh(self.handle)  # another client may have appended since
                pos = state.size
                n = await self.handle.write(pos, data)
            self.pos = pos + n
            return n
        # The position moves before the write waits (a full buffer waits for a flush slot), as a
        # shared descriptor's does, so that tasks writing through one File take ranges one after
        # another rather than the same one; it moves back if nothing moved it meanwhile and the
        # write failed before its bytes were taken (a write cancelled as it waits for a flush slot
        # was made: its bytes go to storage, so the position stays past them).
        pos = self.pos
        end = pos + memoryview(data).nbytes
        self.pos = end
        taken: list[bool] = []
        try:
            return await self.handle.write(pos, data, lambda: taken.append(True))
        except BaseException:
            if self.pos == end and not taken:
                self.pos = pos
            raise

    async def write_parallel(
        self, pieces: Iterable[tuple[int, bytes | bytearray | memoryview]], concurrency: int = 16
    ) -> int:
        """Write many ``(offset, data)`` pieces concurrently (a checkpoint's shards), each straight to
        storage, at most ``concurrency`` at a time; returns the bytes written. Pieces must not
        overlap one another. If a piece fails, the first error is raised once every piece has
        ended (written or failed)."""
        self._check_writable("write")
        self._ahead = None
        if concurrency < 1:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"concurrency {concurrency}: at least 1")
        sem = asyncio.Semaphore(concurrency)

        async def one(offset: int, data: bytes | bytearray | memoryview) -> int:
            async with sem:
                return await self.handle.write_through(offset, data)

        written = 0
        for r in await asyncio.gather(*(one(o, d) for o, d in pieces), return_exceptions=True):
            if isinstance(r, BaseException):
                raise r
            written += r
        return written

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move the position (SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA, SEEK_HOLE); returns it.
        SEEK_END counts from the length this client knows (``size``), not asked of meta here:
        ``await stat()`` first takes another client's appends and truncates (the synchronous
        SyncFile.seek asks itself). SEEK_DATA and SEEK_HOLE take the whole file as data, as Linux
        does for a file system that does not track holes: SEEK_DATA stays, SEEK_HOLE goes to the
        end; both ENXIO at or past the end."""
        self._check()
        offset, whence = operator.index(offset), operator.index(whence)
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self.pos + offset
        elif whence == os.SEEK_END:
            pos = self.handle.state.size + offset
        elif whence in (os.SEEK_DATA, os.SEEK_HOLE):
            size = self.handle.state.size
            if not 0 <= offset < size:
                raise FS3Error(StatusCode.META_NO_SUCH_DEVICE, f"offset {offset}: no data at or past the end")
            pos = offset if whence == os.SEEK_DATA else size
        else:
            raise FS3ValueError(StatusCode.INVALID_ARGUMENT, f"whence value {whence} unsupported")
        if pos < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative position {pos}")  # and stays
        self._ahead = None
        self.pos = pos
        return pos

    def tell(self) -> int:
        self._check()
        return self.pos

    async def truncate(self, size: int | None = None) -> int:
        """Cut or extend the file to ``size`` bytes (the current position when None) through this
        handle's write session; returns the new length. As ftruncate(2), EINVAL for a handle not
        open for writing (an io.UnsupportedOperation, as Python's files raise) or a negative size."""
        self._check()
        if not self.handle.writable:
            raise FS3UnsupportedOperation(
                StatusCode.INVALID_ARGUMENT, "truncate: the file is not open for writing"
            )
        self._ahead = None
        size = self.pos if size is None else _off_t("length", size)
        if size < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative length {size}")
        await self.fs._truncate(self.handle.state, size, self.handle.session_id)
        return size

    async def flush(self) -> None:
        """Write the buffer out to storage (the length is reported at fsync and close)."""
        self._check()
        await self.handle.flush_buffer()

    async def fsync(self) -> None:
        """Write everything out and report the length to meta, so other clients see it."""
        self._check()
        await self.fs._sync(self.handle)

    async def stat(self) -> StatResult:
        self._check()
        await self.handle.state.drain()
        await self.fs._refresh(self.handle)
        return StatResult.of(self.handle.state.inode, self.handle.state.size, self.handle.state)

    async def close(self) -> None:
        """Flush, report the written length and end the session. Closing twice does nothing."""
        if self.closed:
            return
        self.closed = True
        self._finalizer.detach()
        self.fs._writers.discard(self)
        await self.fs._close(self.handle)

    async def __aenter__(self) -> File:
        self._check()  # a closed file refuses ``with``, as Python's do
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _file_dropped(fs: FileSystem, handle: OpenFile, path: bytes) -> None:
    """A File collected unclosed (in any thread, the sync API's callers' included): its handle
    is closed in the background, in the client's loop, unless the client is closed already."""
    loop = fs._loop
    if fs._closed or loop is None or loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(fs._dropped, handle)
    # once the close is on its way: a ResourceWarning made an error stops nothing
    warnings.warn(f"unclosed fs3 file {quote_name(path)}", ResourceWarning, stacklevel=1)


class FileSystem:
    """A connection to one fs3 cluster, acting as one user. Make it with :meth:`connect`; use it in
    the event loop it was made in; :meth:`close` it (or ``async with``)."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        rpc: RpcClient,
        mgmtd: MgmtdClient,
        routing: RoutingCache,
        meta: MetaClient,
        storage: StorageClient,
    ) -> None:
        self.config = config
        self.rpc = rpc
        self.mgmtd = mgmtd
        self.routing = routing
        self.meta = meta
        self.storage = storage
        self._states: dict[int, InodeState] = {}
        # open Files, closed (flushed) by close() as Python closes its files at exit
        self._files: weakref.WeakSet[File] = weakref.WeakSet()
        # those open for writing, held until closed: one its caller dropped unclosed (``fs.open(p,
        # "wb").write(data)``) was collected with its buffered writes, which nothing flushed
        self._writers: set[File] = set()
        self._scatter_budget = ScatterBudget(config.write_scatter_total_bytes)
        self._meta_from_routing = not config.meta_addresses
        self._session: ClientSessionKeeper | None = None
        # closes whose caller was cancelled, finishing in the background (see _close)
        self._closing: set[asyncio.Task[None]] = set()
        # session ends meta did not answer, sent again in the background (see _end_again)
        self._ending_again: set[asyncio.Task[None]] = set()
        self._end_again_now = asyncio.Event()
        self._closed = False
        self._close_task: asyncio.Future[None] | None = None  # see close
        # Files' closes under way (File.close), and an event set whenever none is: the client's
        # close waits for them before the connections end (a thread's ``with fs.open(p, "wb")``
        # closing as another thread closed the client failed, CANCELLED, and lost what it wrote)
        self._file_closes = 0
        self._file_closes_ended = asyncio.Event()
        # handles whose writes a background close is flushing, and the closes that lost theirs (a
        # flush failed, or the client's close gave up on it): a mount exits 1 if any did
        self._flushing_in_background: set[OpenFile] = set()
        self.lost_closes = 0
        # the token in config.token_file in use, and the task taking up a new one written there
        self._token = ""
        self._token_watch: asyncio.Task[None] | None = None
        self._token_listeners: list[Callable[[str, str], None]] = []
        # its connections (gRPC channels, sockets) belong to this loop: see close
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @classmethod
    async def connect(
        cls,
        config: ClientConfig | str | os.PathLike[str] | None = None,
        *,
        user: common_pb2.UserInfo | None = None,
        timeout_s: float = 30.0,
    ) -> FileSystem:
        """Connect to the cluster ``config`` names (a ClientConfig, a TOML path, or None: the
        ``fs3 local`` cluster's client config if there is one, see :func:`local_cluster_config`,
        else the defaults; ``FS3_*`` variables override either). ``user`` defaults to this
        process's uid, gid and groups with the token in ``token_file``; with ``config.user_auth``
        (connections authenticated by that token, not the cluster secret) a non-root token's user
        instead."""
        if config is None:
            config = local_cluster_config()
        defaults = config is None  # nothing named and no local cluster: the built-in defaults
        where = "" if isinstance(config, ClientConfig) else f" (from {config or 'the built-in defaults'})"
        if not isinstance(config, ClientConfig):
            config = load_config(ClientConfig, config)
        if config.tune_malloc:
            tune_malloc()
        token = _token_of(config) if config.user_auth or user is None else ""
        if config.user_auth and config.transport == "rdma":
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                "user_auth clients connect over TCP only (servers refuse user connections over RDMA, "
                "whose memory keys are valid NIC-wide): set transport = tcp or auto",
            )
        # user connections go over TCP (see above); members take what the config says
        transport = make_transport("tcp" if config.user_auth else config.transport, config.rdma)
        identity = f"client-{os.getpid()}"
        if config.user_auth:
            # Not trusted with the cluster secret: every connection proves the user token instead.
            if not token:
                raise FS3Error(
                    StatusCode.CONFIG_INVALID,
                    "user_auth = true needs token_file to name a file holding a user token"
                    + (f" ({config.token_file} is empty)" if config.token_file else ""),
                )
            rpc = RpcClient(None, token=token, identity=identity, connections_per_peer=2, transport=transport)
            # a server refusing the token later (revoked, expired) says which one, and what to do
            rpc.refusal_hint = (
                f"{_credentials_hint(config)}; this client takes up a new token written to that file "
                f"within {TOKEN_CHECK_S:.0f} s"
            )
            mgmtd = MgmtdClient(config.mgmtd_addresses, token=token, timeout_s=timeout_s)
        else:
            secret = read_secret(config.cluster_secret_file) or DEV_SECRET
            rpc = RpcClient(secret, identity=identity, connections_per_peer=2, transport=transport)
            mgmtd = MgmtdClient(config.mgmtd_addresses, cluster_secret=secret, timeout_s=timeout_s)
        routing = RoutingCache(mgmtd, refresh_interval_s=2.0)
        try:
            if user is None:
                user = await _default_user(mgmtd, token if config.user_auth else "")
                user.token = token
            await routing.start(first_timeout_s=timeout_s)
            addresses = list(config.meta_addresses)
            if not addresses:
                await routing.wait_for(lambda r: bool(meta_addresses(r)), timeout_s)
                addresses = meta_addresses(routing.routing)
            # Each try may take rpc_timeout_s; the call's budget leaves room for one try at every
            # meta server, so one that hangs (stopped, or a host that drops connects) is failed
            # over from instead of spending the whole budget.
            meta = MetaClient(
                addresses,
                rpc=rpc,
                user=user,
                timeout_s=config.rpc_timeout_s * max(len(addresses), 1),
                rpc_timeout_s=config.rpc_timeout_s,
            )
            # On user connections storage serves only files meta gave a capability for: those
            # opens and creates bring go into the cache, the others are asked of meta when needed.
            meta.capabilities = CapabilityCache(meta.capability) if config.user_auth else None
            # a non-root user's requests name inodes by id only with the handles meta gave it
            meta.handles = InodeHandles(config.inode_handles) if config.user_auth else None
            storage = StorageClient(
                routing,
                rpc,
                client_id=meta.client_id,
                retry=RetryPolicy(
                    total_s=max(config.rpc_timeout_s, 60.0), rpc_timeout_s=config.rpc_timeout_s
                ),
                user=user,
                coalesce_turns=config.read_coalesce_turns,
                capabilities=meta.capabilities,
            )
        except BaseException as e:
            await routing.stop()
            await mgmtd.close()
            await rpc.close()
            if isinstance(e, FS3Error) and e.code == StatusCode.UNAUTHENTICATED:
                raise FS3Error(e.code, f"{e.message}: {_credentials_hint(config)}") from None
            if isinstance(e, MgmtdUnreachable):
                # which cluster was tried, as fs3 admin says
                hint = (
                    "no cluster was named and there is no fs3 local cluster, so the default mgmtd "
                    "was tried: pass a client config, or set $FS3_MGMTD_ADDRESSES or $FS3_LOCAL_DIR"
                    if defaults
                    else f"is the cluster running? mgmtd_addresses {','.join(config.mgmtd_addresses)}{where}"
                )
                raise MgmtdUnreachable(e.code, f"{e.message} ({hint})") from None
            raise
        fs = cls(config, rpc=rpc, mgmtd=mgmtd, routing=routing, meta=meta, storage=storage)
        routing.add_listener(fs._routing_changed)
        # A live client session on mgmtd keeps meta from expiring this client's open files
        # however long they stay open without an fsync.
        fs._session = ClientSessionKeeper(
            mgmtd,
            mgmtd_pb2.ClientSession(
                client_id=str(meta.client_id),
                description=f"fs3 client pid {os.getpid()}",
                hostname=socket.gethostname(),
                pid=os.getpid(),
                uid=user.uid,
                type=common_pb2.NODE_CLIENT,
                started_at=time.time(),
            ),
        )
        await fs._session.start(strict=False)
        if token and config.token_file:
            fs._token = token
            fs._token_watch = asyncio.ensure_future(fs._watch_token(config.token_file))
        return fs

    def on_token_changed(self, callback: Callable[[str, str], None]) -> None:
        """Have ``callback(old, new)`` hear each new token taken up from ``token_file`` (after
        this client's own calls and connections use it): a mount updates its callers' clients."""
        self._token_listeners.append(callback)

    async def _watch_token(self, path: str) -> None:
        """Take up each new token written to ``path`` (see the module docstring). A token mgmtd
        refuses, or one of another user (this client acts as one user from start to end), is
        warned about and not used; one mgmtd could not be asked about is looked at again."""
        seen = _file_mark(path)
        while True:
            await asyncio.sleep(TOKEN_CHECK_S)
            mark = _file_mark(path)
            if mark is None or mark == seen:  # missing: being replaced, or gone (the old one stays)
                continue
            try:
                token = read_token(path)
            except (OSError, UnicodeDecodeError) as e:
                log.warning("cannot read token_file %s, still using the token read before: %s", path, e)
                seen = mark
                continue
            if not token or token == self._token:  # written empty first, or rewritten unchanged
                seen = mark
                continue
            try:
                await self._use_token(path, token)
            except asyncio.CancelledError:
                raise
            except FS3Error as e:
                if e.code in (StatusCode.UNAUTHENTICATED, StatusCode.CONFIG_INVALID):
                    log.warning(
                        "token_file %s holds a new token that is not used, the one read before is: %s",
                        path,
                        e.message,
                    )
                    seen = mark
                else:  # mgmtd not answering: asked again next time
                    log.info("cannot check the new token in token_file %s yet: %s", path, e.message)
                continue
            except Exception:  # a bug here must not end the watch: the file is looked at again
                log.exception("taking up the new token in token_file %s failed", path)
                continue
            seen = mark

    async def _use_token(self, path: str, token: str) -> None:
        owner = await self.mgmtd.verify_token(token)
        uid = _token_uid(self._token)
        if uid is not None and owner.uid != uid:
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                f"it is uid {owner.uid}'s token, and this client acts as uid {uid} (restart it to "
                "act as another user)",
            )
        old, self._token = self._token, token
        if self.rpc.token:  # user connections prove the token when they open: open new ones
            self.rpc.token = token
            self.rpc.retire_connections()
        if self.config.user_auth:
            self.mgmtd.set_token(token)
        for user in (self.meta.user, self.storage.user):
            if user.token == old:
                user.token = token
        for callback in self._token_listeners:
            try:
                callback(old, token)
            except Exception:
                log.exception("a token listener failed")
        log.info("token_file %s changed: using its new token (uid %d) from now on", path, owner.uid)

    def on_pushed_config(self, callback: Callable[[mgmtd_pb2.ConfigInfo], None]) -> None:
        """Have ``callback`` hear each newer client config mgmtd pushes (``fs3 admin config set
        client``), from the next extension of this client's session on (a mount applies its log
        level; a program using the native API decides for itself)."""
        if self._session is not None:
            self._session.on_config = callback

    def _routing_changed(self, routing: Any) -> None:
        if self._meta_from_routing:
            found = meta_addresses(routing)
            if found and set(found) != set(self.meta.addresses):
                # in place: the FUSE layer's per-caller meta clients share this list
                self.meta.addresses[:] = found
                self.meta._current %= len(found)

    async def close(self, *, give_up_s: float | None = None) -> None:
        """Close the Files still open (flushing what they wrote, for up to CLOSE_FILES_S: their
        writes were lost without a word), then every connection. File closes that were cancelled
        and go on in the background end first: for as long as they take (their flushes retry
        while storage comes back), or with ``give_up_s`` for that long at most, what they could
        not write out then counted in ``lost_closes`` (a mount's stop, which systemd ends after
        TimeoutStopSec, leaving a dead mount). Closing again does nothing."""
        if self._closed:
            return
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            # its connections' calls would go to a loop that no longer runs: the close would wait
            # out their timeouts and leave gRPC calls that never start
            raise RuntimeError(
                "FileSystem.close() called in another event loop than the one it was connected "
                "in: use a FileSystem in its own loop (or fs3.client.SyncFileSystem from threads)"
            )
        # One close at a time, which every caller waits for: two at once each ended the sessions
        # and connections, and the second's calls failed (CANCELLED) as the first closed them.
        # A caller cancelled leaves it to go on; one that failed is made again by the next call.
        task = self._close_task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._close_task = asyncio.ensure_future(self._close_all(give_up_s))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # (raised to its callers)
        await asyncio.shield(task)

    async def _close_all(self, give_up_s: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        until = math.inf if give_up_s is None else loop.time() + give_up_s
        await self._close_files()
        if self._file_closes:
            self._file_closes_ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._file_closes_ended.wait(), max(min(until - loop.time(), CLOSE_FILES_S), 0.1)
                )
        while self._closing:
            # closes going on in the background (their callers cancelled: a mount's at unmount),
            # which retry their flushes for as long as storage takes to come back; bounded where
            # asked (a mount stopped with the cluster down took 95 s, and systemd killed it)
            timeout = None if give_up_s is None else max(until - loop.time(), 0.1)
            _, left = await asyncio.wait(list(self._closing), timeout=timeout)
            if left and loop.time() >= until:
                lost = len(self._flushing_in_background)
                for task in left:
                    task.cancel()
                await asyncio.gather(*left, return_exceptions=True)
                if lost:
                    self.lost_closes += lost
                    log.error(
                        "gave up writing out files closed in the background after %.0f s: what they "
                        "had buffered is lost count=%d",
                        give_up_s,
                        lost,
                    )
                break
        if self._ending_again:  # one more try each, at once, then they are left to meta's expiry
            self._end_again_now.set()
            _, left = await asyncio.wait(list(self._ending_again), timeout=END_AGAIN_AT_CLOSE_S)
            for task in left:
                task.cancel()
            if left:
                log.warning(
                    "sessions left open on meta: their close did not reach it count=%d (meta "
                    "ends them once this client's session expires)",
                    len(left),
                )
            await asyncio.gather(*left, return_exceptions=True)
        if self._token_watch is not None:
            self._token_watch.cancel()
            await asyncio.gather(self._token_watch, return_exceptions=True)
        if self._session is not None:
            await self._session.stop()
        await self.meta.close()  # before the connections end: it would close sessions again
        if self._session is not None:
            await self._session.end()  # after meta closed what it could
        await self.routing.stop()
        await self.mgmtd.close()
        await self.rpc.close()
        self._closed = True

    async def _close_files(self) -> None:
        files = [f for f in {*self._files, *self._writers} if not f.closed]
        if not files:
            return
        closes = [asyncio.ensure_future(f.close()) for f in files]
        for task in closes:
            # kept where a close of this FileSystem cancelled meanwhile finds them: the next close
            # waits for them before the connections end (the Files count as closed already)
            self._closing.add(task)
            task.add_done_callback(self._file_closed)
        done, left = await asyncio.wait(closes, timeout=CLOSE_FILES_S)
        for task in left:
            task.cancel()
        failed = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
        if left or failed:
            log.warning(
                "files left open at close: %d closed, %d failed (%s), %d did not finish in %.0f s: "
                "what they wrote may be lost",
                len(done) - len(failed),
                len(failed),
                failed[0] if failed else "-",
                len(left),
                CLOSE_FILES_S,
            )
        await asyncio.gather(*left, return_exceptions=True)

    def _file_closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            # (_close_files reports it, unless its caller was cancelled before the close ended)
            log.debug("a file's close at the client's close failed: %s", e)

    async def __aenter__(self) -> FileSystem:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- paths ------------------------------------------------------------------------------------

    async def _lookup(self, path: str | bytes, follow: bool = True) -> m.Inode:
        p = _fspath(path)
        if not p:
            raise FS3Error(StatusCode.NOT_FOUND, "the empty path names nothing")  # as os does
        if not p.startswith(b"/"):
            p = b"/" + p
        return await self.meta.lookup_path(p, follow)

    async def _parent(
        self,
        path: str | bytes,
        existing: bool = True,
        root: StatusCode = StatusCode.ALREADY_EXISTS,
        dots: tuple[StatusCode, StatusCode] | None = None,
    ) -> tuple[int, bytes]:
        """The parent directory's inode id and the last name of ``path``. A trailing slash names
        a directory (Linux's rule): with ``existing`` (an unlink, rmdir, rename's source) what the
        path names must be one, not a symlink to one (ENOTDIR; ENOENT when it is missing).

        The root has no parent, and "." and ".." as the last name name a directory that exists:
        the call fails with ``root`` (for "." and ".." with ``dots`` when given), the code Linux's
        call answers (EEXIST to make it, EBUSY to rename it, EISDIR to unlink it; rmdir: EBUSY,
        EINVAL, ENOTEMPTY)."""
        p = _fspath(path)
        if p and not p.strip(b"/"):
            raise FS3Error(root, f"{quote_name(p)} is the root")
        parent, name, slash = _split(p)
        if name in (b".", b".."):
            await self._directory(parent)  # ENOENT, ENOTDIR there come first, as Linux's walk
            code = root if dots is None else dots[name == b".."]
            raise FS3Error(code, f"{quote_name(p)}: its last name is {name.decode()}")
        if slash and existing:
            await self._directory(p.rstrip(b"/"), follow=False)
        return (await self._lookup(parent)).id, name

    async def _directory(self, path: bytes, follow: bool = True) -> m.Inode:
        """The directory ``path`` names: ENOENT when missing, ENOTDIR when it is not one. With
        ``follow`` a symlink is followed, as a path walk through it is; without, a symlink to a
        directory is ENOTDIR too, as Linux's unlink, rmdir and rename take "name/"."""
        ino = await self._lookup(path, follow)
        if ino.type != m.INODE_DIRECTORY:
            raise FS3Error(StatusCode.META_NOT_DIRECTORY, f"{quote_name(path)}: not a directory")
        return ino

    # -- open files -------------------------------------------------------------------------------

    def _state(self, inode: m.Inode, since: int) -> InodeState:
        """The state of a file being opened; ``inode`` is meta's reply to the open, asked at
        ``since`` (a :func:`stamp`)."""
        st = self._states.get(inode.id)
        if st is None:
            st = self._states[inode.id] = InodeState(inode)
            if self.meta.handles is not None:
                self.meta.handles.pin(inode.id)  # its closes, syncs and renewals name it by id
        else:
            st.refresh(inode, since)
        return st

    def _handle(
        self, inode: m.Inode, session_id: int, flags: int, since: int, opened_at: float, queued: bool = False
    ) -> OpenFile:
        """A new handle of the file meta's open returned ``inode`` for: asked at ``since`` (a
        :func:`stamp`), sent at ``opened_at`` (a :func:`session_clock` time); ``queued``: meta
        answered before writing the session (``OpenRsp.session_queued``)."""
        h = OpenFile(
            self.storage,
            self._state(inode, since),
            session_id,
            writable=(flags & os.O_ACCMODE) != os.O_RDONLY,
            buffer_bytes=self.config.write_buffer_bytes,
            max_flushes=self.config.max_flushes_in_flight,
            scatter_bytes=self.config.write_scatter_bytes,
            budget=self._scatter_budget,
        )
        h.guard = self._guard
        h.recheck = self._recheck
        h.checked_at = opened_at
        h.unconfirmed = queued
        h.state.attach(h)
        return h

    async def _guard(self, h: OpenFile) -> None:
        """Before ``h`` sends a write to storage, or returns a hole it read: raise SESSION_LOST
        (EIO) if meta has ended its session. Meta ends the open-file sessions of a client that
        lost its session with mgmtd (paused, suspended, or cut off longer than the session
        timeout), settles their files' lengths and collects the unlinked ones: a write through the
        handle then would leave chunks of a collected file on storage for good, or bytes past a
        settled length that a later truncate-up would show; a hole could be a collected chunk.
        While mgmtd vouches for the session since the handle was opened (or last checked) nothing
        is asked; otherwise meta is (once at a time per handle), which touches the session, so
        meta keeps it another session timeout: half of that needs no check again. A handle whose
        session meta answered the open of before writing it (``unconfirmed``) asks meta once
        whatever mgmtd says: a meta process killed then lost it."""
        if not h.session_lost:
            keeper = self._session
            if not h.session_id:
                return
            vouched = keeper is None or keeper.vouches_for(h.checked_at) or session_clock() < h.meta_until
            if vouched and not h.unconfirmed:
                return
            if h.checking is None or h.checking.done():
                h.checking = asyncio.ensure_future(self._check_session(h, confirm=vouched))
            try:
                await asyncio.shield(h.checking)
            except FS3Error as e:  # one error for every caller waiting: each raises a copy
                raise fresh_error(e) from None
            if not h.session_lost:
                return
        raise _session_lost_error(h)

    async def _check_session(self, h: OpenFile, confirm: bool = False) -> None:
        """Ask meta whether ``h``'s session is still there (touching it, so it stays; with
        ``confirm``, mgmtd vouching for this client, only whether meta wrote the session it queued:
        nothing is written, and meta not answering leaves the handle as it was). A read-only
        handle whose session meta ended opens its file again (:meth:`_reopen`). A session being
        put again (its meta server lost, see ``QueuedSessions``) is asked for once that is done."""
        sent = session_clock()
        try:
            try:
                timeout = await self.meta.touch_session(h.inode_id, h.session_id, confirm=confirm)
            except FS3Error as e:
                if e.code != StatusCode.META_BAD_HANDLE or not await self.meta.restoring(
                    h.inode_id, h.session_id
                ):
                    raise
                timeout = await self.meta.touch_session(h.inode_id, h.session_id, confirm=confirm)
        except FS3Error as e:
            if e.code != StatusCode.META_BAD_HANDLE:
                if confirm:  # meta out of reach: mgmtd's word stands, as for any handle
                    log.info("inode %#x: could not ask meta about a queued session error=%s", h.inode_id, e)
                    return
                raise
            if h.writable or not await self._reopen(h):
                self._lose_session(h)
            else:
                h.checked_at = max(h.checked_at, sent)
        else:
            h.checked_at = max(h.checked_at, sent)
            if not confirm:
                h.meta_until = sent + timeout / 2 if timeout > 0 else math.inf
            h.unconfirmed = False  # in meta's store: the collector keeps the file while it is there
        finally:
            h.checking = None

    async def _reopen(self, h: OpenFile) -> bool:
        """Open the file of read-only handle ``h``, whose session meta ended, again: it reads on
        through the new session. A hole it read is a hole: the file was not being collected (meta
        refuses to open a file the collector has claimed, and removes chunks only after the claim;
        inode ids are never reused). False when the file is gone or this user may no longer read
        it: the handle's session is then lost (EIO). A writable handle is never reopened: what it
        wrote meanwhile may be past a length meta settled without it."""
        try:
            rsp = await self.meta.open(h.inode_id, os.O_RDONLY)
        except FS3Error as e:
            log.info("inode %#x: cannot open again a handle whose session meta ended error=%s", h.inode_id, e)
            return False
        old = h.session_id
        # a put of the old session being sent again (its server lost meanwhile) would leave it for
        # good: the put is waited for, and the session closed
        put_again = await self.meta.restoring(h.inode_id, old)
        self.meta.forget_session(h.inode_id, old)
        h.session_id = rsp.session_id
        h.unconfirmed = rsp.session_queued
        if put_again:
            with contextlib.suppress(FS3Error):
                await self.meta.close_file(h.inode_id, old)
        log.info(
            "inode %#x: meta had ended this read-only handle's session (this client was paused or "
            "cut off longer than its session timeout): opened the file again, it reads on",
            h.inode_id,
        )
        return True

    def _lose_session(self, h: OpenFile) -> None:
        if not h.session_lost:
            h.session_lost = True
            log.warning(
                "inode %#x: meta has ended this handle's session (this client was paused or cut off "
                "longer than its session timeout): it does no more I/O (EIO)",
                h.inode_id,
            )

    async def open(self, path: str | bytes, mode: str = "r", perm: int = 0o644) -> File:
        """Open (and with "w", "a", "x" create) a file; ``mode`` as Python's :func:`open` takes it."""
        flags = _flags_of(mode)
        return await self.open_flags(path, flags, perm)

    async def open_flags(self, path: str | bytes, flags: int, perm: int = 0o644) -> File:
        """Open with open(2) flags (O_CREAT, O_EXCL, O_TRUNC, O_APPEND, O_ACCMODE, O_NOFOLLOW:
        ELOOP for a symlink, O_DIRECTORY: ENOTDIR for a file, EISDIR for a directory, which
        this API does not open as a file; EINVAL with O_CREAT, as Linux 6.4 and later answer).
        A FIFO, socket or device node is not opened (EOPNOTSUPP): this API has no way to do what
        the kernel does for them (the mount does)."""
        p = _fspath(path)
        flags = _c_int("flags", flags)
        perm = _c_int("mode", perm) & 0o7777
        if flags & os.O_ACCMODE == os.O_ACCMODE:
            # Linux's "neither read nor write" (ioctl only) mode: what read and write answer EBADF,
            # taken here as read and write both
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{quote_name(p)}: access mode O_WRONLY|O_RDWR")
        since, opened_at = stamp(), session_clock()
        if flags & os.O_DIRECTORY:
            if flags & os.O_CREAT:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{quote_name(p)}: O_CREAT with O_DIRECTORY")
            await self._directory(p, follow=not flags & os.O_NOFOLLOW)  # ENOTDIR for no directory
            raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(p)} is a directory")
        nofollow = bool(flags & os.O_NOFOLLOW) and not p.endswith(b"/")  # "link/" follows it
        if flags & os.O_CREAT and p and (not p.strip(b"/") or _split(p)[1] in (b".", b"..")):
            # a directory that exists (the root, "d/.", "d/.."): EEXIST with O_EXCL, as Linux answers
            # (once the walk to it has not failed)
            if p.strip(b"/"):
                await self._directory(_split(p)[0])
            code = StatusCode.ALREADY_EXISTS if flags & os.O_EXCL else StatusCode.META_IS_DIRECTORY
            raise FS3Error(code, f"{quote_name(p)}: O_CREAT of a directory")
        if flags & os.O_CREAT and p.endswith(b"/"):
            # open(2): a name with a trailing slash is a directory, which O_CREAT cannot make; the
            # walk to its parent fails first where it fails (ENOENT, ENOTDIR), as the kernel's does
            if (await self._lookup(_split(p)[0])).type != m.INODE_DIRECTORY:
                raise FS3Error(
                    StatusCode.META_NOT_DIRECTORY, f"{quote_name(p)}: its parent is not a directory"
                )
            raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(p)}: O_CREAT of a directory name")
        if flags & os.O_CREAT:
            for _ in range(MAX_SYMLINK_FOLLOWS + 1):
                parent, name = await self._parent(p)
                if flags & os.O_TRUNC:
                    await self._drain_before_truncate(None, parent, name)
                rsp = await self.meta.create(
                    parent, name, perm, flags & (os.O_EXCL | os.O_TRUNC | 3), session=True
                )
                if rsp.inode.type != m.INODE_SYMLINK:
                    break
                if nofollow:
                    raise FS3Error(
                        StatusCode.META_TOO_MANY_SYMLINKS, f"{quote_name(p)} is a symlink (O_NOFOLLOW)"
                    )
                # As open(2) without O_NOFOLLOW: the link is followed, and a dangling one
                # creates its target (meta opens no session on a symlink; O_EXCL was EEXIST).
                target = rsp.inode.symlink_target or await self.meta.readlink(rsp.inode.id)
                p = target if target.startswith(b"/") else _split(p)[0].rstrip(b"/") + b"/" + target
            else:
                raise FS3Error(
                    StatusCode.META_TOO_MANY_SYMLINKS, f"{quote_name(_fspath(path))}: too many symlinks"
                )
            inode, session_id, queued = rsp.inode, rsp.session_id, False
        else:
            for attempt in range(_OPEN_ATTEMPTS):
                inode = await self._lookup(p, follow=not nofollow)
                if inode.type == m.INODE_SYMLINK:
                    raise FS3Error(
                        StatusCode.META_TOO_MANY_SYMLINKS, f"{quote_name(p)} is a symlink (O_NOFOLLOW)"
                    )
                if flags & os.O_TRUNC:
                    await self._drain_before_truncate(inode.id)
                try:
                    rsp = await self.meta.open(inode.id, flags & (os.O_TRUNC | 3))
                    break
                except FS3Error as e:
                    # Another client replaced (rename over it) or removed the file between the
                    # lookup and the open: the name is looked up again, as if the rename had
                    # come first (it is atomic: an open of an existing name never fails so).
                    if e.code != StatusCode.NOT_FOUND or attempt == _OPEN_ATTEMPTS - 1:
                        raise
            inode, session_id = rsp.inode, rsp.session_id
            queued = rsp.session_queued
        if inode.type != m.INODE_FILE:
            if session_id:
                await self.meta.close_file(inode.id, session_id)
            if inode.type == m.INODE_DIRECTORY:
                raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(p)} is a directory")
            # it opened as a file of no chains: writes taken were lost at close (EINVAL)
            raise FS3Error(
                StatusCode.META_NOT_SUPPORTED,
                f"{quote_name(p)} is a {_SPECIAL.get(inode.type, 'special file')}: the native API "
                "opens regular files only (a mount opens it as the kernel does)",
            )
        if flags & os.O_TRUNC:
            st = self._states.get(inode.id)
            if st is not None:
                st.truncated(0)
        f = File(self, self._handle(inode, session_id, flags, since, opened_at, queued), p, flags)
        f.bytes_name = isinstance(path, bytes)
        self._files.add(f)
        if flags & 3 != os.O_RDONLY:
            self._writers.add(f)
        if flags & os.O_APPEND:
            f.pos = f.size
        return f

    async def _recheck(self, h: OpenFile) -> None:
        """A read of ``h`` found a hole: take meta's length again (another client may have
        truncated the file; see ``OpenFile.read_into``). Meta not answering within RECHECK_S, or
        failing, leaves the length as it was and the hole reads as zeros, as before: meta's
        downtime must not fail reads of sparse files, and stalls one of them per RECHECK_QUIET_S
        and file at most."""
        state = h.state
        if time.monotonic() < state.recheck_quiet_until:
            return
        try:
            await asyncio.wait_for(self._refresh(h, settled=True), RECHECK_S)
            return
        except FS3Error as e:
            if e.code in (StatusCode.SESSION_LOST, StatusCode.NOT_FOUND):
                raise
            log.debug("length recheck failed inode=%d error=%s", h.inode_id, e)
        except TimeoutError:
            log.debug("length recheck: meta did not answer in %.1f s inode=%d", RECHECK_S, h.inode_id)
        state.recheck_quiet_until = time.monotonic() + RECHECK_QUIET_S

    async def _refresh(self, h: OpenFile, *, settled: bool = False) -> None:
        """Take meta's current view of ``h``'s file (its settled length; this client's unreported
        writes still count through the handles); ``settled`` as :meth:`stat_held` takes it."""
        since = stamp()
        h.state.refresh(await self.stat_held(h.inode_id, settled=settled), since)

    async def stat_held(self, inode_id: int, *, settled: bool = False) -> m.Inode:
        """Meta's inode ``inode_id``. Of a file this client holds open, NOT_FOUND means it was
        collected, which meta does only once it has ended the handles' sessions: SESSION_LOST.
        ``settled``: once the truncates of the file meta is making have ended (after a read found
        a hole: its chunks may be gone to a truncate not yet committed)."""
        try:
            return await self.meta.stat(inode_id, settled=settled)
        except FS3Error as e:
            st = self._states.get(inode_id)
            if e.code == StatusCode.NOT_FOUND and st is not None:
                for h in list(st.handles):
                    await self._guard(h)
            raise

    async def _sync(
        self, h: OpenFile, *, raise_errors: bool = True, only_dirty: bool = False
    ) -> m.Inode | None:
        """Flush a handle and report its written length to meta; meta's inode after (None when
        nothing was reported). With ``raise_errors`` (fsync, close), a flush error of the file
        this handle has not reported yet is raised, once the length is settled. ``only_dirty``:
        no meta call for a handle that wrote nothing since its last report."""
        error: Exception | None = None
        try:
            await h.flush_buffer(report=raise_errors)
        except Exception as e:
            error = e
        ino = None
        if h.writable and h.session_id and (h.dirty or not only_dirty):
            wrote = h.dirty
            # taken before the call: a write landing while it runs makes the handle dirty again
            length, failed = h.take_length() if wrote else (h.written_length, False)
            try:
                if h.session_lost:
                    raise _session_lost_error(h)
                # After a failed flush the report is made again at the next fsync or close, and the
                # caller hears the flush's error either way: it gets a few seconds, not meta's whole
                # deadline (meta asks storage for the length, which fails too while storage is
                # away: a flush failed after its 60 s of retries returned EIO ~30 s later)
                async with asyncio.timeout(FAILED_FLUSH_REPORT_S if error is not None else None):
                    ino = await self.meta.sync(
                        h.inode_id,
                        h.session_id,
                        length,
                        wrote=wrote,
                        mtime_ns=h.state.wrote_ns if wrote else 0,
                    )
            except BaseException as e:
                if not self._ended_by_meta(h, e, wrote):
                    if wrote:
                        h.untake_length(failed)
                    if error is not None and isinstance(e, Exception):
                        # the write-back error is the caller's to hear (it is heard once), not the
                        # report's (made again at the next fsync or close): after a failed flush
                        # meta asks storage for the length, which fails too while storage is away
                        raise error from None
                    raise
            else:
                h.state.install(ino)
                if wrote:
                    h.length_reported()
        if raise_errors and h.lost_writes:
            h.lost_writes = False
            error = error or _session_lost_error(h)
        if error is not None:
            raise error
        return ino

    def _ended_by_meta(self, h: OpenFile, e: BaseException, wrote: bool) -> bool:
        """Whether ``e``, raised by a report of ``h``'s length (``wrote``: of writes), says meta has
        ended its session. Then the report is over: what reached storage before counts (meta
        settled the length from storage), and unreported writes are an error for the handle's
        next fsync or close (``lost_writes``), whoever made this report."""
        if not isinstance(e, FS3Error):
            return False
        if e.code == StatusCode.META_BAD_HANDLE:
            self._lose_session(h)
        if not (h.session_lost and e.code in (StatusCode.META_BAD_HANDLE, StatusCode.SESSION_LOST)):
            return False
        if wrote:
            h.length_reported()
            h.lost_writes = True
        return True

    async def _close(self, h: OpenFile) -> m.Inode | None:
        """Flush a handle, end its session (reporting the written length); meta's inode after. A
        flush error of the file this handle has not reported yet is raised after the session ends.
        A caller cancelled while the flushes are pending leaves the close to finish in the
        background: the session outlives the flushes, or a file unlinked meanwhile would be
        collected before they land and their chunks would stay on storage for good."""
        error: Exception | None = None
        self._file_closes += 1
        try:
            try:
                await h.flush_buffer(report=h.writable)  # a reader's close reports no write error
            except asyncio.CancelledError:
                self._close_later(h)
                raise
            except Exception as e:
                error = e
            ino = await self._end_session(h)
        finally:
            self._file_closes -= 1
            if not self._file_closes:
                self._file_closes_ended.set()
        if error is not None:
            raise error
        return ino

    async def _end_session(self, h: OpenFile) -> m.Inode | None:
        """End a flushed handle's session, reporting its written length, and forget the handle."""
        # The handle's length counts for the file until meta's reply, which counts it, is
        # installed: an O_APPEND write on another handle must land after it.
        if h.checking is not None:  # a check may open the file again: close the session it gets
            with contextlib.suppress(Exception):
                await asyncio.shield(h.checking)
        try:
            if h.session_id:
                wrote = h.writable and h.dirty
                length = h.take_length()[0] if wrote else h.written_length
                try:
                    # (a session given up while it was being put again may be there after all:
                    # closed, as a put that comes after the close would leave it for good)
                    if h.session_lost and not await self.meta.restoring(h.inode_id, h.session_id):
                        raise _session_lost_error(h)
                    ino = await self.meta.close_file(
                        h.inode_id,
                        h.session_id,
                        length,
                        wrote=wrote,
                        mtime_ns=h.state.wrote_ns if wrote else 0,
                    )
                except FS3Error as e:
                    # meta ended the session: the close has nothing left to do but report
                    if not self._ended_by_meta(h, e, wrote):
                        if e.retryable or e.code == StatusCode.DEADLINE_EXCEEDED:
                            self._end_again(h.inode_id, h.session_id, length, wrote)
                        raise
                    if h.lost_writes:
                        raise _session_lost_error(h) from None
                    return None
                h.state.install(ino)
                if wrote:
                    h.length_reported()
                return ino
            return None
        finally:
            if h.session_id:  # (closed, or ended by meta: either way not to be put again)
                self.meta.forget_session(h.inode_id, h.session_id)
            h.state.detach(h)
            if not h.state.handles and self._states.get(h.inode_id) is h.state:
                del self._states[h.inode_id]
                if self.meta.handles is not None:
                    self.meta.handles.unpin(h.inode_id)

    def _end_again(self, inode_id: int, session_id: int, length: int, wrote: bool) -> None:
        """A close that meta did not answer (unreachable for the whole retry budget) is sent again
        in the background until meta answers it: the session would otherwise stay on meta for as
        long as this client lives, and with it every chunk of the file, should it be unlinked
        (the collector waits for the last session). The written length it reports is a hint meta
        checks against truncates since (meta.sessions), so a late one is safe."""
        task = asyncio.get_running_loop().create_task(self._close_again(inode_id, session_id, length, wrote))
        self._ending_again.add(task)
        task.add_done_callback(self._ending_again.discard)

    async def _close_again(self, inode_id: int, session_id: int, length: int, wrote: bool) -> None:
        delay = END_AGAIN_FIRST_S
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._end_again_now.wait()
            try:
                await self.meta.close_file(inode_id, session_id, length, wrote=wrote)
            except FS3Error as e:
                if e.retryable or e.code == StatusCode.DEADLINE_EXCEEDED:
                    delay = min(2 * delay, END_AGAIN_MAX_S)
                    continue
                if e.code not in (StatusCode.META_BAD_HANDLE, StatusCode.SESSION_LOST, StatusCode.NOT_FOUND):
                    log.warning(
                        "closing a session again failed inode=%#x session=%d error=%s",
                        inode_id,
                        session_id,
                        e,
                    )
                return  # (else the first close reached meta after all, or meta ended the session)
            log.info(
                "closed a session meta had not answered the close of inode=%#x session=%d",
                inode_id,
                session_id,
            )
            return

    def _dropped(self, h: OpenFile) -> None:
        """Close ``h``, whose File was collected unclosed (see _file_dropped)."""
        if not self._closed and h in h.state.handles:
            self._close_later(h)

    def _close_later(self, h: OpenFile) -> None:
        """Finish closing ``h`` in a task of its own, kept until it ends (:meth:`close` waits for it)."""
        task = asyncio.get_running_loop().create_task(self._close_in_background(h))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_in_background(self, h: OpenFile) -> None:
        """The rest of a close whose caller was cancelled: the handle stays open (its buffered bytes
        and length count for the file) until its flushes are done, then its session ends. Errors
        are logged; nobody is left to raise them to. Cancelled, it leaves the session open."""
        error: Exception | None = None
        if h.writable:
            self._flushing_in_background.add(h)
        try:
            await h.flush_buffer(report=h.writable)
        except Exception as e:
            error = e
            self.lost_closes += h.writable
        finally:
            self._flushing_in_background.discard(h)
        try:
            await self._end_session(h)
        except Exception as e:
            error = error or e
        if error is not None:
            log.warning("closing inode=%#x in the background failed error=%s", h.inode_id, error)

    async def _drain_before_truncate(self, inode_id: int | None, parent: int = 0, name: bytes = b"") -> None:
        """Before an open with O_TRUNC: this client's buffered writes to the file go to storage
        first, so none lands after the truncate and brings old bytes back. The file is named by
        id, or (for a create) by parent and name, looked up only when some file has buffered data."""
        if not any(not st.settled for st in self._states.values()):
            return
        if inode_id is None:
            try:
                inode_id = (await self.meta.lookup(parent, name)).id
            except FS3Error as e:
                if e.code == StatusCode.NOT_FOUND:
                    return
                raise
        st = self._states.get(inode_id)
        if st is not None:
            await st.drain()

    async def _truncate(self, state: InodeState, size: int, session_id: int = 0) -> m.Inode:
        await state.drain()
        # What this client wrote is reported first, as the mount does: a report after the
        # truncate would set the file's mtime back to that of the writes before it.
        for h in list(state.writers):
            await self._sync(h, raise_errors=False, only_dirty=True)  # a flush error is for fsync/close
        ino = await self.meta.setattr(state.inode.id, size=size, session_id=session_id)
        state.truncated(size)
        state.install(ino)
        return ino

    # -- batched I/O ------------------------------------------------------------------------------

    async def read_batch(self, requests: Sequence[tuple[File | str | bytes, int, int]]) -> list[bytes]:
        """Read many ``(file, offset, length)`` ranges at once -- open Files or paths -- as one
        batch served concurrently by every storage node (sample loading). Ranges are clamped to
        each file's length. A file this FileSystem has open reads as :meth:`File.pread` would,
        by path too: with its unflushed writes and the length they imply."""
        since = stamp()
        for f, offset, length in requests:
            if offset < 0 or length < 0:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative offset or length in {offset}+{length}")
            if isinstance(f, File):
                f._check_readable()
        paths = {_fspath(f) for f, _, _ in requests if not isinstance(f, File)}
        looked = await asyncio.gather(*(self._lookup(p) for p in paths))
        for p, ino in zip(paths, looked, strict=True):
            if ino.type == m.INODE_DIRECTORY:
                raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(p)} is a directory")
            if ino.type != m.INODE_FILE:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{quote_name(p)} is not a regular file")
        inodes: dict[bytes, m.Inode] = dict(zip(paths, looked, strict=True))
        # storage reads do not see what handles buffered: the open files' buffers go out first
        states: dict[int, InodeState] = {}
        for inode in looked:
            st = self._states.get(inode.id)
            if st is not None and st.handles:
                st.refresh(inode, since)
                states[inode.id] = st
        stale: dict[int, File] = {}
        for f, offset, length in requests:
            if isinstance(f, File):
                states.setdefault(f.inode_id, f.handle.state)
                if offset + length > f.handle.state.size:
                    stale.setdefault(f.inode_id, f)  # as pread: another client may have extended it
        await asyncio.gather(*(self._refresh(f.handle) for f in stale.values()))
        for st in states.values():
            await st.drain()
        pieces = []
        for f, offset, length in requests:
            st: InodeState | None
            if isinstance(f, File):
                st = f.handle.state
                ino = st.inode
            else:
                ino = inodes[_fspath(f)]
                st = states.get(ino.id)
            if st is not None:
                ino = m.Inode()
                ino.CopyFrom(st.inode)
                ino.size = st.size
            pieces.append((ino, offset, length))
        holes: list[bool] = []
        out = await read_many(self.storage, pieces, holes)
        # A range that found a hole is read again as a File's read is (see OpenFile.read_into):
        # the file may have been truncated (and rewritten) by another client since its length was
        # taken, and zeros that no version held must not come back inside the length. Meta is
        # asked once per file (not per range: a sparse file's thousand holes cost one question),
        # and only the ranges of files whose length or truncate count moved are read again, as
        # one batch, a bounded number of times.
        for _ in range(_BATCH_RECHECKS):
            again = [i for i, hole in enumerate(holes) if hole]
            if not again:
                break
            files = {pieces[i][0].id: pieces[i][0] for i in again}
            nows = await asyncio.gather(*(self._hole_recheck(ino) for ino in files.values()))
            moved = {ino.id: now for ino, now in zip(files.values(), nows, strict=True) if now is not None}
            redo = [i for i in again if pieces[i][0].id in moved]
            if not redo:
                break
            for i in redo:
                pieces[i] = (moved[pieces[i][0].id], pieces[i][1], pieces[i][2])
            redone_holes: list[bool] = []
            redone = await read_many(self.storage, [pieces[i] for i in redo], redone_holes)
            holes = [False] * len(pieces)
            for i, data, hole in zip(redo, redone, redone_holes, strict=True):
                out[i], holes[i] = data, hole
        return out

    async def _hole_recheck(self, ino: m.Inode) -> m.Inode | None:
        """After ranges of file ``ino`` (as read_batch took it) found holes: the file as meta has
        it now when its length or truncate count moved since (its ranges are read again with it),
        else None (the zeros are holes). Through this client's handle of the file when it has one
        (FileSystem._recheck: its length refreshed, this client's unreported writes counted);
        meta not answering within RECHECK_S, or failing, leaves the zeros, as a File's read does."""
        st = self._states.get(ino.id)
        handle = next(iter(st.handles), None) if st is not None else None
        if handle is not None and st is not None:
            await self._recheck(handle)
            now = m.Inode()
            now.CopyFrom(st.inode)
            now.size = st.size
        else:
            try:
                now = await asyncio.wait_for(self.meta.stat(ino.id, settled=True), RECHECK_S)
            except (FS3Error, TimeoutError) as e:
                log.debug("batch read: length recheck failed inode=%d error=%r", ino.id, e)
                return None
        if now.size == ino.size and now.truncate_version == ino.truncate_version:
            return None
        return now

    # -- namespace --------------------------------------------------------------------------------

    async def stat(self, path: str | bytes, follow_symlinks: bool = True) -> StatResult:
        """stat (or lstat) a path; an open writer's length in this client counts."""
        since = stamp()
        inode = await self._lookup(path, follow_symlinks)
        st = self._states.get(inode.id)
        if st is not None and st.handles:
            await st.drain()
            st.refresh(inode, since)  # meta's length, for this client's open handles too
            return StatResult.of(inode, st.size, st)
        return StatResult.of(inode)

    async def exists(self, path: str | bytes) -> bool:
        """Whether ``path`` names something (a symlink is followed), as os.path.exists answers:
        False for a path that cannot name anything ("file/x", a symlink loop, a name too long,
        a NUL byte) or that this user may not search. Errors of the cluster (meta unreachable)
        are raised, not taken for "missing"."""
        if b"\0" in os.fsencode(path):
            return False
        try:
            await self._lookup(path)
        except FS3Error as e:
            if e.code in _NAMES_NOTHING:
                return False
            raise
        return True

    async def scandir(self, path: str | bytes) -> AsyncIterator[m.DirEntry]:
        """The entries of a directory (name, inode id, type), page by page."""
        inode = await self._directory(_fspath(path))  # ENOTDIR naming the path, not an inode id
        async for e in self.meta.listdir(inode.id):
            yield e

    async def listdir(self, path: str | bytes = "/") -> list[str] | list[bytes]:
        """The names in a directory, sorted: bytes for a bytes path, as os.listdir gives."""
        if isinstance(path, bytes):
            return [e.name async for e in self.scandir(path)]
        return [os.fsdecode(e.name) async for e in self.scandir(path)]

    async def mkdir(self, path: str | bytes, mode: int = 0o755, *, parents: bool = False) -> None:
        """Make a directory (and its missing parents with ``parents``, ignoring existing ones)."""
        p = _fspath(path)
        mode = _c_int("mode", mode) & 0o7777
        if p and (not p.strip(b"/") or p.rstrip(b"/").rsplit(b"/", 1)[-1] in (b".", b"..")):
            # the root, or a name for a directory that exists already whatever it is: EEXIST, as
            # mkdir(2) says (makedirs goes on, as os.makedirs does)
            if parents:
                head = p.rstrip(b"/").rpartition(b"/")[0]  # "a/b" of "a/b/.."
                if head and not await self.exists(head):
                    await self.mkdir(head, mode, parents=True)
                if (await self._lookup(p)).type == m.INODE_DIRECTORY:
                    return
            elif p.strip(b"/"):
                await self._directory(p.rstrip(b"/").rpartition(b"/")[0] or b"/")  # ENOENT, ENOTDIR first
            raise FS3Error(StatusCode.ALREADY_EXISTS, f"{quote_name(p)} exists")
        if parents:
            parent, _, _ = _split(path)
            if parent != b"/" and not await self.exists(parent):
                await self.mkdir(parent, mode, parents=True)
        parent_id, name = await self._parent(path, existing=False)
        try:
            await self.meta.mkdir(parent_id, name, mode)
        except FS3Error as e:
            if not (parents and e.code == StatusCode.ALREADY_EXISTS):
                raise
            if (await self._lookup(path)).type != m.INODE_DIRECTORY:
                raise  # as mkdir -p: a file of that name is no directory to keep

    async def makedirs(self, path: str | bytes, mode: int = 0o755) -> None:
        await self.mkdir(path, mode, parents=True)

    async def rmdir(self, path: str | bytes, *, recursive: bool = False) -> None:
        """Remove an empty directory (or, with ``recursive``, a whole tree, collected later)."""
        parent, name = await self._parent(
            path, root=StatusCode.META_BUSY, dots=(StatusCode.INVALID_ARGUMENT, StatusCode.META_NOT_EMPTY)
        )
        await self.meta.rmdir(parent, name, recursive)

    async def unlink(self, path: str | bytes) -> None:
        parent, name = await self._parent(path, root=StatusCode.META_IS_DIRECTORY)
        await self.meta.unlink(parent, name)

    remove = unlink

    async def rename(
        self, src: str | bytes, dst: str | bytes, *, noreplace: bool = False, exchange: bool = False
    ) -> None:
        """Atomically rename ``src`` to ``dst`` (replacing a file or an empty directory); with
        ``exchange``, swap the two, which must both exist (renameat2's RENAME_EXCHANGE)."""
        d = _fspath(dst)
        if d.strip(b"/") and d.endswith(b"/") and not exchange:
            # "dst/": a directory (not a symlink to one) if it exists, and only a directory may
            # move there (a file onto an existing directory "d/" is ENOTDIR, as Linux answers)
            try:
                await self._directory(d.rstrip(b"/"), follow=False)
            except FS3Error as e:
                if e.code != StatusCode.NOT_FOUND:
                    raise
            await self._directory(_fspath(src).rstrip(b"/"), follow=False)
        (sp, sn), (dp, dn) = await asyncio.gather(
            self._parent(src, root=StatusCode.META_BUSY),
            # onto the root, "d/." or "d/..": with RENAME_NOREPLACE EEXIST, as Linux answers
            self._parent(
                dst, existing=exchange, root=StatusCode.ALREADY_EXISTS if noreplace else StatusCode.META_BUSY
            ),
        )
        await self.meta.rename(sp, sn, dp, dn, (1 if noreplace else 0) | (2 if exchange else 0))

    async def symlink(self, target: str | bytes, path: str | bytes) -> None:
        """Make ``path`` a symbolic link to ``target``."""
        parent, name = await self._parent(path)
        await self.meta.symlink(parent, name, _fspath(target))

    @overload
    async def readlink(self, path: str) -> str: ...
    @overload
    async def readlink(self, path: bytes) -> bytes: ...
    async def readlink(self, path: str | bytes) -> str | bytes:
        """The target of symlink ``path``: bytes for a bytes path, as os.readlink answers."""
        inode = await self._lookup(path, follow=False)
        target = await self.meta.readlink(inode.id)
        return target if isinstance(path, bytes) else os.fsdecode(target)

    async def link(self, src: str | bytes, dst: str | bytes) -> None:
        """Make ``dst`` a hard link to ``src``."""
        inode = await self._lookup(src, follow=False)
        parent, name = await self._parent(dst)
        await self.meta.link(inode.id, parent, name)

    async def mknod(self, path: str | bytes, mode: int, rdev: int = 0) -> None:
        """Make a FIFO, socket or device node (``mode`` with its type bits)."""
        mode = _c_int("mode", mode) & 0xFFFF
        rdev = operator.index(rdev)
        if not 0 <= rdev < 1 << 64:
            raise OverflowError(f"device {rdev} is out of range")
        parent, name = await self._parent(path)
        await self.meta.mknod(parent, name, mode, rdev)

    async def chmod(self, path: str | bytes, mode: int) -> None:
        mode = _c_int("mode", mode) & 0o7777
        await self.meta.setattr((await self._lookup(path)).id, mode=mode)

    async def chown(self, path: str | bytes, uid: int = -1, gid: int = -1) -> None:
        """As os.chown: -1 (or (uid_t)-1, 4294967295) leaves that id as it is."""
        fields = {}
        for what, value in (("uid", uid), ("gid", gid)):
            value = operator.index(value)
            if not -1 <= value <= _NO_ID:
                raise OverflowError(f"{what} {value} is out of range")
            if value not in (-1, _NO_ID):
                fields[what] = value
        await self.meta.setattr((await self._lookup(path)).id, **fields)

    async def utime(self, path: str | bytes, ns: tuple[int, int] | None = None) -> None:
        """Set (atime_ns, mtime_ns), or both to now when ``ns`` is None."""
        if ns is not None:
            if not isinstance(ns, tuple) or len(ns) != 2:
                raise TypeError("utime: 'ns' must be a tuple of two ints")
            ns = (_off_t("time", ns[0]), _off_t("time", ns[1]))
        inode = await self._lookup(path)
        if ns is None:
            await self.meta.setattr(inode.id, atime_ns=None, mtime_ns=None)
        else:
            await self.meta.setattr(inode.id, atime_ns=ns[0], mtime_ns=ns[1])

    async def truncate(self, path: str | bytes, size: int) -> None:
        """Cut or extend a file to ``size`` bytes; the cut-off data is gone, an extension reads as
        zeros."""
        size = _off_t("length", size)
        if size < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative length {size}")  # as truncate(2)
        inode = await self._lookup(path)
        st = self._states.get(inode.id)
        if st is not None:
            await self._truncate(st, size)
        else:
            await self.meta.setattr(inode.id, size=size)

    async def statfs(self) -> m.StatFsRsp:
        return await self.meta.statfs()

    async def set_layout(
        self, path: str | bytes, *, chunk_size: int = 0, stripe_count: int = 0, chain_table_id: int = 0
    ) -> m.Layout:
        """Set a directory's default layout for files created in it later (0 keeps a field)."""
        for what, value, bits in (
            ("chunk_size", chunk_size, 64),
            ("stripe_count", stripe_count, 32),
            ("chain_table_id", chain_table_id, 32),
        ):
            if not 0 <= operator.index(value) < 1 << bits:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{what} {value} is out of range")
        inode = await self._lookup(path)
        ino = await self.meta.set_layout(inode.id, chain_table_id, chunk_size, stripe_count)
        return ino.layout

    async def getxattr(self, path: str | bytes, name: str | bytes) -> bytes:
        return await self.meta.getxattr((await self._lookup(path)).id, _fspath(name))

    async def setxattr(self, path: str | bytes, name: str | bytes, value: bytes, flags: int = 0) -> None:
        """As os.setxattr: ``value`` any bytes-like object; ``flags`` 0, os.XATTR_CREATE or
        os.XATTR_REPLACE (EINVAL for other bits)."""
        value = bytes(memoryview(value))  # TypeError for None, a str
        flags = _c_int("flags", flags)
        if flags & ~(os.XATTR_CREATE | os.XATTR_REPLACE):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"setxattr flags {flags:#x}")
        await self.meta.setxattr((await self._lookup(path)).id, _fspath(name), value, flags)

    async def listxattr(self, path: str | bytes) -> list[str]:
        return [os.fsdecode(n) for n in await self.meta.listxattr((await self._lookup(path)).id)]

    async def removexattr(self, path: str | bytes, name: str | bytes) -> None:
        await self.meta.removexattr((await self._lookup(path)).id, _fspath(name))

    async def read_file(self, path: str | bytes) -> bytes:
        """The whole content of a file."""
        async with await self.open(path, "r") as f:
            return await f.read()

    async def write_file(self, path: str | bytes, data: bytes, perm: int = 0o644) -> None:
        """Create or replace the content of a file."""
        async with await self.open_flags(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, perm) as f:
            await f.write(data)


def meta_addresses(routing: Any) -> list[str]:
    """host:port of every active meta node in a routing snapshot."""
    out = []
    for node in routing.nodes_of_type(common_pb2.NODE_META):
        for ep in node.endpoints:
            if ep.transport in ("", "tcp"):
                out.append(format_address(ep.host, ep.port))
                break
    return sorted(out)


def __getattr__(name: str) -> Any:
    # the synchronous facade moved to fs3.client.sync_api (which imports this module); its names
    # are still found here
    if name in ("SyncFile", "SyncFileSystem"):
        from fs3.client import sync_api

        return getattr(sync_api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["File", "FileSystem", "StatResult", "ROOT_ID"]


#: lookups an open makes of a name other clients keep replacing (see open_flags)
_OPEN_ATTEMPTS = 8


def _session_lost_error(h: OpenFile) -> FS3Error:
    return FS3Error(
        StatusCode.SESSION_LOST,
        f"inode {h.inode_id:#x}: meta ended this handle's session (this client was paused or cut off "
        "longer than its session timeout); reopen the file",
    )
