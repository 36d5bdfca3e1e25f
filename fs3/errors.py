"""One family of errors for every fs3 service and both RPC stacks.

Services raise :class:`FS3Error` with a :class:`StatusCode`; the RPC layer (fs3 RPC and gRPC alike)
encodes the code and message on the wire; the client decodes them back into the same exception; the
FUSE mount turns the code into an errno through :data:`ERRNO`, the one table that does so.

The numeric values are part of the wire protocol and mirror ``enum StatusCode`` in
``proto/common.proto`` (a test checks that the two agree). Never renumber; only add.
"""

from __future__ import annotations

import copy
import enum
import errno as _errno
import io as _io
import os as _os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class StatusCode(enum.IntEnum):
    OK = 0

    # generic (0-99)
    UNKNOWN = 1
    INVALID_ARGUMENT = 2
    DEADLINE_EXCEEDED = 3
    NOT_FOUND = 4
    ALREADY_EXISTS = 5
    PERMISSION_DENIED = 6
    UNAUTHENTICATED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNAVAILABLE = 11
    INTERNAL = 12
    NOT_IMPLEMENTED = 13
    CANCELLED = 14
    CONFIG_INVALID = 15
    # a handle opened before this client's session with the cluster was lost (the process was
    # paused or cut off longer than the session timeout, and meta ended the handle's session):
    # it can do no more I/O; reopen the file
    SESSION_LOST = 16

    # fs3 RPC framework (100-199)
    RPC_MALFORMED_FRAME = 100
    RPC_UNKNOWN_SERVICE = 101
    RPC_UNKNOWN_METHOD = 102
    RPC_BAD_MESSAGE = 103
    RPC_CONNECTION_CLOSED = 104
    RPC_FRAME_TOO_LARGE = 105
    RPC_AUTH_FAILED = 106
    RPC_CONNECT_FAILED = 107

    # transactional KV store (200-299)
    KV_CONFLICT = 200
    KV_KEY_TOO_LARGE = 201
    KV_VALUE_TOO_LARGE = 202
    KV_TXN_TOO_LARGE = 203
    KV_RETRY_LIMIT = 204
    KV_TXN_CLOSED = 205
    KV_STORE_FAILED = 206
    KV_STORE_FULL = 207

    # metadata / POSIX namespace (300-399)
    META_NOT_DIRECTORY = 300
    META_IS_DIRECTORY = 301
    META_NOT_EMPTY = 302
    META_NAME_TOO_LONG = 303
    META_INVALID_NAME = 304
    META_TOO_MANY_SYMLINKS = 305
    META_TOO_MANY_LINKS = 306
    META_NOT_PERMITTED = 307
    META_BAD_HANDLE = 308
    META_NO_XATTR = 309
    META_XATTR_RANGE = 310
    META_CROSS_DEVICE = 311
    META_FILE_TOO_LARGE = 312
    META_BUSY = 313
    META_READ_ONLY = 314
    META_NOT_SUPPORTED = 315
    META_TOO_BIG = 316
    META_STALE = 317  # the directory a request named by inode is gone (its name may be another's now)
    META_NO_SUCH_DEVICE = 318

    # cluster manager (400-499)
    MGMTD_NOT_PRIMARY = 400
    MGMTD_UNKNOWN_NODE = 401
    MGMTD_NODE_DISABLED = 402
    MGMTD_STALE_HEARTBEAT = 403
    MGMTD_UNKNOWN_TARGET = 404
    MGMTD_UNKNOWN_CHAIN = 405
    MGMTD_INVALID_CHAIN = 406
    MGMTD_UNKNOWN_CHAIN_TABLE = 407
    MGMTD_NOT_INITIALIZED = 408
    MGMTD_LEASE_LOST = 409

    # storage / CRAQ (500-599)
    STORAGE_CHAIN_VERSION_MISMATCH = 500
    STORAGE_NOT_HEAD = 501
    STORAGE_TARGET_NOT_SERVING = 502
    STORAGE_TARGET_OFFLINE = 503
    STORAGE_CHUNK_NOT_FOUND = 504
    STORAGE_CHECKSUM_MISMATCH = 505
    STORAGE_NO_SPACE = 506
    STORAGE_IO_ERROR = 507
    STORAGE_ROUTING_STALE = 508
    STORAGE_CHUNK_TOO_LARGE = 509
    STORAGE_CHUNK_VERSION_MISMATCH = 510
    # a write refused before any replica kept it: a target keeps its free space (keep_free)
    STORAGE_SPACE_KEPT = 511
    # a user connection's read or write without a valid capability (fs3.capability) for the file
    STORAGE_CAPABILITY = 512


# The one table from status code to errno. Anything not listed maps to EIO.
#
# Transient codes (UNAVAILABLE, ABORTED, KV_CONFLICT, KV_RETRY_LIMIT, CANCELLED, and a connection
# refused or lost) reach a POSIX caller only once the client's own retries have run out, so they
# are EIO, like any other failed I/O on a file system (not "Connection refused" from a stat). Not EAGAIN: on a blocking file that means "no data yet" (Python's FileIO.readall() takes it as
# the end and returns what it has, silently short), and not EINTR: no signal interrupted anything,
# and Python (PEP 475) re-issues a call that fails with it, for ever if the cause persists.
ERRNO: dict[StatusCode, int] = {
    StatusCode.OK: 0,
    StatusCode.INVALID_ARGUMENT: _errno.EINVAL,
    StatusCode.DEADLINE_EXCEEDED: _errno.ETIMEDOUT,
    StatusCode.NOT_FOUND: _errno.ENOENT,
    StatusCode.ALREADY_EXISTS: _errno.EEXIST,
    StatusCode.PERMISSION_DENIED: _errno.EACCES,
    StatusCode.UNAUTHENTICATED: _errno.EACCES,
    StatusCode.RESOURCE_EXHAUSTED: _errno.ENOSPC,
    StatusCode.FAILED_PRECONDITION: _errno.EINVAL,
    StatusCode.ABORTED: _errno.EIO,
    StatusCode.UNAVAILABLE: _errno.EIO,
    StatusCode.NOT_IMPLEMENTED: _errno.ENOSYS,
    StatusCode.CANCELLED: _errno.EIO,
    StatusCode.CONFIG_INVALID: _errno.EINVAL,
    StatusCode.SESSION_LOST: _errno.EIO,
    StatusCode.RPC_CONNECTION_CLOSED: _errno.EIO,
    StatusCode.RPC_FRAME_TOO_LARGE: _errno.EMSGSIZE,
    StatusCode.RPC_AUTH_FAILED: _errno.EACCES,
    StatusCode.RPC_CONNECT_FAILED: _errno.EIO,
    StatusCode.KV_CONFLICT: _errno.EIO,
    StatusCode.KV_KEY_TOO_LARGE: _errno.ENAMETOOLONG,
    StatusCode.KV_VALUE_TOO_LARGE: _errno.E2BIG,
    StatusCode.KV_TXN_TOO_LARGE: _errno.E2BIG,
    StatusCode.KV_RETRY_LIMIT: _errno.EIO,
    StatusCode.KV_STORE_FULL: _errno.ENOSPC,
    StatusCode.META_NOT_DIRECTORY: _errno.ENOTDIR,
    StatusCode.META_IS_DIRECTORY: _errno.EISDIR,
    StatusCode.META_NOT_EMPTY: _errno.ENOTEMPTY,
    StatusCode.META_NAME_TOO_LONG: _errno.ENAMETOOLONG,
    StatusCode.META_INVALID_NAME: _errno.EINVAL,
    StatusCode.META_TOO_MANY_SYMLINKS: _errno.ELOOP,
    StatusCode.META_TOO_MANY_LINKS: _errno.EMLINK,
    StatusCode.META_NOT_PERMITTED: _errno.EPERM,
    StatusCode.META_BAD_HANDLE: _errno.EBADF,
    StatusCode.META_NO_XATTR: _errno.ENODATA,
    StatusCode.META_XATTR_RANGE: _errno.ERANGE,
    StatusCode.META_CROSS_DEVICE: _errno.EXDEV,
    StatusCode.META_FILE_TOO_LARGE: _errno.EFBIG,
    StatusCode.META_BUSY: _errno.EBUSY,
    StatusCode.META_READ_ONLY: _errno.EROFS,
    StatusCode.META_NOT_SUPPORTED: _errno.EOPNOTSUPP,
    StatusCode.META_TOO_BIG: _errno.E2BIG,
    StatusCode.META_STALE: _errno.ESTALE,
    StatusCode.META_NO_SUCH_DEVICE: _errno.ENXIO,
    StatusCode.STORAGE_NO_SPACE: _errno.ENOSPC,
    StatusCode.STORAGE_SPACE_KEPT: _errno.ENOSPC,
    StatusCode.STORAGE_CAPABILITY: _errno.EACCES,
    StatusCode.STORAGE_CHUNK_TOO_LARGE: _errno.EFBIG,
}


def to_errno(code: int) -> int:
    """The errno a POSIX caller sees for a status code (EIO for anything without a closer match)."""
    try:
        return ERRNO.get(StatusCode(code), _errno.EIO)
    except ValueError:
        return _errno.EIO


# Codes a client may retry after backing off (and, for routing codes, refreshing routing info).
RETRYABLE: frozenset[StatusCode] = frozenset(
    {
        StatusCode.UNAVAILABLE,
        StatusCode.ABORTED,
        StatusCode.RPC_CONNECTION_CLOSED,
        StatusCode.RPC_CONNECT_FAILED,
        StatusCode.KV_CONFLICT,
        StatusCode.MGMTD_NOT_PRIMARY,
        StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
        StatusCode.STORAGE_NOT_HEAD,
        StatusCode.STORAGE_TARGET_NOT_SERVING,
        StatusCode.STORAGE_TARGET_OFFLINE,
        StatusCode.STORAGE_ROUTING_STALE,
    }
)


class FS3Error(Exception):
    """An error with a status code that crosses process boundaries unchanged.

    ``code`` is a :class:`StatusCode` (an unknown number from a newer peer decodes to UNKNOWN, with
    the number kept in the message); ``message`` is for people and logs.
    """

    def __init__(self, code: int, message: str = "") -> None:
        try:
            sc = StatusCode(code)
        except ValueError:
            sc = StatusCode.UNKNOWN
            message = f"status {code}: {message}"
        self.code: StatusCode = sc
        self.message: str = message
        super().__init__(f"{sc.name}: {message}" if message else sc.name)

    @property
    def errno(self) -> int:
        return to_errno(self.code)

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE

    def __reduce__(self):  # keep the code (and an OSError flavour's file names) when pickled
        names = {k: v for k in ("filename", "filename2") if (v := getattr(self, k, None)) is not None}
        return (type(self), (int(self.code), self.message), names or None)

    def __str__(self) -> str:
        # "CODE: message", also for the OSError flavours (os_flavoured): OSError's own would make
        # "[Errno None] ..." of one given a filename
        return Exception.__str__(self)


# The native Python API (SyncFileSystem, SyncFile, SyncKVCache) raises its errors as these: each is
# an FS3Error and also the OSError subclass Python itself raises for the same errno, so that
# ``except FileNotFoundError`` (or ``except OSError``) catches a missing file as it does with
# ``open()``. Only at that boundary: inside the services an OSError means a failed system call (a
# socket, a disk), and an FS3Error from a peer must not be caught as one.
def _os_flavour(base: type[OSError]) -> type[FS3Error]:
    name = "FS3" + base.__name__  # FS3OSError, FS3FileNotFoundError, ...

    def __init__(self: FS3Error, code: int, message: str = "") -> None:
        FS3Error.__init__(self, code, message)
        self.strerror = _os.strerror(self.errno)  # type: ignore[misc]

    cls = type(name, (FS3Error, base), {"__init__": __init__, "__module__": __name__, "__qualname__": name})
    globals()[name] = cls  # importable by name, so that pickling keeps the class
    return cls


_OS_FLAVOURS: dict[type[OSError], type[FS3Error]] = {}


class FS3ValueError(FS3Error, ValueError):
    """A misuse of an open file that Python's own file objects refuse with ValueError (an
    operation on a closed file, a bad whence, a negative read length other than -1), so that
    code written for local files catches it as it would theirs; still an FS3Error with its code."""


class FS3UnsupportedOperation(FS3Error, _io.UnsupportedOperation):
    """An operation the file's open mode does not allow (a write to a file opened for reading, a
    read of one opened only for writing): io.UnsupportedOperation, as Python's files raise it
    (an OSError and a ValueError), and an FS3Error with its code."""

    def __init__(self, code: int, message: str = "") -> None:
        FS3Error.__init__(self, code, message)
        self.strerror = _os.strerror(self.errno)  # type: ignore[misc]


def os_flavoured(error: FS3Error) -> FS3Error:
    """``error`` as an instance of the OSError subclass its errno selects (FileNotFoundError for
    ENOENT, PermissionError for EACCES, plain OSError for EIO) that is still an FS3Error with the
    same code and message; ``error`` itself when it already is one."""
    if isinstance(error, OSError | ValueError):  # already Python's own kind (FS3ValueError too)
        return error
    base = type(OSError(error.errno, ""))
    cls = _OS_FLAVOURS.get(base)
    if cls is None:
        cls = _OS_FLAVOURS[base] = _os_flavour(base)
    return cls(error.code, error.message)


def call_os_flavoured(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """``fn(*args, **kw)``, an FS3Error it raises coming out as :func:`os_flavoured` makes it (with
    the same traceback): how the native synchronous API calls whatever may fail."""
    try:
        return fn(*args, **kw)
    except FS3Error as e:
        raise os_flavoured(e).with_traceback(e.__traceback__) from None


for _base in (
    OSError,
    BlockingIOError,
    ChildProcessError,
    ConnectionError,
    BrokenPipeError,
    ConnectionAbortedError,
    ConnectionRefusedError,
    ConnectionResetError,
    FileExistsError,
    FileNotFoundError,
    InterruptedError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ProcessLookupError,
    TimeoutError,
):
    _OS_FLAVOURS[_base] = _os_flavour(_base)
del _base


def fresh_error(error: BaseException) -> BaseException:
    """A new exception saying what ``error`` says, with no traceback, cause or context: to raise an
    error that is kept somewhere (recorded for a later caller, shared by several waiters). Raising
    the kept one itself would give it the raising frames as its traceback (each raise adds more),
    and with them whatever they hold, for as long as it is kept; and a frame holding the kept
    error would be a reference cycle."""
    try:
        fresh = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception class that cannot be remade from its args
        if not isinstance(error, FS3Error):
            raise
        fresh = FS3Error(error.code, error.message)
    fresh.__traceback__ = fresh.__cause__ = fresh.__context__ = None
    return fresh


def cut_middle(message: str, limit: int) -> str:
    """``message`` as text of at most ``limit`` bytes of UTF-8, for an error sent to another process:
    a character UTF-8 cannot carry (a lone surrogate, left by bytes that were not UTF-8) shows as a
    backslash escape, and a longer message is cut in the middle, where a quoted input would be (the
    reason comes after it), saying how many bytes were cut. ``limit`` is at least 128."""
    raw = message.encode("utf-8", errors="backslashreplace")
    if len(raw) <= limit:
        return raw.decode()
    keep = (limit - 64) // 2
    head, tail = raw[:keep].decode(errors="ignore"), raw[-keep:].decode(errors="ignore")
    return f"{head} ...({len(raw) - 2 * keep} bytes cut)... {tail}"


def quote_name(name: bytes, limit: int = 64) -> str:
    """A file, path or xattr name as an error message shows it: text in single quotes, not a bytes
    repr. A byte that is not UTF-8, an unprintable character and a backslash show as backslash
    escapes (``\\xe9``, ``\\n``, ``\\\\``), so the text names exactly one byte string; a name longer
    than ``limit`` bytes is cut there and ends in "...".
    """
    text = shown_name(name[:limit])
    return f"'{text}...'" if len(name) > limit else f"'{text}'"


def shown_name(name: bytes) -> str:
    """A name as text that names exactly one byte string, whole and unquoted, escaped as
    :func:`quote_name` escapes it (a listing's column: ``\\n``, not a line break; ``\\xe9``, not U+FFFD)."""
    return "".join(map(_shown_char, name.decode("utf-8", errors="surrogateescape")))


def _shown_char(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if "\udc80" <= c <= "\udcff":  # a byte surrogateescape could not decode
        return f"\\x{ord(c) - 0xDC00:02x}"
    return c if c.isprintable() else c.encode("unicode_escape").decode("ascii")


# gRPC status codes for the mgmtd stack; the exact fs3 code travels in trailing metadata.
GRPC_METADATA_KEY = "fs3-status"


def grpc_code_name(code: StatusCode) -> str:
    """Name of the closest grpc.StatusCode member, for grpc.aio servers aborting with an FS3Error."""
    table = {
        StatusCode.OK: "OK",
        StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
        StatusCode.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
        StatusCode.NOT_FOUND: "NOT_FOUND",
        StatusCode.ALREADY_EXISTS: "ALREADY_EXISTS",
        StatusCode.PERMISSION_DENIED: "PERMISSION_DENIED",
        StatusCode.UNAUTHENTICATED: "UNAUTHENTICATED",
        StatusCode.RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
        StatusCode.FAILED_PRECONDITION: "FAILED_PRECONDITION",
        StatusCode.ABORTED: "ABORTED",
        StatusCode.UNAVAILABLE: "UNAVAILABLE",
        StatusCode.NOT_IMPLEMENTED: "UNIMPLEMENTED",
        StatusCode.CANCELLED: "CANCELLED",
        StatusCode.MGMTD_NOT_PRIMARY: "UNAVAILABLE",
    }
    if code in table:
        return table[code]
    if 400 <= code < 500:
        return "FAILED_PRECONDITION"
    return "UNKNOWN"
