"""The FUSE operations of ``fs3 mount``: each pyfuse3 request translated to the native client
(:mod:`fs3.client.filesystem`) and back. Imported only by :mod:`fs3.client.mount`.

- FUSE inode numbers are fs3 inode ids (the root is 1 in both). Only a mount on a non-root
  user's token counts lookups: it keeps the handle of each inode the kernel holds (meta asks for
  it whenever a request names the inode by id, :mod:`fs3.meta.handles`) until ``forget``.
- Every request acts as the caller: uid, gid and supplementary groups of the calling process go to
  meta with the mount's token (a root token acts for any local user). The kernel checks permissions
  too (``default_permissions``), from attributes cached for ``attr_timeout_s``.
- Reads go through the kernel page cache; an open keeps the cached pages (``keep_cache``) when the
  file's mtime and length are what this mount last saw, and drops them otherwise. ``direct_io``
  (config, or O_DIRECT) bypasses the cache.
- Writes go to a write buffer per open file (:class:`fs3.client.file.OpenFile`), flushed when full,
  on a non-contiguous write, on read, truncate, fsync, flush (each close(2)) and getattr; flush and
  fsync also report the written length to meta, so once close(2) returns every client sees the
  length. getattr reports the length this mount's writers have written.
- A file's length is meta's, taken from every inode meta returns (getattr, lookup, listings,
  setattr) into the file's open state, which reads are clamped to; this mount's writers extend it
  by what meta has not counted yet. So a descriptor kept open follows other clients' appends and
  truncates as the kernel asks for attributes (``tail -f``).
- Directory listings are read from meta as the kernel asks for them, with the inodes: the kernel
  takes each listed entry as a lookup (READDIRPLUS), so a listing must be as current as one
  (:class:`OpenDir`).
- Errors: FS3Error codes become errno through :func:`fs3.errors.to_errno`, the one table.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import logging
import os
import signal
import stat as stat_mod
import sys
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, TypeVar

import pyfuse3
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from fs3 import metrics
from fs3.client.file import InodeState, OpenFile, stamp
from fs3.client.filesystem import BLOCK_SIZE, FileSystem, mode_of
from fs3.client.meta_client import MetaClient
from fs3.client.mgmtd_client import session_clock
from fs3.config import ClientConfig
from fs3.errors import FS3Error, StatusCode, to_errno
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

_USER_XATTR = b"user."
_GROUPS_TTL_S = 2.0
# meta's refusals that a caller's changed groups may have made (see Fs3Operations._groups_changed)
_DENIED = frozenset({StatusCode.PERMISSION_DENIED, StatusCode.META_NOT_PERMITTED})
_NOW_SLACK_NS = 1_000_000_000


def _cache_mark(ino: m.Inode) -> tuple[int, int, int]:
    """What an open compares with the last open's to keep the file's cached pages: ctime too,
    which every change of the content moves (a same-size rewrite that set the old mtime back,
    as tar and rsync -t do, keeps mtime and size)."""
    return (ino.mtime_ns, ino.ctime_ns, ino.size)


class FuseMetrics:
    """Requests, errors and latency per FUSE operation, and bytes moved (``fs3_fuse_*``).

    A collector over plain counters, read when Prometheus scrapes: a request costs a few integer
    additions here instead of the locked counter and histogram updates of prometheus_client."""

    def __init__(self, reg: Any = None, storage: Any = None) -> None:
        self._ops: dict[str, list[Any]] = {}  # op -> [requests, seconds, per-bucket counts]
        self._errors: dict[tuple[str, str], int] = {}
        self.read_bytes = 0
        self.write_bytes = 0
        self.dir_attrs_kept = 0  # directory GETATTRs answered from Fs3Operations._dir_attrs
        self.remembered: Callable[[], int] = lambda: 0  # inodes the mount keeps something of
        self.storage = storage  # the StorageClient, for its read batch counters
        (reg or metrics.registry()).register(self)

    def op(self, name: str) -> list[Any]:
        stats = self._ops.get(name)
        if stats is None:
            stats = self._ops[name] = [0, 0.0, [0] * (len(metrics.LATENCY_BUCKETS) + 1)]
        return stats

    def error(self, op: str, code: int) -> None:
        key = (op, errno.errorcode.get(code, str(code)))
        self._errors[key] = self._errors.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("fs3_fuse_requests_total", "FUSE requests by operation", labels=["op"])
        seconds = HistogramMetricFamily("fs3_fuse_request_seconds", "FUSE request latency", labels=["op"])
        for op, (count, total, buckets) in list(self._ops.items()):
            requests.add_metric([op], count)
            seconds.add_metric([op], metrics.latency_buckets(buckets), total)
        errors = CounterMetricFamily(
            "fs3_fuse_errors_total", "FUSE requests answered with an error", labels=["op", "errno"]
        )
        for (op, name), n in list(self._errors.items()):
            errors.add_metric([op, name], n)
        yield requests
        yield errors
        yield seconds
        yield CounterMetricFamily("fs3_fuse_read_bytes_total", "bytes returned by read", self.read_bytes)
        yield CounterMetricFamily("fs3_fuse_write_bytes_total", "bytes accepted by write", self.write_bytes)
        yield GaugeMetricFamily(
            "fs3_fuse_inodes_remembered",
            "inodes the mount keeps a page-cache mark or directory attributes of (until the kernel forgets them)",
            self.remembered(),
        )
        yield CounterMetricFamily(
            "fs3_fuse_dir_attrs_kept_total",
            "GETATTRs of a directory answered with meta's answer kept since (after this mount's creates)",
            self.dir_attrs_kept,
        )
        if self.storage is not None:
            yield CounterMetricFamily(
                "fs3_client_read_batches_total",
                "batches of small reads sent together (read_coalesce_turns)",
                self.storage.batches,
            )
            yield CounterMetricFamily(
                "fs3_client_batched_reads_total", "reads sent in those batches", self.storage.batched_reads
            )
            retries = CounterMetricFamily(
                "fs3_client_storage_retries_total",
                "storage calls that failed and were tried again (another replica, new routing), by error",
                labels=["op", "code"],
            )
            for (op, code), n in list(self.storage.retries.items()):
                retries.add_metric([op, code], n)
            yield retries


_BUCKETS = metrics.LATENCY_BUCKETS
# How long the closes of the files still open at unmount may take together (Fs3Operations.close_all)
UNMOUNT_CLOSE_WAIT_S = 5.0
# Requests that only read: once the FUSE session is over (unmounted, or the mount told to stop),
# one still waiting (on storage that does not answer, say) is ended (Fs3Operations.abandon_reads)
# rather than waited for; nothing is lost. Opens are not among them (one makes a session at meta),
# nor anything that changes a file or the namespace.
_ABANDONABLE = frozenset(
    {"lookup", "getattr", "read", "readdir", "opendir", "readlink", "statfs", "getxattr", "listxattr"}
)

# Requests whose caller may be stopped while they wait: once one has waited INTERRUPT_AFTER_S, the
# caller is looked at every INTERRUPT_CHECK_S and the request is ended with EINTR if the caller is
# being killed (SIGKILL pending: kill -9, or a signal whose default action kills and that it does
# not catch, such as Ctrl-C of dd or cat), or, for a request that names its caller (a stat, a
# lookup), if a signal asking it to stop that it catches is pending and not blocked (_STOPPING:
# SIGINT, SIGTERM, SIGQUIT; Python raises KeyboardInterrupt; not SIGHUP, which daemons catch to
# reload). The kernel waits for a request this mount has taken without letting the caller go
# (pyfuse3 passes on no FUSE_INTERRUPT): a read waiting on storage that does not answer held a
# killed process for the client's whole retry budget (60 s). Only what reads, and fsync and flush
# (their buffered writes go on in the background and are flushed at release): ending anything else
# half done would leave this mount's view of a change meta may have made.
_INTERRUPTIBLE = _ABANDONABLE | {"fsync", "flush"}
# pyfuse3 gives these no request context: the caller is taken to be the handle's opener, and only
# a kill ends them (a child that inherited the descriptor may be the caller instead, and must not
# get EINTR for a signal its parent handles; nor may a program that goes on see an fsync or a
# close fail for a signal it handles)
_BY_HANDLE = frozenset({"read", "readdir", "fsync", "flush"})
INTERRUPT_AFTER_S = 1.0
INTERRUPT_CHECK_S = 0.5
_STOPPING = sum(1 << (s - 1) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT))
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _pending(pid: int) -> tuple[bool, bool]:
    """Whether process (or thread) ``pid`` is being killed (SIGKILL pending: the kernel marks every
    thread of a process being killed so), and whether a signal of _STOPPING is pending that it
    does not block (its handler waits for the system call's end). A pid that is gone has neither
    (a handle's opener may have exited while a child it forked reads on)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return False, False
    pending = blocked = 0
    for line in status.splitlines():
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            pending |= int(line.split()[1], 16)
        elif line.startswith(b"SigBlk:"):
            blocked = int(line.split()[1], 16)
    return bool(pending & _SIGKILL_BIT), bool(pending & ~blocked & _STOPPING)


_DIR_ATTRS_MAX = 4096  # directories whose attributes a mount keeps (Fs3Operations._dir_attrs)
# names of directories a mount last gave the kernel (Fs3Operations._dir_names): beyond, the oldest
# go (a rename onto one then says nothing of what it replaces, as before)
_DIR_NAMES_MAX = 65536
RENAME_EXCHANGE = 2  # renameat2's flag, as the kernel passes it on
_DOTS = 2  # "." and ".." open a listing (offsets 1 and 2 resume after them)
_READDIR_PAGE = 64  # entries asked of meta for a handle's first READDIR (doubled until one is full)
_READDIR_PAGE_MAX = 1024


def _stale(error: FS3Error) -> Exception:
    """The error for a request naming an inode (the kernel's handle) that meta no longer has:
    ESTALE, which makes the kernel look the path up again (LOOKUP_REVAL) and act on what the name
    is now. Names replaced by another client (a symlink swapped by rename, the usual release
    switch; a directory replaced) were ENOENT for up to entry_timeout_s although they existed."""
    if error.code == StatusCode.NOT_FOUND:
        return pyfuse3.FUSEError(errno.ESTALE)
    return error


@dataclass(slots=True)
class OpenDir:
    """A directory handle: a cursor into the directory, not a copy of it.

    pyfuse3 answers every READDIR as READDIRPLUS, and the kernel links each listed name to the
    listed inode and takes the listed attributes (until entry_timeout / attr_timeout), replacing
    what it knew. So the entries are read from meta, with their inodes, when the kernel asks for
    them: a listing replayed from opendir would bring back names removed since, inodes replaced by
    a rename, and lengths written since. An offset given to the kernel stands for a name, and a
    READDIR at it resumes after that name in meta's name order: entries created or removed
    meanwhile never make another be listed twice or skipped. Offset 0 (the first READDIR, or
    rewinddir) starts a new listing of the directory as it is then."""

    # The mount's own identity, not the caller's: the kernel checked read permission at opendir
    # (default_permissions), and as on a local file system a chmod after that does not end the
    # listing (meta checks every page it is asked for; as the caller, EACCES came mid-listing).
    meta: MetaClient
    inode: int
    dots: tuple[tuple[bytes, m.Inode], tuple[bytes, m.Inode]]
    cookies: DirCookies  # the directory's, shared by its handles
    page: int = _READDIR_PAGE  # entries to ask meta for per READDIR
    filled: bool = False  # a READDIR reply was full: page is what it held
    end: int = -1  # meta had no entry after this offset: a READDIR at it is the end; -1: none


@dataclass(slots=True)
class DirCookies:
    """The offsets the mount gave out for one directory's names, shared by every handle of it
    and kept a while after the last one closes (``_IDLE_DIR_COOKIES``): a position told by one
    open directory resumes on another, as on a local file system (a handle's own offsets made
    another's telldir read as the end, silently: knfsd, re-exporting the mount, reopens the
    directory at each READDIR with the cookie of the last). An offset, once given, always stands
    for the same name; numbers are never reused, by any directory of the mount (``numbers``), so
    that an offset of offsets forgotten never names another entry."""

    numbers: Iterator[int]  # the mount's
    names: dict[int, bytes] = field(default_factory=dict)
    offsets: dict[bytes, int] = field(default_factory=dict)
    handles: int = 0  # open handles of the directory

    def offset_of(self, name: bytes) -> int:
        off = self.offsets.get(name)
        if off is None:
            off = self.offsets[name] = next(self.numbers)
            self.names[off] = name
        return off

    def forget(self) -> None:
        """Drop what was given out (later offsets are new ones): memory would grow with every name
        the directory ever had."""
        self.names.clear()
        self.offsets.clear()


#: directories whose offsets are kept after their last handle closed (least recently closed go),
#: each while it has given out no more than _DIR_COOKIES_KEPT (more are forgotten when the last
#: handle closes, or when a listing from the start begins with no other handle open)
_IDLE_DIR_COOKIES = 16
_DIR_COOKIES_KEPT = 16384


# What a request may end in as a file system's answer to its caller (no such name, not permitted,
# not empty, ...): logged at DEBUG only. Every other error (a timeout, a server or a disk failing,
# a refused token or capability, a full disk) is the operator's to know of: a WARNING, at most one
# per request type and error every WARN_EVERY_S (with the count of those left out meanwhile).
_CALLERS_OUTCOMES = frozenset(
    {
        StatusCode.NOT_FOUND,
        StatusCode.ALREADY_EXISTS,
        StatusCode.PERMISSION_DENIED,
        StatusCode.INVALID_ARGUMENT,
        StatusCode.CANCELLED,
        *(c for c in StatusCode if 300 <= c < 400),  # META_*: POSIX outcomes
    }
)
# and these, the most frequent by far, not even at DEBUG
_ROUTINE = frozenset({StatusCode.NOT_FOUND, StatusCode.ALREADY_EXISTS, StatusCode.META_NO_XATTR})
WARN_EVERY_S = 10.0


class _ErrorLog:
    """Rate-limited warnings of failed requests, per (request type, error code).

    The first failure of a kind is logged at once; those of the next ``every_s`` are counted, and
    their count comes out with the next line of that kind or, when none follows, in a line of its
    own at the window's end (a one-shot timer, armed only while a count is waiting) or at
    :meth:`flush` (unmount), whichever comes first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = WARN_EVERY_S) -> None:
        self._clock = clock
        self.every_s = every_s
        self._next: dict[tuple[str, int], float] = {}
        self._skipped: dict[tuple[str, int], tuple[int, FS3Error]] = {}  # count, the last error
        self._timers: dict[tuple[str, int], asyncio.TimerHandle] = {}

    def failed(self, name: str, e: FS3Error) -> None:
        # (a setxattr finding no room left for the inode's xattrs: ENOSPC, the caller's outcome;
        # RESOURCE_EXHAUSTED elsewhere, a full disk, is the operator's)
        if e.code in _CALLERS_OUTCOMES or (name == "setxattr" and e.code == StatusCode.RESOURCE_EXHAUSTED):
            if e.code not in _ROUTINE:
                log.debug("%s failed error=%s", name, e)
            return
        key = (name, int(e.code))
        now = self._clock()
        if now < self._next.get(key, 0.0):
            self._skipped[key] = (self._skipped.get(key, (0, e))[0] + 1, e)
            if key not in self._timers:
                with contextlib.suppress(RuntimeError):  # no running loop: the next line or flush says it
                    self._timers[key] = asyncio.get_running_loop().call_later(
                        self._next[key] - now, self._left_out, key
                    )
            return
        self._next[key] = now + self.every_s
        if (timer := self._timers.pop(key, None)) is not None:
            timer.cancel()
        skipped, _ = self._skipped.pop(key, (0, e))
        more = f" ({skipped} more {name} requests failed so since the last such line)" if skipped else ""
        log.warning("%s failed error=%s%s", name, e, more)

    def _left_out(self, key: tuple[str, int]) -> None:
        self._timers.pop(key, None)
        if key in self._skipped:
            skipped, e = self._skipped.pop(key)
            log.warning(
                "%s failed %d more times since the last such line, the last with error=%s", key[0], skipped, e
            )

    def flush(self) -> None:
        """Log every count still waiting for its line now (at unmount)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for key in list(self._skipped):
            self._left_out(key)


def _translate(fn: F) -> F:
    """Raise FUSEError(errno) for FS3Error (and log unexpected exceptions as EIO); count the request."""
    name = fn.__name__

    abandonable = name in _ABANDONABLE
    interruptible = name in _INTERRUPTIBLE
    by_handle = name in _BY_HANDLE

    @functools.wraps(fn)
    async def wrapper(self: Fs3Operations, *args: Any, **kw: Any) -> Any:
        start = perf_counter()
        task = asyncio.current_task() if interruptible else None
        if task is not None:
            if abandonable:
                self._reads.add(task)
            if by_handle:
                pid = self._openers.get(args[0], 0)
            else:
                ctx = args[-1] if args else kw.get("ctx")
                pid = getattr(ctx, "pid", 0)
            if pid:
                self._waiting[task] = (pid, start, by_handle)
                if self._watchdog is None:
                    self._watchdog = asyncio.get_running_loop().create_task(self._watch_callers())
        try:
            try:
                return await fn(self, *args, **kw)
            except FS3Error as e:
                if e.code not in _DENIED or not self._groups_changed(args[-1] if args else kw.get("ctx")):
                    raise
                return await fn(self, *args, **kw)  # again, as the caller is now (nothing was done)
        except asyncio.CancelledError:
            interrupted = task is not None and task in self._interrupted
            abandoned = task is not None and abandonable and self._abandoned
            if task is None or not (interrupted or abandoned):
                raise
            # one uncancel for each cancel this wrapper answers for (the watchdog's and the
            # abandon's may both have come): the request must be answered, not left to pyfuse3
            left = task.uncancel()
            if interrupted and abandoned and left > 0:
                left = task.uncancel()
            if left > 0:
                raise
            code = errno.ENOTCONN if abandoned else errno.EINTR  # the session is over / caller stops
            self.metrics.error(name, code)
            raise pyfuse3.FUSEError(code) from None  # the worker serves on (or ends)
        except FS3Error as e:
            self.errors.failed(name, e)
            code = to_errno(e.code)
            self.metrics.error(name, code)
            raise pyfuse3.FUSEError(code) from None
        except pyfuse3.FUSEError as e:
            self.metrics.error(name, e.errno)
            raise
        except OSError as e:
            code = e.errno or errno.EIO
            self.metrics.error(name, code)
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            log.exception("%s failed", name)
            self.metrics.error(name, errno.EIO)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if task is not None:
                self._reads.discard(task)
                self._waiting.pop(task, None)
                interrupted = task in self._interrupted
                self._interrupted.discard(task)
                if (
                    (self._abandoned or interrupted)
                    and task.cancelling()
                    and not isinstance(sys.exception(), asyncio.CancelledError)
                ):
                    # the abandon's cancel was swallowed on the way (converted to an error, or a
                    # child task's): it must not linger for the worker's next await to trip on
                    task.uncancel()
            elapsed = perf_counter() - start
            stats = self.metrics.op(name)
            stats[0] += 1
            stats[1] += elapsed
            stats[2][bisect_left(_BUCKETS, elapsed)] += 1

    return wrapper  # type: ignore[return-value]


class Fs3Operations(pyfuse3.Operations):
    """pyfuse3 operations over a connected :class:`FileSystem`; see the module docstring."""

    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        fs: FileSystem,
        config: ClientConfig,
        token: str = "",
        on_init: Callable[[], None] | None = None,
        metrics_registry: Any = None,
    ) -> None:
        super().__init__()
        self.metrics = FuseMetrics(metrics_registry, fs.storage)
        self.errors = _ErrorLog()
        self.on_init = on_init
        self.fs = fs
        self.config = config
        self.token = token
        self._handles: dict[int, OpenFile] = {}
        self.failed_at_unmount = 0  # files open for writing whose close at unmount failed
        self._dirs: dict[int, OpenDir] = {}
        # each directory's offsets (DirCookies), kept while open and for the _IDLE_DIR_COOKIES
        # directories closed last (insertion order: least recently closed first)
        self._dir_cookies: dict[int, DirCookies] = {}
        self._idle_dirs: dict[int, None] = {}
        self._dir_offsets = itertools.count(_DOTS + 1)  # every directory's, never reused
        self._next_fh = 1
        self._seen: dict[int, tuple[int, int, int]] = {}  # inode -> _cache_mark the page cache holds
        self._appending: set[int] = set()  # handles opened O_APPEND for writing (see _append)
        self._metas: dict[tuple[int, int, tuple[int, ...]], MetaClient] = {}
        self._groups: dict[int, tuple[float, tuple[int, ...]]] = {}
        self._pool = fs.rpc.pool
        self._loop = asyncio.get_running_loop()  # made in the loop that serves the mount
        self._reads: set[asyncio.Task[Any]] = set()  # pyfuse3 workers serving _ABANDONABLE requests
        # Directories' attributes as meta last gave them to a GETATTR, until their attr_timeout from
        # that call: the kernel forgets a directory's attributes whenever this mount changes its
        # entries, and asks again at the next path walk through it (default_permissions), one
        # GETATTR per create. This mount's creates fold their times in; its other changes of a
        # directory drop it. _dir_changes counts those, so a GETATTR that ran across one keeps nothing.
        self._dir_attrs: dict[int, tuple[m.Inode, float]] = {}
        # directories this mount removed, until the kernel forgets them (see _removed_dir)
        self._removed_dirs: dict[int, m.Inode] = {}
        # (parent, name) -> the directory this mount last told the kernel the name is (a lookup,
        # a listing, a mkdir, a rename): what a rename onto the name will replace, as the kernel
        # sees it (see rename)
        self._dir_names: dict[tuple[int, bytes], int] = {}
        self._dir_changes = 0
        self.metrics.remembered = lambda: len(self._seen) + len(self._dir_attrs)
        self._abandoned = False
        self._releases: set[asyncio.Task[Any]] = set()  # pyfuse3 workers serving RELEASE requests
        self._releases_abandoned = False
        self._openers: dict[int, int] = {}  # file and directory handle -> the pid that opened it
        # _INTERRUPTIBLE requests waiting: caller, since when, by handle (then only a kill ends it)
        self._waiting: dict[asyncio.Task[Any], tuple[int, float, bool]] = {}
        self._interrupted: set[asyncio.Task[Any]] = set()  # cancelled for a caller asked to stop
        self._watchdog: asyncio.Task[None] | None = None

    async def _watch_callers(self) -> None:
        """While _INTERRUPTIBLE requests wait, end those whose caller is asked to stop (EINTR)."""
        try:
            while self._waiting:
                await asyncio.sleep(INTERRUPT_CHECK_S)
                now = perf_counter()
                # looked at and cancelled in one step: no request ends in between, so each task
                # cancelled is still serving the request it was listed for
                for task, (pid, start, by_handle) in list(self._waiting.items()):
                    if now - start < INTERRUPT_AFTER_S or task in self._interrupted:
                        continue
                    killed, asked = _pending(pid)
                    if killed or (asked and not by_handle):
                        log.info("a request's caller is asked to stop: ended with EINTR pid=%d", pid)
                        self._interrupted.add(task)
                        task.cancel()
        finally:
            self._watchdog = None

    def init(self) -> None:
        # The kernel applies the INIT reply (which caps the mount's readahead at the 128 KiB it
        # offered) when libfuse writes it, right after this returns: tune the mount after that.
        if self.on_init is not None:
            asyncio.get_running_loop().call_soon(self.on_init)

    # -- identity and attributes --------------------------------------------------------------------

    def _groups_of(self, pid: int) -> tuple[int, ...]:
        now = time.monotonic()
        hit = self._groups.get(pid)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            groups = tuple(sorted(pyfuse3.get_sup_groups(pid)))
        except (OSError, ValueError):
            groups = ()
        if len(self._groups) > 4096:
            self._groups.clear()
        self._groups[pid] = (now + _GROUPS_TTL_S, groups)
        return groups

    def _groups_changed(self, ctx: object) -> bool:
        """Meta refused a request of ``ctx``'s process: whether the supplementary groups it was
        sent with (cached for _GROUPS_TTL_S) are no longer the process's own. A file server that
        switches identity in place (seteuid, setgroups) got EACCES the kernel had not given it."""
        if not isinstance(ctx, pyfuse3.RequestContext) or not ctx.uid:
            return False
        hit = self._groups.pop(ctx.pid, None)
        return hit is not None and self._groups_of(ctx.pid) != hit[1]

    def use_token(self, old: str, new: str) -> None:
        """The mount's FileSystem took up a new token from token_file: its callers' requests
        carry it from now on too."""
        self.token = new
        for client in self._metas.values():
            if client.user.token == old:
                client.user.token = new

    def meta(self, ctx: pyfuse3.RequestContext | None) -> MetaClient:
        """The meta client acting as the caller of a request (the mount's own identity without one)."""
        if ctx is None:
            return self.fs.meta
        key = (ctx.uid, ctx.gid, self._groups_of(ctx.pid) if ctx.uid else ())
        client = self._metas.get(key)
        if client is None:
            # a user_auth mount's opens feed its storage client's capabilities, and its lookups the
            # handles its token's user names inodes with: both shared (acting_as)
            user = common_pb2.UserInfo(uid=key[0], gid=key[1], groups=key[2], token=self.token)
            client = self.fs.meta.acting_as(user)
            if len(self._metas) > 1024:
                self._metas.clear()
            self._metas[key] = client
        return client

    def _size(self, st: InodeState | None, inode: m.Inode, since: int) -> int:
        """The length of a file meta returned ``inode`` for (to a call made at ``since``, a
        :func:`stamp`; ``st``: this mount's state of it, if open): meta's, which a file open in this
        mount takes too (its reads are clamped to it), extended by what this mount's writers wrote
        and meta has not counted yet."""
        if st is None:
            return inode.size
        st.refresh(inode, since)
        return st.size

    def attrs(self, inode: m.Inode, since: int) -> pyfuse3.EntryAttributes:
        """The attributes of ``inode``, meta's reply to a call made at ``since`` (a :func:`stamp`;
        0 for an inode not fresh from meta, whose length is not taken)."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode.id
        a.generation = inode.generation
        # a file's name is looked up again each time it is used (see file_entry_timeout_s): the
        # kernel's cached size would otherwise outlive another client's close by up to a timeout
        file = inode.type == m.INODE_FILE
        a.entry_timeout = self.config.file_entry_timeout_s if file else self.config.entry_timeout_s
        a.attr_timeout = self.config.attr_timeout_s
        a.st_mode = mode_of(inode)
        a.st_nlink = inode.nlink
        a.st_uid = inode.uid
        a.st_gid = inode.gid
        a.st_rdev = inode.rdev
        st = self.fs._states.get(inode.id) if file else None
        size = self._size(st, inode, since) if file else inode.size
        a.st_size = size
        a.st_blksize = BLOCK_SIZE
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = inode.atime_ns
        a.st_mtime_ns, a.st_ctime_ns = (inode.mtime_ns, inode.ctime_ns) if st is None else st.times(inode)
        return a

    def _entry(self, inode: m.Inode, since: int) -> pyfuse3.EntryAttributes:
        """The attributes of ``inode`` for a reply that gives the kernel an entry (a lookup, a
        create...), which counts as a lookup until the kernel's ``forget``: a user_auth mount keeps
        the inode's handle until then."""
        handles = self.fs.meta.handles
        if handles is not None:
            handles.pin(inode.id)
        if inode.type == m.INODE_DIRECTORY and self._dir_attrs:
            # the kernel takes these attributes (a lookup, a listing): a kept copy older than them
            # must not bring back what they replace (another client's chmod, say)
            self._forget_dirs((inode.id,), False)
        return self.attrs(inode, since)

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # -- names ------------------------------------------------------------------------------------

    @_translate
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        since = stamp()
        try:
            inode = await self.meta(ctx).lookup(parent_inode, name)
        except FS3Error as e:
            if e.code == StatusCode.NOT_FOUND:
                self._dir_names.pop((parent_inode, name), None)
            if e.code == StatusCode.NOT_FOUND and self.config.negative_timeout_s > 0:
                a = pyfuse3.EntryAttributes()  # inode 0: the kernel remembers the name is absent
                a.st_ino = 0
                a.entry_timeout = self.config.negative_timeout_s
                return a
            raise
        self._named(parent_inode, name, inode)
        return self._entry(inode, since)

    def _named(self, parent: int, name: bytes, inode: m.Inode) -> None:
        """The kernel is told ``name`` in ``parent`` is ``inode`` (see _dir_names)."""
        key = (parent, name)
        if inode.type != m.INODE_DIRECTORY:
            self._dir_names.pop(key, None)
            return
        names = self._dir_names
        names.pop(key, None)  # to the end: the oldest go first
        names[key] = inode.id
        if len(names) > _DIR_NAMES_MAX:
            del names[next(iter(names))]

    async def forget(self, inode_list: Any) -> None:
        # The kernel dropped these inodes, and their page cache with them: what this mount kept of
        # them goes too (it was kept for ever: memory grew with every file a mount ever opened).
        # A forget of an inode the kernel still holds (a revalidation's extra lookup) costs at
        # most one keep_cache: the next open does not trust pages it may have.
        for inode, _ in inode_list:
            self._seen.pop(inode, None)
            self._dir_attrs.pop(inode, None)
            self._removed_dirs.pop(inode, None)
        handles = self.fs.meta.handles
        if handles is not None:
            for inode, nlookup in inode_list:
                handles.unpin(inode, nlookup)

    @_translate
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        kept = self._dir_attrs.get(inode)
        if kept is not None:
            left = kept[1] - time.monotonic()
            if left > 0:
                self.metrics.dir_attrs_kept += 1
                a = self.attrs(kept[0], 0)
                a.attr_timeout = left  # no longer than the kernel could have kept meta's answer
                return a
            del self._dir_attrs[inode]
        st = self.fs._states.get(inode)
        if st is not None:
            await st.drain()
        since, changes, asked = stamp(), self._dir_changes, time.monotonic()
        try:
            ino = await self.fs.stat_held(inode)
        except FS3Error as e:
            held = self._removed_dir(inode, e)
            if held is None:
                raise _stale(e) from None
            return self.attrs(held, 0)
        if ino.type == m.INODE_DIRECTORY and changes == self._dir_changes and self.config.attr_timeout_s > 0:
            if len(self._dir_attrs) >= _DIR_ATTRS_MAX:
                self._dir_attrs.clear()
            self._dir_attrs[inode] = (
                m.Inode.FromString(ino.SerializeToString()),
                asked + self.config.attr_timeout_s,
            )
        return self.attrs(ino, since)

    @contextlib.contextmanager
    def _changing(self, *dir_ids: int, all_dirs: bool = False) -> Iterator[None]:
        """Around a change of directories (entries, attributes) by this mount: their kept attributes
        go, before and after (a GETATTR running meanwhile keeps none: _dir_changes)."""
        self._forget_dirs(dir_ids, all_dirs)
        try:
            yield
        finally:
            self._forget_dirs(dir_ids, all_dirs)

    def _forget_dirs(self, dir_ids: tuple[int, ...], all_dirs: bool) -> None:
        self._dir_changes += 1
        if all_dirs:
            self._dir_attrs.clear()
        for d in dir_ids:
            self._dir_attrs.pop(d, None)

    def _created(self, parent: int, child: m.Inode) -> None:
        """This mount made ``child`` in ``parent``: meta set the directory's mtime and ctime to the
        new inode's ctime, unless its stored ctime was later (another meta server's clock ahead;
        meta keeps the later pair then), which only meta can say: the kept copy goes then."""
        self._dir_changes += 1
        kept = self._dir_attrs.get(parent)
        if kept is None:
            return
        if child.ctime_ns >= kept[0].ctime_ns:
            kept[0].mtime_ns = kept[0].ctime_ns = child.ctime_ns
        else:
            del self._dir_attrs[parent]

    @_translate
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        kw: dict[str, Any] = {}
        if fields.update_mode:
            kw["mode"] = attr.st_mode & 0o7777
        if fields.update_uid:
            kw["uid"] = attr.st_uid
        if fields.update_gid:
            kw["gid"] = attr.st_gid
        # pyfuse3 turns UTIME_NOW into the current time; meta needs to know it was "now" (a
        # writer may set that, only the owner an explicit time). pyfuse3 reads the clock once for
        # both, so equal and current times are taken for UTIME_NOW.
        now = fields.update_atime and fields.update_mtime and attr.st_atime_ns == attr.st_mtime_ns
        now = now and abs(time.time_ns() - attr.st_mtime_ns) < _NOW_SLACK_NS
        if now and (ctx.uid == 0 or (await self.fs.meta.stat(inode)).uid == ctx.uid):
            # the owner may set any time, so the times go as given: equal explicit times close to
            # now (touch -r, cp -p of a file just written) must not become meta's "now"
            now = False
        if fields.update_atime:
            kw["atime_ns"] = None if now else attr.st_atime_ns
        if fields.update_mtime:
            kw["mtime_ns"] = None if now else attr.st_mtime_ns
        st = self.fs._states.get(inode)
        if st is not None and (
            fields.update_size
            or fields.update_mtime
            or fields.update_mode
            or fields.update_uid
            or fields.update_gid
        ):
            # Settle this mount's writes first: their report sets mtime (to when they were made)
            # and the length, and clears setuid/setgid (a write by a non-root opener), which must
            # not land after (and undo) an explicit mtime, a truncate, or the mode of a chmod
            # (install -m 4755).
            for h in list(st.writers):
                await self._report(h, raise_errors=False)  # a flush error is for fsync/close
        if fields.update_size:
            kw["size"] = attr.st_size
            handle = self._handles.get(fh) if fh else None
            if handle is not None and handle.writable:
                kw["session_id"] = handle.session_id
        # Nothing to set is chown(f, -1, -1) (the kernel sends ATTR_CTIME alone as an empty
        # SETATTR): Linux moves ctime and nothing else, for any caller; meta does the same.
        meta = self.meta(ctx)
        kill_privs: int | None = None
        if "mode" in kw and ctx.uid != 0 and await self._drops_privileges_only(inode, kw["mode"]):
            # The kernel clearing setuid/setgid on a write or truncate by a user who may write but
            # does not own the file (file_remove_privs / do_truncate, with ATTR_FORCE: authorized
            # already). A chmod(2) by a non-owner never gets here (the kernel refuses it), so this
            # is that kill, made as the mount (meta would refuse the caller a chmod, and the write
            # would fail with EIO, the truncate with EPERM). A truncate sends it with the size: the
            # size (and times) go as the caller, checked as theirs, and the kill after them.
            if list(kw) == ["mode"]:
                meta = self.fs.meta
            else:
                kill_privs = kw.pop("mode")
        since = stamp()
        with self._changing(inode):
            ino = await meta.setattr(inode, **kw)
            if kill_privs is not None:
                # bits to clear, not a mode to set: meta may have cleared more (the setgid bit of
                # a caller outside the file's group, which the kernel's older rule keeps, so its
                # mode put the bit back)
                kill = (stat_mod.S_ISUID | stat_mod.S_ISGID) & ~kill_privs
                if ino.mode & kill:
                    ino = await self.fs.meta.setattr(inode, mode=ino.mode & 0o7777 & ~kill)
        st = self.fs._states.get(inode)  # the one open now (the reports above waited)
        if fields.update_size and st is not None:
            st.truncated(attr.st_size)
            st.install(ino)
        if fields.update_size:
            self._seen.pop(inode, None)
        return self.attrs(ino, since)

    async def _drops_privileges_only(self, inode: int, mode: int) -> bool:
        """Whether ``mode`` is the file's mode less setuid and/or setgid (and not equal to it)."""
        cur = (await self.fs.meta.stat(inode)).mode & 0o7777
        kill = stat_mod.S_ISUID | stat_mod.S_ISGID
        return mode != cur and mode & ~kill == cur & ~kill and mode & kill == mode & kill & cur

    @_translate
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        try:
            return await self.meta(ctx).readlink(inode)
        except FS3Error as e:
            raise _stale(e) from None

    @_translate
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        since = stamp()
        ino = await self.meta(ctx).mknod(parent_inode, name, mode, rdev)
        self._created(parent_inode, ino)
        return self._entry(ino, since)

    @_translate
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        since = stamp()
        with self._changing(parent_inode):  # its link count changes too
            ino = await self.meta(ctx).mkdir(parent_inode, name, mode & 0o7777)
        self._named(parent_inode, name, ino)
        return self._entry(ino, since)

    @_translate
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        with self._changing(parent_inode):
            await self.meta(ctx).unlink(parent_inode, name)

    @_translate
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        meta = self.meta(ctx)
        with self._changing(all_dirs=True):  # the removed one's too (an fstat of it: nlink 0)
            # which directory goes: a process may stand in it (see _removed_dir)
            try:
                gone: m.Inode | None = await meta.lookup(parent_inode, name)
            except FS3Error:
                gone = None  # the rmdir says why
            await meta.rmdir(parent_inode, name)
        self._dir_names.pop((parent_inode, name), None)
        if gone is not None and gone.type == m.INODE_DIRECTORY:
            gone.nlink = 0
            gone.handle = b""
            if len(self._removed_dirs) >= _DIR_ATTRS_MAX:
                del self._removed_dirs[next(iter(self._removed_dirs))]
            self._removed_dirs[gone.id] = gone

    @_translate
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        since = stamp()
        ino = await self.meta(ctx).symlink(parent_inode, name, target)
        self._created(parent_inode, ino)
        return self._entry(ino, since)

    @_translate
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        old, new = (parent_inode_old, name_old), (parent_inode_new, name_new)
        names = self._dir_names
        # A directory the kernel takes the new name to be is marked dead once the rename succeeds,
        # for as long as the kernel holds its inode (a listing ENOENT, no create in it). Another
        # client may have moved it away and put something else there since the kernel looked: meta
        # then refuses (ESTALE) and the kernel looks the names up again and retries; else the
        # directory, alive under its new name, stayed dead to this mount.
        replaces = names.get(new, 0) if not flags & RENAME_EXCHANGE else 0
        try:
            with self._changing(all_dirs=True):  # a directory moved changes too (ctime, "..")
                await self.meta(ctx).rename(
                    parent_inode_old, name_old, parent_inode_new, name_new, flags, replaces=replaces
                )
        except FS3Error as e:
            if e.code == StatusCode.META_STALE:
                names.pop(new, None)
                names.pop(old, None)
            raise
        moved, there = names.pop(old, None), names.pop(new, None)
        if moved is not None:
            names[new] = moved
        if flags & RENAME_EXCHANGE and there is not None:
            names[old] = there

    @_translate
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        since = stamp()
        with self._changing(new_parent_inode):
            ino = await self.meta(ctx).link(inode, new_parent_inode, new_name)
        return self._entry(ino, since)

    # -- files ------------------------------------------------------------------------------------

    def _file_info(self, handle: OpenFile, flags: int, pid: int) -> pyfuse3.FileInfo:
        fh = self._new_fh()
        self._handles[fh] = handle
        self._openers[fh] = pid
        inode = handle.state.inode
        mark = _cache_mark(inode)
        keep = self._seen.get(inode.id) == mark and handle.state.handles <= {handle}  # (no copy)
        self._seen[inode.id] = mark
        direct = self.config.direct_io or bool(flags & os.O_DIRECT)
        if flags & os.O_APPEND and handle.writable:
            self._appending.add(fh)  # see _append (the kernel's page cache would hold the bytes
            direct = True  # at the offset it chose)
        return pyfuse3.FileInfo(fh=fh, direct_io=direct, keep_cache=keep)

    @_translate
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & os.O_TRUNC:
            await self.fs._drain_before_truncate(inode)
        since, opened_at = stamp(), session_clock()
        try:
            rsp = await self.meta(ctx).open(inode, flags & (os.O_TRUNC | os.O_ACCMODE))
        except FS3Error as e:
            # The kernel looked the name up, then another client replaced (renamed over) or
            # removed the file before this open reached meta: the name is looked up again and
            # what it names now is opened (an open of a name that exists all along never fails
            # for a rename over it).
            raise _stale(e) from None
        handle = self.fs._handle(rsp.inode, rsp.session_id, flags, since, opened_at, rsp.session_queued)
        if flags & os.O_TRUNC:
            handle.state.truncated(0)
        return self._file_info(handle, flags, ctx.pid)

    @_translate
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        if flags & os.O_TRUNC:
            await self.fs._drain_before_truncate(None, parent_inode, name)
        since, opened_at = stamp(), session_clock()
        rsp = await self.meta(ctx).create(
            parent_inode, name, mode & 0o7777, flags & (os.O_EXCL | os.O_TRUNC | os.O_ACCMODE), session=True
        )
        if rsp.created:
            self._created(parent_inode, rsp.inode)
        handle = self.fs._handle(rsp.inode, rsp.session_id, flags, since, opened_at)
        if flags & os.O_TRUNC:
            handle.state.truncated(0)
        if flags & os.O_TRUNC or rsp.created:
            self._seen.pop(rsp.inode.id, None)
        return self._file_info(handle, flags, ctx.pid), self._entry(rsp.inode, since)

    @_translate
    async def read(self, fh: int, off: int, size: int) -> memoryview | bytes:
        pool = self._pool
        buf = pool.acquire(size)
        view = memoryview(buf)[:size]
        handle = self._handles[fh]
        n = await handle.read_into(off, view)
        # Short at the file's end as this mount knew it when the read began. If the file grew
        # meanwhile (another reader's getattr or lookup took another client's append), the kernel
        # may know the new length already: it would take the whole page as read, with zeros past
        # this end, and keep it so (its own drop of the cache came with that length, before). Read on.
        while n < size and (more := await handle.read_into(off + n, view[n:])):
            n += more
        self.metrics.read_bytes += n
        # pyfuse3 copies the reply to the kernel as soon as this returns, before the event loop
        # runs anything else: the buffer can go back to the pool right after.
        self._loop.call_soon(pool.release, buf)
        return view[:n]

    @_translate
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handles[fh]
        n = await (self._append(handle, buf) if fh in self._appending else handle.write(off, buf))
        self.metrics.write_bytes += n
        return n

    async def _append(self, handle: OpenFile, buf: bytes) -> int:
        """An O_APPEND write goes at the file's end as this mount knows it, not at the kernel's
        offset: the kernel appends at the length it cached, which another mount's appends may have
        passed meanwhile (a descriptor kept open would write over them). Meta's length is asked
        again once this mount's is older than attr_timeout_s, as NFS does; this mount's own
        appends, of any handle or task, each get a range of their own."""
        state = handle.state
        async with state.appending:
            if time.monotonic() - state.fresh_at > self.config.attr_timeout_s:
                await self.fs._refresh(handle)
            return await handle.write(state.size, buf)

    async def _report(self, handle: OpenFile, *, raise_errors: bool = True) -> None:
        """Flush a handle and report what it wrote to meta (see FileSystem._sync)."""
        ino = await self.fs._sync(handle, raise_errors=raise_errors, only_dirty=True)
        if ino is not None:
            self._seen[ino.id] = _cache_mark(ino)

    @_translate
    async def flush(self, fh: int) -> None:
        # close(2): a descriptor that cannot write is told of no write-back error (as on Linux,
        # where only fsync reports one to a read-only descriptor)
        handle = self._handles[fh]
        await self._report(handle, raise_errors=handle.writable)

    @_translate
    async def fsync(self, fh: int, datasync: bool) -> None:
        """fsync writes out the whole file, as on Linux: every handle's buffer in this mount, not
        only this one's; a flush error of any of them since this handle reported one is raised."""
        handle = self._handles[fh]
        for h in list(handle.state.writers):
            if h is not handle:
                await self._report(h, raise_errors=False)
        await self._report(handle)

    @_translate
    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh)
        self._appending.discard(fh)
        self._openers.pop(fh, None)
        task = asyncio.current_task()
        assert task is not None
        self._releases.add(task)
        try:
            ino = await self.fs._close(handle)
        except asyncio.CancelledError:
            if not self._releases_abandoned or task.uncancel() > 0:
                raise
            log.warning(
                "a close still waiting at unmount given up; meta ends its session once this client's "
                "session is over inode=%#x",
                handle.inode_id,
            )
            return
        finally:
            self._releases.discard(task)
        if ino is not None and handle.writable:
            self._seen[ino.id] = _cache_mark(ino)

    # -- directories ------------------------------------------------------------------------------

    @_translate
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        meta = self.meta(ctx)
        # "." and ".." as a local file system lists them (the kernel links neither from readdirplus)
        try:
            me = await meta.stat(inode)
        except FS3Error as e:
            held = self._removed_dir(inode, e)  # (removed, and another handle of it still open)
            if held is None:
                raise _stale(e) from None
            me = held
        up = m.Inode(id=me.parent or me.id, type=m.INODE_DIRECTORY, mode=0o755, nlink=2)
        fh = self._new_fh()
        cookies = self._dir_cookies.get(inode)
        if cookies is None:
            cookies = self._dir_cookies[inode] = DirCookies(self._dir_offsets)
        self._idle_dirs.pop(inode, None)
        cookies.handles += 1
        self._dirs[fh] = OpenDir(self.fs.meta, inode, ((b".", me), (b"..", up)), cookies)
        self._openers[fh] = ctx.pid
        return fh

    @_translate
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        d = self._dirs[fh]
        if start_id == 0:
            if d.cookies.handles == 1 and len(d.cookies.offsets) > _DIR_COOKIES_KEPT:
                d.cookies.forget()
            d.end = -1
        elif start_id == d.end:
            return
        for off in range(start_id, _DOTS):
            name, ino = d.dots[off]
            if not pyfuse3.readdir_reply(token, name, self.attrs(ino, 0), off + 1):
                return
        after = b""
        if start_id > _DOTS:
            found = d.cookies.names.get(start_id)
            if found is None:
                # no offset this mount gave out for the directory (or one forgotten since)
                raise pyfuse3.FUSEError(errno.EINVAL)
            after = found
        since = stamp()
        try:
            rsp = await d.meta.readdir(d.inode, after, d.page, with_inodes=True)
        except FS3Error as e:
            if self._removed_dir(d.inode, e) is None:
                raise
            d.end = max(start_id, _DOTS)  # removed while open: nothing more in it
            return
        handles = self.fs.meta.handles
        last = max(start_id, _DOTS)
        for n, (e, ino) in enumerate(zip(rsp.entries, rsp.inodes, strict=True)):
            off = d.cookies.offset_of(e.name)
            if not pyfuse3.readdir_reply(token, e.name, self._entry(ino, since), off):
                if handles is not None:
                    handles.unpin(ino.id)  # not sent: the kernel counts no lookup of it
                d.page = n + 1  # about what the kernel's buffer holds: ask meta for no more
                d.filled = True
                return
            self._named(d.inode, e.name, ino)
            last = off
        if not rsp.more:
            d.end = last
        elif not d.filled:
            d.page = min(2 * d.page, _READDIR_PAGE_MAX)

    def _removed_dir(self, inode: int, error: FS3Error) -> m.Inode | None:
        """A directory removed while this mount holds it open, or removed through this mount
        while the kernel still holds it (a shell's working directory: ``cd d; rm -rf ../d; ls``)
        answers as a local file system's does: its attributes as at its opendir (or removal)
        with no links, and an empty listing, not ESTALE. None when ``error`` is not that case (a
        directory another client removed stays ESTALE: the kernel then looks its path up again,
        which finds what another client put in its place)."""
        if error.code != StatusCode.NOT_FOUND:
            return None
        held = next((d.dots[0][1] for d in self._dirs.values() if d.inode == inode), None)
        if held is None:
            return self._removed_dirs.get(inode)
        gone = m.Inode()
        gone.CopyFrom(held)
        gone.nlink = 0
        return gone

    @_translate
    async def releasedir(self, fh: int) -> None:
        d = self._dirs.pop(fh, None)
        self._openers.pop(fh, None)
        if d is not None:
            d.cookies.handles -= 1
            if not d.cookies.handles and len(d.cookies.offsets) > _DIR_COOKIES_KEPT:
                del self._dir_cookies[d.inode]
            elif not d.cookies.handles:
                self._idle_dirs[d.inode] = None
                while len(self._idle_dirs) > _IDLE_DIR_COOKIES:
                    gone = next(iter(self._idle_dirs))
                    del self._idle_dirs[gone], self._dir_cookies[gone]

    @_translate
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None  # every namespace change is durable once meta acknowledged it

    @_translate
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        rsp = await self.meta(ctx).statfs()
        s = pyfuse3.StatvfsData()
        bsize = rsp.block_size or 4096
        s.f_bsize = BLOCK_SIZE
        s.f_frsize = bsize
        s.f_blocks = rsp.capacity // bsize
        s.f_bfree = rsp.free // bsize
        # what writes may still use: storage refuses writes into the space it keeps free
        s.f_bavail = (rsp.available if rsp.HasField("available") else rsp.free) // bsize
        s.f_files = rsp.inodes + (1 << 32)
        s.f_ffree = 1 << 32
        s.f_favail = 1 << 32
        s.f_namemax = rsp.name_max or 255
        return s

    # -- extended attributes ----------------------------------------------------------------------

    @_translate
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        if not name.startswith(_USER_XATTR):
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        with self._changing(inode):
            await self.meta(ctx).setxattr(inode, name, value)

    @_translate
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if not name.startswith(_USER_XATTR):
            # security.capability is asked before every write: answer here, without a round trip
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return await self.meta(ctx).getxattr(inode, name)

    @_translate
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return await self.meta(ctx).listxattr(inode)

    @_translate
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        if not name.startswith(_USER_XATTR):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        with self._changing(inode):
            await self.meta(ctx).removexattr(inode, name)

    # -- shutdown ---------------------------------------------------------------------------------

    def abandon_reads(self) -> int:
        """End the requests in flight that only read (``_ABANDONABLE``), answering ENOTCONN: the
        FUSE session is over, nobody waits for them. Requests that come later are not ended (the
        mount serves on, the kernel still sends some). Returns how many were ended."""
        self._abandoned = True
        reads = list(self._reads)
        for task in reads:
            task.cancel()
        return len(reads)

    def abandon_releases(self) -> int:
        """Give up the RELEASE requests still in flight once the FUSE session is over (meta not
        answering their closes, say), as :meth:`close_all` gives up the closes of files left open:
        the mount's exit waits for them otherwise, up to the RPC deadline. One cancelled in its
        flush goes on in the background, as there. Returns how many were given up."""
        self._releases_abandoned = True
        releases = list(self._releases)
        for task in releases:
            task.cancel()
        return len(releases)

    def open_files(self) -> int:
        """File handles the kernel has not released."""
        return len(self._handles)

    async def close_all(self, wait_s: float = UNMOUNT_CLOSE_WAIT_S) -> None:
        """Flush and close every open file (at unmount; the kernel may not release them all), all at
        once, and log the count of failed requests that no warning has told of yet. Closes still
        going after ``wait_s`` (meta does not answer) are cancelled: one cancelled while it flushes
        goes on in the background, flush and session end, which :meth:`FileSystem.close` waits for
        (up to the mount's UNMOUNT_GIVE_UP_S: then what it could not write out is given up and
        counted, and the mount exits 1; the session end is bounded by the RPC deadline); one
        cancelled in its session end leaves the session to meta, which ends the sessions of a
        client gone (after its ``session_timeout_s``), settling the file's length from storage."""
        self.errors.flush()
        handles = [self._handles.pop(fh) for fh in list(self._handles)]
        if not handles:
            return
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(self._close_at_unmount(h)) for h in handles], timeout=wait_s
        )
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            log.warning(
                "closing open files at unmount took longer than %g s; meta ends their sessions once this "
                "client's session is over count=%d",
                wait_s,
                len(pending),
            )

    async def _close_at_unmount(self, handle: OpenFile) -> None:
        try:
            await self.fs._close(handle)
        except FS3Error as e:
            self.failed_at_unmount += handle.writable
            log.warning("closing inode=%#x at unmount failed error=%s", handle.inode_id, e)
        except Exception:
            self.failed_at_unmount += handle.writable
            log.exception("closing inode=%#x at unmount failed", handle.inode_id)
