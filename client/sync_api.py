"""The synchronous face of the native file API: :class:`SyncFileSystem` and :class:`SyncFile` run
the calls of :class:`fs3.client.filesystem.FileSystem` and :class:`fs3.client.filesystem.File` on a
private event loop in a background thread, so scripts without asyncio (and several threads at once)
can use them. Imported as ``fs3.client.SyncFileSystem``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, NoReturn, TypeVar, overload

from fs3.client.filesystem import File, FileSystem, StatResult
from fs3.client.mgmtd_client import FORKED_CLIENT_ADVICE
from fs3.config import ClientConfig
from fs3.errors import FS3Error, FS3ValueError, StatusCode, call_os_flavoured
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

T = TypeVar("T")


#: how long a close waits for the calls it cancelled to end
_CANCEL_WAIT_S = 5.0

#: a blocked call wakes this often to see whether a signal came (see :func:`_result`)
_SIGNAL_CHECK_S = 0.2


def _result(fut: Future[T]) -> T:
    """``fut.result()``, waking every :data:`_SIGNAL_CHECK_S` so that a signal (Ctrl-C) is acted on
    while the call is still under way. A wait without end missed one that came just as this thread
    went to sleep (CPython handles a signal on its next bytecode; the lock wait it was entering is
    not interrupted by one already handled in C): the KeyboardInterrupt came only once the call had
    finished, too late to cancel it (a CI run)."""
    while True:
        try:
            return fut.result(_SIGNAL_CHECK_S)
        except concurrent.futures.TimeoutError:
            if fut.done():  # the call's own TimeoutError, or it ended just now
                return fut.result()


def _discard(coro: Awaitable[object]) -> None:
    """Close a coroutine that will not run (no "never awaited" warning)."""
    close = getattr(coro, "close", None)
    if close is not None:
        close()


class _LoopThread:
    """A private event loop in a daemon thread; :meth:`run` waits for a coroutine's result.

    Usable only in the process that made it: a child made by fork() has no such thread (calls
    there fail at once, instead of waiting without end). :meth:`stop` cancels the calls under way,
    whose callers get an error, and calls after it fail at once."""

    def __init__(self) -> None:
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.closed = False
        # the check for closed and a call's submission are one step against stop's setting it: a
        # call submitted after stop listed the tasks to cancel would never end
        self._gate = threading.Lock()
        self._calls: set[Future[Any]] = set()  # submitted and not yet done
        self.thread = threading.Thread(target=self.loop.run_forever, name="fs3-client", daemon=True)
        self.thread.start()

    def _refuse(self, coro: Awaitable[object]) -> NoReturn:
        _discard(coro)
        if os.getpid() != self.pid:
            raise RuntimeError(
                f"this fs3 client was opened before fork(), in the parent: {FORKED_CLIENT_ADVICE}"
            )
        raise FS3Error(StatusCode.FAILED_PRECONDITION, "the fs3 file system is closed")

    def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop and wait for its result; an FS3Error it raises comes out as the
        matching OSError subclass that is still an FS3Error (:func:`os_flavoured`)."""
        return call_os_flavoured(self._run, coro)

    def _run(self, coro: Awaitable[T]) -> T:
        started: list[bool] = []
        ended = threading.Event()

        async def call() -> T:
            started.append(True)
            try:
                return await coro
            finally:
                ended.set()

        with self._gate:
            if self.closed or os.getpid() != self.pid:
                self._refuse(coro)
            fut: Future[T] = asyncio.run_coroutine_threadsafe(call(), self.loop)
            self._calls.add(fut)
        try:
            return _result(fut)
        except concurrent.futures.CancelledError:
            if self.closed:
                raise FS3Error(
                    StatusCode.CANCELLED, "the fs3 file system was closed while this call was under way"
                ) from None
            raise
        except BaseException:
            if not fut.done():
                # The caller gave up (Ctrl-C's KeyboardInterrupt, another signal handler's error):
                # the call is cancelled, and its end waited for, so that this client changes
                # nothing for it after the caller has moved on (a read finishing later moved the
                # position past a seek the caller made since; a write went on writing). A call not
                # started yet never will be. A change a server has taken may still be made (a
                # truncate meta is trimming storage for), as a syscall's may once under way.
                self._give_up(fut, coro, started, ended)
            raise
        finally:
            with self._gate:
                self._calls.discard(fut)

    def _give_up(
        self, fut: Future[Any], coro: Awaitable[object], started: list[bool], ended: threading.Event
    ) -> None:
        fut.cancel()  # cancels the call's task, in the loop's thread

        def never_started() -> None:
            # after that cancellation in the loop's queue: a task whose body has not started by
            # then is cancelled before it does
            if not started:
                _discard(coro)
                ended.set()

        try:
            self.loop.call_soon_threadsafe(never_started)
        except RuntimeError:  # the loop is closed: nothing runs any more
            return
        ended.wait(_CANCEL_WAIT_S)

    def stop(self) -> None:
        """Cancel every call still under way (other threads' calls: they fail with CANCELLED),
        then stop the loop and its thread. Stopping twice does nothing."""
        with self._gate:
            if self.closed or os.getpid() != self.pid:
                return
            self.closed = True  # no call is submitted from here on

        async def cancel_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_CANCEL_WAIT_S)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(_CANCEL_WAIT_S + 1)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()
        with self._gate:
            left = list(self._calls)
        for fut in left:  # one whose task never ran (the loop is gone): its caller must not wait
            fut.cancel()


class SyncFile:
    """The synchronous face of :class:`File` (same methods, blocking)."""

    def __init__(self, file: File, loop: _LoopThread, client: SyncFileSystem | None = None) -> None:
        self.file = file
        self._loop = loop
        # the client the file was opened with, kept open while the file is in use: a client no
        # longer referenced is closed (see SyncFileSystem), and ``connect(cfg).open(p, "wb")``
        # would have lost its file's writes with it
        self._client = client

    def _run(self, coro: Awaitable[T]) -> T:
        if self._loop.closed and os.getpid() == self._loop.pid:
            # as Python's files once closed (the client's close closed it): ValueError
            _discard(coro)
            raise FS3ValueError(
                StatusCode.META_BAD_HANDLE, "I/O operation on closed file (its fs3 file system was closed)"
            )
        return self._loop.run(coro)

    @property
    def inode_id(self) -> int:
        return self.file.inode_id

    @property
    def size(self) -> int:
        return self.file.size

    @property
    def closed(self) -> bool:
        return self.file.closed

    def read(self, length: int | None = -1) -> bytes:
        return self._run(self.file.read(length))

    def readinto(self, buf: bytearray | memoryview) -> int:
        return self._run(self.file.readinto(buf))

    # what io's binary files also offer, so that pickle.load, io.TextIOWrapper, zipfile, tarfile,
    # numpy and torch take an fs3 file where they take a local one
    read1 = read
    readinto1 = readinto

    def readline(self, size: int | None = -1) -> bytes:
        return self._run(self.file.readline(size))

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        return self._run(self.file.readlines(hint))

    def __iter__(self) -> SyncFile:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        for line in lines:
            self.write(line)

    @property
    def name(self) -> str | bytes:
        return self.file.name

    @property
    def mode(self) -> str:
        return self.file.mode

    def readable(self) -> bool:
        return call_os_flavoured(self.file.readable)

    def writable(self) -> bool:
        return call_os_flavoured(self.file.writable)

    def seekable(self) -> bool:
        return call_os_flavoured(self.file.seekable)

    def isatty(self) -> bool:
        return call_os_flavoured(self.file.isatty)

    def fileno(self) -> int:
        return self.file.fileno()

    def pread(self, length: int, offset: int) -> bytes:
        return self._run(self.file.pread(length, offset))

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._run(self.file.write(data))

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        return self._run(self.file.pwrite(data, offset))

    def write_parallel(
        self, pieces: Iterable[tuple[int, bytes | bytearray | memoryview]], concurrency: int = 16
    ) -> int:
        return self._run(self.file.write_parallel(list(pieces), concurrency))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence in (os.SEEK_END, os.SEEK_DATA, os.SEEK_HOLE) and not self.file.closed:
            # as lseek: from the file's length now, another client's appends and truncates counted
            self._run(self.file.fs._refresh(self.file.handle))
        return call_os_flavoured(self.file.seek, offset, whence)

    def tell(self) -> int:
        return call_os_flavoured(self.file.tell)

    def truncate(self, size: int | None = None) -> int:
        return self._run(self.file.truncate(size))

    def flush(self) -> None:
        self._run(self.file.flush())

    def fsync(self) -> None:
        self._run(self.file.fsync())

    def stat(self) -> StatResult:
        return self._run(self.file.stat())

    def close(self) -> None:
        # closing a closed file does nothing, also once its file system is closed; closing an open
        # file after its file system closed fails (its buffered writes could not be flushed)
        if not self.file.closed:
            self._loop.run(self.file.close())

    def __enter__(self) -> SyncFile:
        self.file._check()  # a closed file refuses ``with``, as Python's do
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncFileSystem:
    """The synchronous face of :class:`FileSystem`: every method blocks until done. Its calls run
    on a private event loop thread, so it can be used from any thread (and from several)."""

    def __init__(self, fs: FileSystem, loop: _LoopThread) -> None:
        self.aio = fs
        self._loop = loop
        # closes take turns: a second one (another thread's) waits for the first, then does
        # nothing (it ran alongside, and its calls failed, CANCELLED, as the first ended the loop)
        self._closing = threading.Lock()
        # one no longer referenced (``SyncFileSystem.connect(cfg).read_file(p)``; its files keep
        # it) is closed then, as Python closes a file object it collects: its thread and
        # connections stayed for the life of the process
        self._finalizer = weakref.finalize(self, _close_dropped, fs, loop, self._closing)
        self._finalizer.atexit = False  # at exit: _close_at_exit

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "an fs3 SyncFileSystem cannot be pickled (it holds connections and a thread): call "
            "SyncFileSystem.connect(config) in each worker process"
        )

    @classmethod
    def connect(
        cls,
        config: ClientConfig | str | os.PathLike[str] | None = None,
        *,
        user: common_pb2.UserInfo | None = None,
        timeout_s: float = 30.0,
    ) -> SyncFileSystem:
        """Connect as :meth:`FileSystem.connect` does."""
        loop = _LoopThread()
        try:
            fs = loop.run(FileSystem.connect(config, user=user, timeout_s=timeout_s))
        except BaseException:
            loop.stop()
            raise
        client = cls(fs, loop)
        _OPEN_CLIENTS.add(client)
        return client

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
        return self._loop.run(fn(*args, **kw))

    def _on(
        self, paths: tuple[str | bytes, ...], fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any
    ) -> T:
        """:meth:`_call` for an operation on ``paths``: its OSError names them in ``filename`` (and
        ``filename2``), as open(), os.stat and os.rename name theirs."""
        try:
            return self._call(fn, *args, **kw)
        except OSError as e:
            if isinstance(e, FS3Error) and e.filename is None:
                e.filename = paths[0]
                if len(paths) > 1:
                    e.filename2 = paths[1]
            raise

    def open(self, path: str | bytes, mode: str = "r", perm: int = 0o644) -> SyncFile:
        return SyncFile(self._on((path,), self.aio.open, path, mode, perm), self._loop, self)

    def open_flags(self, path: str | bytes, flags: int, perm: int = 0o644) -> SyncFile:
        return SyncFile(self._on((path,), self.aio.open_flags, path, flags, perm), self._loop, self)

    def read_batch(self, requests: Sequence[tuple[SyncFile | File | str | bytes, int, int]]) -> list[bytes]:
        reqs = [(f.file if isinstance(f, SyncFile) else f, o, n) for f, o, n in requests]
        return self._call(self.aio.read_batch, reqs)

    def stat(self, path: str | bytes, follow_symlinks: bool = True) -> StatResult:
        return self._on((path,), self.aio.stat, path, follow_symlinks)

    def exists(self, path: str | bytes) -> bool:
        return self._on((path,), self.aio.exists, path)

    def listdir(self, path: str | bytes = "/") -> list[str] | list[bytes]:
        return self._on((path,), self.aio.listdir, path)

    def scandir(self, path: str | bytes) -> list[m.DirEntry]:
        """The entries of a directory (name, inode id, type), all of them."""

        async def entries() -> list[m.DirEntry]:
            return [e async for e in self.aio.scandir(path)]

        return self._on((path,), entries)

    def mkdir(self, path: str | bytes, mode: int = 0o755, *, parents: bool = False) -> None:
        self._on((path,), self.aio.mkdir, path, mode, parents=parents)

    def makedirs(self, path: str | bytes, mode: int = 0o755) -> None:
        self._on((path,), self.aio.makedirs, path, mode)

    def rmdir(self, path: str | bytes, *, recursive: bool = False) -> None:
        self._on((path,), self.aio.rmdir, path, recursive=recursive)

    def unlink(self, path: str | bytes) -> None:
        self._on((path,), self.aio.unlink, path)

    remove = unlink

    def rename(
        self, src: str | bytes, dst: str | bytes, *, noreplace: bool = False, exchange: bool = False
    ) -> None:
        self._on((src, dst), self.aio.rename, src, dst, noreplace=noreplace, exchange=exchange)

    def symlink(self, target: str | bytes, path: str | bytes) -> None:
        self._on((target, path), self.aio.symlink, target, path)

    @overload
    def readlink(self, path: str) -> str: ...
    @overload
    def readlink(self, path: bytes) -> bytes: ...
    def readlink(self, path: str | bytes) -> str | bytes:
        return self._on((path,), self.aio.readlink, path)

    def link(self, src: str | bytes, dst: str | bytes) -> None:
        self._on((src, dst), self.aio.link, src, dst)

    def mknod(self, path: str | bytes, mode: int, rdev: int = 0) -> None:
        self._on((path,), self.aio.mknod, path, mode, rdev)

    def chmod(self, path: str | bytes, mode: int) -> None:
        self._on((path,), self.aio.chmod, path, mode)

    def chown(self, path: str | bytes, uid: int = -1, gid: int = -1) -> None:
        self._on((path,), self.aio.chown, path, uid, gid)

    def utime(self, path: str | bytes, ns: tuple[int, int] | None = None) -> None:
        self._on((path,), self.aio.utime, path, ns)

    def truncate(self, path: str | bytes, size: int) -> None:
        self._on((path,), self.aio.truncate, path, size)

    def statfs(self) -> m.StatFsRsp:
        return self._call(self.aio.statfs)

    def set_layout(
        self, path: str | bytes, *, chunk_size: int = 0, stripe_count: int = 0, chain_table_id: int = 0
    ) -> m.Layout:
        return self._on(
            (path,),
            self.aio.set_layout,
            path,
            chunk_size=chunk_size,
            stripe_count=stripe_count,
            chain_table_id=chain_table_id,
        )

    def getxattr(self, path: str | bytes, name: str | bytes) -> bytes:
        return self._on((path,), self.aio.getxattr, path, name)

    def setxattr(self, path: str | bytes, name: str | bytes, value: bytes, flags: int = 0) -> None:
        self._on((path,), self.aio.setxattr, path, name, value, flags)

    def listxattr(self, path: str | bytes) -> list[str]:
        return self._on((path,), self.aio.listxattr, path)

    def removexattr(self, path: str | bytes, name: str | bytes) -> None:
        self._on((path,), self.aio.removexattr, path, name)

    def read_file(self, path: str | bytes) -> bytes:
        return self._on((path,), self.aio.read_file, path)

    def write_file(self, path: str | bytes, data: bytes, perm: int = 0o644) -> None:
        self._on((path,), self.aio.write_file, path, data, perm)

    @property
    def closed(self) -> bool:
        return self._loop.closed

    def close(self) -> None:
        """Close every connection; calls other threads still have under way fail (CANCELLED), and
        so does any call made after. Closing twice does nothing."""
        with self._closing:
            _close(self.aio, self._loop)
        self._finalizer.detach()

    def __enter__(self) -> SyncFileSystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(fs: FileSystem, loop: _LoopThread) -> None:
    if loop.closed or os.getpid() != loop.pid:
        return
    try:
        loop.run(fs.close())
    finally:
        loop.stop()


def _close_dropped(fs: FileSystem, loop: _LoopThread, closing: threading.Lock) -> None:
    """Close the client of a SyncFileSystem that was collected unclosed, in a thread of its own:
    the collection may happen in the client's loop thread (a close there would wait for itself)
    or in a thread that must not wait. An exit and a fork wait for these closes; at exit (an
    atexit hook dropped it) the close is made at once."""
    if loop.closed or os.getpid() != loop.pid:
        return

    def run() -> None:
        try:
            with closing:
                _close(fs, loop)
        except Exception as e:  # noqa: BLE001 - nobody is left to raise it to
            import logging

            logging.getLogger(__name__).warning("closing an unreferenced fs3 client failed: %s", e)
        finally:
            _DROPPED_CLOSES.discard(threading.current_thread())

    here = threading.current_thread() is not loop.thread
    if _EXITING and here:
        run()  # (threads started now are not waited for)
    else:
        thread = threading.Thread(target=run, name="fs3-client-close")
        _DROPPED_CLOSES.add(thread)
        try:
            thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            _DROPPED_CLOSES.discard(thread)
            if here:
                run()
    # once the close is on its way: a ResourceWarning made an error stops nothing
    warnings.warn("an fs3 SyncFileSystem was not closed: closed now", ResourceWarning, stacklevel=1)


#: closes of clients collected unclosed (_close_dropped), in threads of their own: an exit waits
#: for them (they wrote nothing, the process gone before them), and so does a fork (one inside
#: gRPC made the child crash, SIGSEGV)
_DROPPED_CLOSES: set[threading.Thread] = set()
_EXITING = False
#: how long a fork waits for those closes
_FORK_WAIT_S = 10.0


def _wait_dropped_closes(timeout_s: float | None = None) -> None:
    for thread in list(_DROPPED_CLOSES):
        if thread is not threading.current_thread():
            thread.join(timeout_s)


os.register_at_fork(before=lambda: _wait_dropped_closes(_FORK_WAIT_S))


#: clients not closed yet: closed at interpreter exit, so the writes of files still open there are
#: flushed, as Python flushes its own files at exit (a script that ended without closing lost them)
_OPEN_CLIENTS: weakref.WeakSet[SyncFileSystem] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close the clients still open at exit, writing what their open files hold. A first Ctrl-C
    meanwhile is held (said so): it cancelled the closes, and the writes the program had made,
    which write() had taken, were lost, the client's session left to expire; a second one
    abandons them."""
    global _EXITING
    _EXITING = True
    clients = list(_OPEN_CLIENTS)
    if not clients and not _DROPPED_CLOSES:
        return
    held: list[int] = []

    def hold(_signum: int, _frame: object) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(1)
        sys.stderr.write("fs3: writing what files left open hold before exit (Ctrl-C again to abandon it)\n")

    previous = (
        signal.signal(signal.SIGINT, hold) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        for client in clients:
            try:
                client.close()
            except Exception as e:  # noqa: BLE001 - one client's failure must not keep the others open
                import logging

                logging.getLogger(__name__).warning("closing an fs3 client at exit failed: %s", e)
        _wait_dropped_closes()
    except KeyboardInterrupt:
        sys.stderr.write("fs3: abandoned the writes of files left open at exit\n")
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


__all__ = ["SyncFile", "SyncFileSystem"]
