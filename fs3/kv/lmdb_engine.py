"""The ``lmdb`` engine: the embedded default, shared by several processes on one host.

How it works, and why:

* **Reads** run on the caller's event loop against an LMDB read transaction opened at the
  transaction's first read (about a microsecond per point read, so thread hand-offs would cost more
  than they save); long scans hand the loop back every 512 rows.
* **Commits** go to one committer thread per environment and process. It takes every queued
  transaction, validates each against the live store (value validation, see :mod:`fs3.kv.txn`) and
  applies the ones that pass, all inside one LMDB write transaction, so later members of a batch are
  validated against the effects of earlier ones. LMDB's write lock is a process-shared mutex, so
  commits from several processes serialise and see each other's writes; validation therefore
  detects conflicts across processes too.
* **Commits on the caller's event loop while the disk is fast.** Each of py-lmdb's reads and writes
  lets go of the GIL, so a commit thread and a busy event loop hand the GIL (and the CPU) back and
  forth at every key: about 20 thread switches per batch here, which cost the meta server more CPU
  than the commits themselves (a create: 134 us of server CPU, 100 with the loop committing). So
  while a batch's commit and flush take less than :data:`LOOP_COMMIT_MAX_S` on average, the loop
  commits the transactions its callers queued itself, flushes, and answers them: the loop stands
  still for that time (about half a millisecond per batch on an SSD), no thread runs. Its batch
  takes what comes within a turn or two of the loop, longer while callers of its previous batch
  have yet to come back (see :meth:`_Committer._gather`). A slower disk (or a larger average
  batch) sends commits to the commit thread, so reads are served while a flush waits; so does a
  write lock that another writer holds (see :meth:`_Committer._baton`): the loop never waits for
  another process. A committer in a process of its own (no GIL to share; the loop sent each turn's
  requests over a socketpair) was tried too, on two cores shared with the clients: 7,700-8,100
  creates/s against 9,400 with the loop committing. Its batches were a third as full, the loop
  spent on more, smaller turns what it no longer spent committing, and the clients woke more often.
* **Durability by group commit.** The environment runs with LMDB's ``metasync=False``: committing
  a batch writes its pages, fsyncs them, then writes the new meta page without an fsync. A flush
  thread then fsyncs the file, and only then are the batch's callers acknowledged. A batch of any
  size thus costs two fsyncs; the next batch is taken once this one's callers have come back (see
  :class:`_Rejoin`), so batches stay full. We deliberately do not run with ``sync=False`` and a
  flusher alone: LMDB documents that mode as able to corrupt the environment on a system crash,
  since nothing then orders a meta page after the data pages it points to, whereas with
  ``metasync=False`` it guarantees integrity and a crash loses at most unacknowledged batches. One
  consequence: a reader may see a commit up to one fsync before it is durable, so after a power
  cut a read-only transaction may have seen a commit that did not survive; a writing transaction
  that read it is acknowledged only after an fsync covering both, so no acknowledged commit ever
  depends on a lost one.
* **A failed fsync fails the store.** After an fsync error the kernel may have dropped the pages
  it could not write and report the next fsync as a success, so retrying would acknowledge commits
  that are not on disk. The batches waiting for that fsync fail (their changes may or may not have
  survived), and so does every later commit of this process, until the daemon is restarted after
  the disk has been seen to (as PostgreSQL does since "fsyncgate").
* **Dead readers.** A process killed during a transaction leaves its LMDB reader slot behind, which
  keeps every page freed since from being reused: the file would grow until the store is full.
  Stale slots are cleared when the environment opens, every ``READER_CHECK_S`` while it commits,
  and before a commit that found the store full is given up.
* **Growing the file.** See :class:`FileExtender`.
* **Long keys.** See :mod:`fs3.kv.lmdb_layout`.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import logging
import math
import os
import threading
import time

import lmdb

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import CommitStats, Database, StoreSpace, Transaction
from fs3.kv.lmdb_layout import Snapshot, WriteView
from fs3.kv.txn import (
    COMMIT_CALLER,
    COMMIT_DEADLINE,
    BatchValidator,
    BufferedTransaction,
    CommitRequest,
)

log = logging.getLogger(__name__)


DEFAULT_MAP_SIZE = 256 << 30
DEFAULT_MAX_READERS = 1024
#: the event loop commits its callers' transactions itself while a batch's commit and flush take less
#: than this on average (see the module docstring); otherwise the commit thread does
LOOP_COMMIT_MAX_S = 0.002
#: at most how long a batch the event loop gathers stays open for callers of the loop's previous
#: batch that have not sent their next transaction yet (see _Committer._gather), and never longer
#: than a batch's commit and flush take on average
GATHER_WAIT_MAX_S = 0.001
#: a batch stays open while transactions keep coming for at most this long
GATHER_OPEN_MAX_S = 0.002
#: how long the loop sleeps between two looks for them when nothing else has come
GATHER_NAP_S = 0.00003
#: weight of the newest batch in that average
_AVERAGE_WEIGHT = 0.2
#: how often the committer clears the reader slots of dead processes (see the module docstring)
READER_CHECK_S = 10.0
# Bound one batch's latency and the size of one LMDB write transaction.
MAX_BATCH = 4096
MAX_BATCH_BYTES = 64 << 20
#: Once the room ahead of LMDB's data (see FileExtender) is below this and cannot be extended (the
#: disk is full, or the map), only transactions that remove something are committed: the rest fail
#: with KV_STORE_FULL (ENOSPC), so that unlinks, rmdirs and garbage collection, which need a few
#: new pages themselves (LMDB copies on write), can still free room; and the few small writes that
#: must go on however full it is (Transaction.use_reserve: mgmtd's lease, readers' sessions).
RESERVE = 2 << 20
#: A file system with less than this available counts as full (see file_system_full).
FULL_BYTES = 2 * MAX_BATCH_BYTES

Batch = list[tuple[CommitRequest, asyncio.Future[None]]]


def errno_of(exc: OSError | lmdb.Error) -> int | None:
    """The errno behind an OSError or an LMDB error (LMDB passes the system's through as its code;
    where that is missing, only the text tells a full disk)."""
    if isinstance(exc, OSError):
        return exc.errno
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:
        return code
    return next((e for e in (errno.ENOSPC, errno.EDQUOT) if os.strerror(e) in str(exc)), None)


def lmdb_eio(exc: BaseException) -> bool:
    """Whether ``exc`` is LMDB's EIO (py-lmdb raises a system error it has no class for as the plain
    lmdb.Error, with only strerror's text to tell which): a failed write of pages or fdatasync,
    and also a write of pages that a full disk cut short (see :func:`file_system_full`)."""
    return type(exc) is lmdb.Error and (
        getattr(exc, "code", None) == errno.EIO or os.strerror(errno.EIO) in str(exc)
    )


def _need(batch: Batch) -> int:
    """A generous bound on the new bytes of pages ``batch`` may write (LMDB copies each page it
    changes, and the branch pages above it)."""
    return sum(2 * req.size + (64 << 10) for req, _ in batch)


def file_system_full(path: str) -> bool:
    """Whether the file system holding ``path`` has less than FULL_BYTES left for this process
    (the blocks kept for root count for root). LMDB reports a write of its pages that the disk cut
    short as EIO: on a file system this full, that is ENOSPC, not a failing disk."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return free_bytes(st) < FULL_BYTES


def free_bytes(st: os.statvfs_result) -> int:
    """Bytes of a file system (``st``, a statvfs) this process may still write: the blocks kept
    for root count for root."""
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _disk_failure(exc: OSError | lmdb.Error) -> bool:
    """Whether an error of a write transaction says the disk (or the environment) failed, rather
    than that the batch was refused (a bad key size, too many pages...). py-lmdb raises the plain
    ``lmdb.Error`` for the system errors it has no class for (an EIO of its fdatasync or of a page
    write), ``DiskError`` for ENOSPC, and ``PanicError`` once a failed meta-page write has made the
    environment unusable."""
    if isinstance(exc, OSError):
        return True  # our own writes and fdatasyncs ahead of LMDB's data (FileExtender)
    if isinstance(exc, (lmdb.PanicError, lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.DiskError)):
        return True
    return type(exc) is lmdb.Error


class _Gathering:
    """The transactions an event loop has queued for its next batch (see _Committer._gather)."""

    __slots__ = ("items", "callers", "since", "seen", "napped", "deadline")

    def __init__(self, since: float) -> None:
        self.items: Batch = []
        self.callers: set[object] = set()  # their COMMIT_CALLERs
        self.since = since  # when the first was queued, time.monotonic()
        self.seen = 0  # how many there were at the last look
        self.napped = 0.0  # seconds the loop slept waiting for more
        self.deadline = math.inf  # the earliest of their deadlines (CommitRequest.deadline)


class _Rejoin:
    """Signals that the event loops of a batch's callers have run them after their acknowledgement.

    Callers that commit in a loop queue their next transaction in that very step, so once this is
    set the next batch can take them all. Without the wait, callers split into two groups that
    alternate between consecutive batches, each batch half as full and each fsync covering half as
    many transactions.
    """

    __slots__ = ("_left", "_lock", "_event")

    def __init__(self, loops: int) -> None:
        self._left = loops
        self._lock = threading.Lock()
        self._event = threading.Event()

    def loop_done(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self._event.set()

    def wait(self, timeout: float) -> None:
        self._event.wait(timeout)


class _Committer:
    """One environment's commit and flush threads in this process.

    The commit thread applies queued transactions in batches; a batch is acknowledged once an fsync
    that began after its commit has ended. With ``rejoin_s > 0`` the commit thread makes that fsync
    itself and then waits up to ``rejoin_s`` (see :class:`_Rejoin`) before taking the next batch;
    with 0 it hands the batch to the flush thread and carries on at once.
    """

    def __init__(self, env: lmdb.Environment, path: str, rejoin_s: float) -> None:
        self._env = env
        self._extender = FileExtender(env, path, min_free=0)
        # Write transactions of this process, on the commit thread or an event loop, one at a time;
        # across processes, the baton (see _baton) comes first.
        self._writer = threading.Lock()
        self._baton_fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
        # Transactions each event loop will commit itself shortly (see _gather and _commit_here).
        self._here: dict[asyncio.AbstractEventLoop, _Gathering] = {}
        # The loop that committed the last batch here, and who that batch's callers were (_gather).
        self._last_loop: asyncio.AbstractEventLoop | None = None
        self._last_callers: set[object] = set()
        self._last_at = 0.0  # when it was committed, time.monotonic()
        # Averages of a batch's commit and of a flush, seconds (see LOOP_COMMIT_MAX_S).
        self._commit_avg = 0.0
        self._sync_avg = 0.0
        self._reserve = min(RESERVE, env.info()["map_size"] // 16)  # a small map keeps less
        self._path = path
        self._rejoin_s = rejoin_s
        self._queue: list[tuple[CommitRequest, asyncio.Future[None]]] = []
        self._cond = threading.Condition(threading.Lock())
        self._idle = False
        self._stopping = False
        # Durability bookkeeping, under _flush_cond: batches committed but not yet known durable.
        self._flush_cond = threading.Condition(threading.Lock())
        self._committed_seq = 0
        self._durable_seq = 0
        self._unsynced: collections.deque[tuple[int, Batch, _Rejoin]] = collections.deque()
        self._flush_stopping = False
        # Set (under _flush_cond) once an fsync has failed: every commit fails from then on.
        self._failed: FS3Error | None = None
        self._reader_check_at = time.monotonic() + READER_CHECK_S
        # Counters for commit_stats(): the first four are updated under the writer lock; fsyncs
        # happen on any thread, so their two are kept under _flush_cond.
        self._batches = 0
        self._transactions = 0
        self._conflicts = 0
        self._refused = 0
        self._commit_seconds = 0.0
        self._fsyncs = 0
        self._fsync_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name=f"kv-commit:{path}", daemon=True)
        self._flusher = threading.Thread(target=self._flush_loop, name=f"kv-flush:{path}", daemon=True)
        self._thread.start()
        self._flusher.start()

    def submit(self, req: CommitRequest) -> asyncio.Future[None]:
        """Queue ``req`` for commit: the future its caller awaits, done once the commit is durable
        (or failed). Not a coroutine: one frame fewer on a commit's way up and down, and no frame
        of this in a failure's traceback (which would hold the future holding the failure, a
        reference cycle keeping the request's writes on every conflict)."""
        loop = asyncio.get_running_loop()
        deadline = COMMIT_DEADLINE.get()
        if deadline is not None:
            left = deadline - loop.time()
            if left <= 0:
                raise _late()
            req.deadline = time.monotonic() + left  # the commit thread's clock
        fut = loop.create_future()
        failed = self._failed
        if failed is not None:
            raise FS3Error(failed.code, failed.message)
        if self._stopping:
            raise self._closed()
        if self._commit_avg + self._sync_avg < LOOP_COMMIT_MAX_S:
            self._queue_here(loop, (req, fut))
        else:
            self._to_thread([(req, fut)])
        return fut

    def _queue_here(
        self, loop: asyncio.AbstractEventLoop, item: tuple[CommitRequest, asyncio.Future[None]]
    ) -> None:
        with self._cond:  # not while stop() moves what loops queued to the thread
            if self._stopping:
                raise self._closed()
            here = self._here.get(loop)
            if here is None:
                here = self._here[loop] = _Gathering(time.monotonic())
                loop.call_soon(self._gather, loop)
            here.items.append(item)
            deadline = item[0].deadline
            if deadline is not None and deadline < here.deadline:
                here.deadline = deadline
            caller = COMMIT_CALLER.get()
            if caller is not None:
                here.callers.add(caller)

    def _gather(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, a turn after transactions were queued here: commit them (_commit_here)
        unless more may be about to join. The batch stays open

        * while transactions keep coming (for at most GATHER_OPEN_MAX_S): some came in the loop's
          last turn, so requests its next poll reads may bring more (with two clients' connections,
          batches that took what one turn brought took each one's requests in turn: 8,000
          creates/s against 7,200);
        * while a caller of the loop's previous batch, answered just before this batch began
          (within GATHER_WAIT_MAX_S), has sent nothing yet (COMMIT_CALLER): the loop sleeps a few
          microseconds at a time, and polls, for no longer in all than a batch's commit and flush
          take on average (and GATHER_WAIT_MAX_S), since waiting longer would cost more than the
          commit it saves; a caller that went away is thus waited for once.
          Callers answered together come back at slightly different times (their processes
          share cores), and a batch committed as soon as the first are back splits them into
          groups that alternate between batches, each half as full, each costing a commit and a
          flush. ``bench/meta_bench.py``, 16 clients: with a connection each, batches of 8 and
          6,600-6,800 creates/s (116-118 us of server CPU each) before, batches of 16 and
          8,300-8,500/s (93-96 us) since; on two shared connections 7,000-7,800/s (101-110 us)
          before, 7,500-7,900/s (94-97 us) since.
        """
        here = self._here.get(loop)
        if here is None:  # stop() took them
            return
        count = len(here.items)
        now = time.monotonic()
        if count > here.seen and now - here.since < GATHER_OPEN_MAX_S:
            here.seen = count
            loop.call_soon(self._gather, loop)
            return
        commit_s = self._commit_avg + self._sync_avg
        if (
            self._last_loop is loop
            and here.since - self._last_at < GATHER_WAIT_MAX_S
            and not self._last_callers <= here.callers
            and here.napped < min(GATHER_WAIT_MAX_S, commit_s)
            # nor while a caller whose deadline comes first would be told its commit failed
            and here.deadline - now > GATHER_WAIT_MAX_S + commit_s
        ):
            time.sleep(GATHER_NAP_S)  # (about 100 us here: the timer slack)
            here.napped += time.monotonic() - now
            loop.call_soon(self._gather, loop)
            return
        self._last_loop, self._last_callers = loop, here.callers
        self._commit_here(loop)
        self._last_at = time.monotonic()

    def _closed(self) -> FS3Error:
        return FS3Error(StatusCode.KV_STORE_FAILED, f"kv store {self._path} is closed")

    def _to_thread(self, batch: Batch) -> None:
        with self._cond:
            if self._stopping:
                _deliver(batch, self._closed())
                return
            self._queue += batch
            if self._idle:
                self._cond.notify()

    def _commit_here(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: commit and flush the transactions it queued, and answer them; or hand them to
        the commit thread when this process's commit thread or another process is writing."""
        here = self._here.pop(loop, None)
        queued = here.items if here is not None else None
        while queued:
            count = _batch_length(queued)
            batch, queued = queued[:count], queued[count:]
            if not self._writer.acquire(blocking=False):
                self._to_thread(batch + queued)
                return
            try:
                # (the writer lock first: stop() closes nothing while it is held) a store whose
                # file is to grow: the thread writes the zeros, the loop serves on
                if self._stopping or self._extender.low() or not self._baton(wait=False):
                    self._to_thread(batch + queued)  # fails them once stopping
                    return
                try:
                    committed, failed = self._write(batch)
                finally:
                    self._baton_release()
                for items, error in failed:
                    _deliver(items, error, here=loop)
                if committed:
                    # still holding the writer lock, which stop() waits for: the flush is done
                    # before the environment closes (a flush of a closed one failed the store)
                    self._committed(committed, here=loop)
            finally:
                self._writer.release()

    def _baton(self, *, wait: bool) -> bool:
        """Take this store's write baton for this process: an exclusive flock of its data file, which
        every process's committer holds while it writes (the thread waits for it, an event loop does
        not), taken before LMDB's write lock. An event loop holding the baton thus never waits for
        LMDB's write lock either, even while another process is stopped (SIGSTOP) mid-commit."""
        try:
            fcntl.flock(self._baton_fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def _baton_release(self) -> None:
        fcntl.flock(self._baton_fd, fcntl.LOCK_UN)

    @property
    def failure(self) -> FS3Error | None:
        """Set once an fsync failed (see the module docstring)."""
        return self._failed

    def stats(self) -> CommitStats:
        with self._flush_cond:
            fsyncs, fsync_seconds = self._fsyncs, self._fsync_seconds
        return CommitStats(
            self._batches,
            self._transactions,
            self._conflicts,
            self._commit_seconds,
            fsyncs,
            fsync_seconds,
            self._refused,
        )

    def space(self) -> StoreSpace:
        info = self._env.info()
        psize = self._env.stat()["psize"]
        used = (info["last_pgno"] + 1) * psize - self._extender.reusable()
        return StoreSpace(used, info["map_size"], free_bytes(os.statvfs(self._path)))

    def stop(self) -> None:
        """Commit and flush whatever is queued, then end the threads (blocks until they have)."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            # what event loops have not committed yet: the thread commits it, answering through
            # their loops (a loop that has closed never hears)
            for loop in list(self._here):  # (an event loop may pop its own meanwhile)
                here = self._here.pop(loop, None)
                if here is not None:
                    self._queue += here.items
            self._last_loop = None
            self._cond.notify()
        self._thread.join()
        with self._flush_cond:
            self._flush_stopping = True
            self._flush_cond.notify()
        self._flusher.join()
        with self._writer:  # an event loop's commit and flush under way end first; later ones see _stopping
            self._extender.close()
            os.close(self._baton_fd)

    def _take_batch(self) -> list[tuple[CommitRequest, asyncio.Future[None]]] | None:
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._idle = True
                self._cond.wait()
                self._idle = False
            count = _batch_length(self._queue)
            batch = self._queue[:count]
            del self._queue[:count]
            return batch

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            self._run_batch(batch)
            del batch  # not kept while the thread waits for the next (its requests hold their writes)

    def _run_batch(self, batch: Batch) -> None:
        with self._writer:
            self._baton(wait=True)
            try:
                committed, failed = self._write(batch)
            finally:
                self._baton_release()
        for items, error in failed:
            _deliver(items, error)
        if committed:
            self._committed(committed)

    def _write(self, batch: Batch) -> tuple[Batch, list[tuple[Batch, FS3Error]]]:
        """Commit ``batch`` (holding the writer lock and the baton): the transactions committed, and
        the failed ones with their errors."""
        if self._failed is not None:
            return [], [(batch, self._failed)]
        if time.monotonic() >= self._reader_check_at:
            self._check_readers()
        error = self._commit(batch)
        if error is None:
            return batch, []
        if len(batch) == 1:
            return [], [(batch, error)]
        # Fail only the transactions that fail on their own (e.g. the one too big to fit).
        committed: Batch = []
        failed: list[tuple[Batch, FS3Error]] = []
        for item in batch:
            error = self._failed or self._commit([item])
            if error is None:
                committed.append(item)
            else:
                failed.append(([item], error))
        return committed, failed

    def _commit(
        self, batch: list[tuple[CommitRequest, asyncio.Future[None]]], *, retried: bool = False
    ) -> FS3Error | None:
        """Validate and apply ``batch`` in one LMDB write transaction; an error means none of it
        was committed."""
        start = time.perf_counter()
        room: int | None = None  # zeroed bytes ahead of LMDB's data when the batch began
        try:
            with self._env.begin(write=True) as txn:
                room = self._extender.extend_if_needed()  # under the write lock, see FileExtender
                growing = time.perf_counter() - start  # (not the loop's: see _commit_here)
                if room < self._reserve:
                    room += self._extender.reusable()
                full = room < self._reserve
                view = WriteView(txn)
                # a write transaction's id is the last committed one's plus one
                check = BatchValidator(txn.id() - 1)
                validated = conflicts = 0
                now = time.monotonic()  # the write lock is held from here: what begins now is made
                for req, fut in batch:
                    # A caller that gave up will not look at the outcome; skipping is allowed.
                    if fut.cancelled():
                        continue
                    req.refused = None
                    if req.deadline is not None and now >= req.deadline:
                        # its caller has given up (waiting for the write lock, held by another
                        # process): made now, the change would come after the caller was told
                        # it failed, and after what it did next
                        req.refused = _late()
                        continue
                    # what may use the reserve takes half of it at most (mgmtd's lease all):
                    # the rest stays the removals' (readers' sessions could take it all)
                    if full and not (
                        req.frees or req.reserved == 2 or (req.reserved == 1 and room >= self._reserve // 2)
                    ):
                        req.refused = self._full_error(room)
                        self._refused += 1
                        continue
                    validated += 1
                    if not check.validate_and_apply(view, req):
                        conflicts += 1
            took = time.perf_counter() - start
            self._commit_seconds += took
            self._commit_avg += (took - growing - self._commit_avg) * _AVERAGE_WEIGHT
            self._batches += 1
            self._transactions += validated
            self._conflicts += conflicts
            return None
        except lmdb.MapFullError:
            if not retried and self._check_readers():
                # dead processes' readers were keeping freed pages from reuse
                return self._commit(batch, retried=True)
            size = self._env.info()["map_size"]
            return FS3Error(
                StatusCode.KV_STORE_FULL,
                f"kv store {self._path} is full (map_size {size}): remove entries, or restart with a larger map_size",
            )
        except (lmdb.Error, OSError) as e:
            if errno_of(e) in (errno.ENOSPC, errno.EDQUOT) or (
                # LMDB answers a short write of its pages with EIO: ENOSPC, where the disk is full
                # and the batch may have needed more than the zeros ahead of LMDB's data (writes
                # into those cannot run out of space: an EIO there is the disk's)
                lmdb_eio(e) and file_system_full(self._path) and (room is None or room < _need(batch))
            ):
                return FS3Error(
                    StatusCode.KV_STORE_FULL, f"kv commit failed, the disk of {self._path} is full: {e}"
                )
            if _disk_failure(e):
                # LMDB's own fsync of the batch's pages, or a write, failed: the disk is not to be
                # trusted with the batches before it either (see the module docstring)
                return self._fail_store(f"kv commit failed: {e}")
            log.exception("kv commit failed path=%s batch=%d", self._path, len(batch))
            return FS3Error(StatusCode.KV_STORE_FAILED, f"kv commit failed: {e!r}")
        except Exception as e:  # an LMDB failure fails the batch, never the thread
            log.exception("kv commit failed path=%s batch=%d", self._path, len(batch))
            return FS3Error(StatusCode.KV_STORE_FAILED, f"kv commit failed: {e!r}")

    def _full_error(self, room: int) -> FS3Error:
        return FS3Error(
            StatusCode.KV_STORE_FULL,
            f"kv store {self._path} is full ({room >> 10} KiB left, kept for removals): "
            "free space on its disk (or raise map_size) to write again",
        )

    def _check_readers(self) -> int:
        """Clear the reader slots of dead processes; how many there were."""
        self._reader_check_at = time.monotonic() + READER_CHECK_S
        try:
            stale = self._env.reader_check()
        except lmdb.Error:
            log.exception("kv reader check failed path=%s", self._path)
            return 0
        if stale:
            log.warning("kv cleared the readers of dead processes path=%s count=%d", self._path, stale)
        return stale

    def _fail_store(self, what: str, here: asyncio.AbstractEventLoop | None = None) -> FS3Error:
        """An fsync (or a write) failed: fail every batch not yet acknowledged and every later
        commit (see the module docstring). Returns the error."""
        with self._flush_cond:
            if self._failed is None:
                self._failed = FS3Error(
                    StatusCode.KV_STORE_FAILED,
                    f"kv store {self._path} failed ({what}); restart once the disk has been checked",
                )
                log.critical("kv store failed path=%s error=%s", self._path, what)
            error = self._failed
        self._fail_unsynced(error, here)
        return error

    def _committed(self, batch: Batch, here: asyncio.AbstractEventLoop | None = None) -> None:
        """Acknowledge ``batch`` once durable. ``here``: the event loop running this, which
        committed the batch and flushes it itself (see _commit_here)."""
        rejoin = None if here is not None else _Rejoin(len({fut.get_loop() for _, fut in batch}))
        inline = here is not None or self._rejoin_s > 0
        with self._flush_cond:
            failed = self._failed
            if failed is None:
                self._committed_seq += 1
                seq = self._committed_seq
                self._unsynced.append((seq, batch, rejoin))
                if not inline:
                    self._flush_cond.notify()
        if failed is not None:  # an fsync failed while this batch was committed
            _deliver(batch, failed, here=here)
            return
        # The next batch's commit fsync would also cover this batch's meta page, but only if that
        # commit wrote anything (LMDB skips the fsync otherwise), which is not observable here; so
        # acknowledgements come from an explicit fsync alone.
        if not inline:
            return
        # This thread would only wait for the flush thread anyway, so it flushes itself.
        try:
            self._sync()
        except Exception as e:
            log.exception("kv fsync failed path=%s", self._path)
            self._fail_store(f"fsync failed: {e!r}", here=here)
            return
        self._mark_durable(seq, here=here)
        if rejoin is not None:
            rejoin.wait(self._rejoin_s)

    def _flush_loop(self) -> None:
        while True:
            with self._flush_cond:
                while self._committed_seq <= self._durable_seq:
                    if self._flush_stopping:
                        return
                    self._flush_cond.wait()
                target = self._committed_seq
            try:
                self._sync()
            except Exception as e:
                log.exception("kv fsync failed path=%s", self._path)
                # Not retried: a retry may succeed without the lost pages (see the module
                # docstring). The batches waiting fail, as does every later commit.
                self._fail_store(f"fsync failed: {e!r}")
                continue  # nothing is committed any more; wait to be stopped
            self._mark_durable(target)

    def _sync(self) -> None:
        start = time.perf_counter()
        self._env.sync(True)
        took = time.perf_counter() - start
        self._sync_avg += (took - self._sync_avg) * _AVERAGE_WEIGHT
        with self._flush_cond:
            self._fsyncs += 1
            self._fsync_seconds += took

    def _fail_unsynced(self, error: FS3Error, here: asyncio.AbstractEventLoop | None = None) -> None:
        with self._flush_cond:
            failed = [item for _, batch, _ in self._unsynced for item in batch]
            self._unsynced.clear()
            self._durable_seq = self._committed_seq
        _deliver(failed, error, here=here)

    def _mark_durable(self, seq: int, here: asyncio.AbstractEventLoop | None = None) -> None:
        done: list[tuple[int, Batch, _Rejoin]] = []
        with self._flush_cond:
            if seq <= self._durable_seq:
                return
            self._durable_seq = seq
            while self._unsynced and self._unsynced[0][0] <= seq:
                done.append(self._unsynced.popleft())
        for _, batch, rejoin in done:
            _deliver(batch, None, rejoin, here)


class FileExtender:
    """Keeps a few MiB of zero-filled space past the end of LMDB's data.

    LMDB appends new pages to its data file, and fsyncing a file whose size changed also commits
    file-system metadata, which here made each commit's fsync about 60% slower than one that only
    overwrites blocks. So the committer appends real zeros ahead of LMDB (not fallocate: ext4 would
    still journal the conversion of unwritten extents). It does so only while holding LMDB's write
    lock, when no process can be writing pages past the last committed one; LMDB ignores the
    file's size, so the extra space is simply overwritten as the store grows.

    Any writer of an environment may use one: call :meth:`extend_if_needed` inside a write
    transaction (the storage daemons' per-target chunk metadata does, see
    ``storage.chunk_meta_store``).
    """

    LOW = 4 << 20  # extend when less than this is left ...
    STEP = 8 << 20  # ... by this much (no further than the map), while the file system has
    # ``min_free`` left: the kv store's committer extends whatever is left (the room is its reserve
    # for removals, see RESERVE); a storage target keeps its disk for chunks below MIN_FREE
    MIN_FREE = 1 << 30

    def __init__(self, env: lmdb.Environment, path: str, *, min_free: int = MIN_FREE) -> None:
        self._env = env
        self._min_free = min_free
        self._page = env.stat()["psize"]
        self._fd = os.open(os.path.join(path, "data.mdb"), os.O_WRONLY | os.O_CLOEXEC)
        self._zeros = bytes(1 << 20)
        # The file's size as last seen: it only grows (here, in LMDB, or in another process's
        # extender), so while this says there is room there is, and no fstat is needed per commit.
        self._size = os.fstat(self._fd).st_size

    def low(self) -> bool:
        """Whether the room ahead of LMDB's data was last seen below LOW: the next
        :meth:`extend_if_needed` may write and flush megabytes of zeros (about 8 ms here)."""
        return self._size - (self._env.info()["last_pgno"] + 1) * self._page < self.LOW

    def extend_if_needed(self) -> int:
        """Extend the room ahead of LMDB's data if it runs low; return the room there is (bytes
        zero-filled past the last page, no further than the map): little once the disk (or the
        map) is full, which the committer's reserve goes by."""
        info = self._env.info()
        used = (info["last_pgno"] + 1) * self._page
        limit = info["map_size"]
        if self._size - used >= self.LOW:
            return min(self._size, limit) - used
        size = self._size = os.fstat(self._fd).st_size
        if size - used >= self.LOW:
            return min(size, limit) - used
        if self._min_free:
            fs = os.fstatvfs(self._fd)
            if fs.f_bavail * fs.f_frsize < self._min_free:
                return max(0, min(size, limit) - used)  # LMDB grows the file itself, as without us
        start = max(size, used)
        end = min(start + self.STEP, limit)
        try:
            for offset in range(start, end, len(self._zeros)):
                os.pwrite(self._fd, self._zeros[: end - offset], offset)
            os.fdatasync(self._fd)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # The disk is full: what was written counts, nothing more can be had
            self._size = os.fstat(self._fd).st_size
            return max(0, min(self._size, limit) - used)
        self._size = max(size, end)
        return max(0, min(self._size, limit) - used)

    def reusable(self) -> int:
        """Roughly how many bytes of the data file LMDB may reuse (pages freed by transactions:
        not the main database's, in an environment without named databases, as the kv store's):
        room for commits to come once the file cannot grow. None at all while a reader holds a
        snapshot older than the last commit: the pages freed since are not free to it, and
        counting them let additions take the room kept for removals."""
        st, info = self._env.stat(), self._env.info()
        for line in self._env.readers().splitlines()[1:]:
            txnid = line.split()[-1]
            if txnid != "-" and int(txnid) < info["last_txnid"]:
                return 0
        held = 2 + st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]  # two meta pages
        return max(0, info["last_pgno"] + 1 - held) * self._page

    def close(self) -> None:
        os.close(self._fd)


def _batch_length(queue: Batch) -> int:
    """How many of ``queue``'s first transactions make one batch (MAX_BATCH, MAX_BATCH_BYTES)."""
    count, size = 0, 0
    for req, _ in queue:
        if count == MAX_BATCH or (count and size + req.size > MAX_BATCH_BYTES):
            break
        count += 1
        size += req.size
    return count


def _late() -> FS3Error:
    return FS3Error(
        StatusCode.DEADLINE_EXCEEDED, "the caller gave up before the transaction could be committed: not done"
    )


def _deliver(
    batch: Batch,
    error: FS3Error | None,
    rejoin: _Rejoin | None = None,
    here: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Hand outcomes to each caller's event loop, one wake-up per loop; ``here``, the loop running
    this, gets its own at once."""
    by_loop: dict[asyncio.AbstractEventLoop, Batch] = {}
    for item in batch:
        by_loop.setdefault(item[1].get_loop(), []).append(item)
    for loop, items in by_loop.items():
        if loop is here:
            _resolve(items, error, rejoin)
            continue
        try:
            loop.call_soon_threadsafe(_resolve, items, error, rejoin)
        except RuntimeError:  # the caller's loop has closed
            if rejoin is not None:
                rejoin.loop_done()


def _resolve(items: Batch, error: FS3Error | None, rejoin: _Rejoin | None) -> None:
    for req, fut in items:
        if fut.done():
            continue
        failed = error if error is not None else req.refused
        if failed is not None:
            fut.set_exception(FS3Error(failed.code, failed.message))
        elif req.ok:
            fut.set_result(None)
        else:
            fut.set_exception(FS3Error(StatusCode.KV_CONFLICT, "a value read by this transaction changed"))
    if rejoin is not None:
        # Queued behind the wake-ups of the tasks just resolved, so it runs after their next step.
        asyncio.get_running_loop().call_soon(rejoin.loop_done)


class _Environment:
    """One open LMDB environment in this process, shared by every handle on its path."""

    def __init__(self, path: str, map_size: int, max_readers: int, rejoin_s: float) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_readers=max_readers,
            max_dbs=0,
            # Each commit fsyncs its data pages but writes the meta page unsynced; the flush
            # thread (or the next commit) makes that durable. LMDB guarantees integrity in this
            # mode, unlike sync=False, where a power cut can leave a meta page pointing at pages
            # that never reached the disk.
            sync=True,
            metasync=False,
            readahead=False,
        )
        # Reader slots of processes that died (e.g. SIGKILLed) would otherwise pin old pages.
        stale = self.env.reader_check()
        if stale:
            log.info("kv cleared stale readers path=%s count=%d", path, stale)
        self.committer = _Committer(self.env, path, rejoin_s)
        self.refs = 0

    def close(self) -> None:
        self.committer.stop()
        self.env.close()


_registry_lock = threading.Lock()
# LMDB forbids opening one environment twice in a process, so handles share it; keyed by pid as
# well so a forked child never uses its parent's.
_registry: dict[tuple[int, str], _Environment] = {}


class LmdbDatabase(Database):
    """A handle on an LMDB environment at ``path`` (see the module docstring).

    ``group_commit_interval_ms`` bounds how long the committer, after committing a batch, waits for
    that batch's callers to be acknowledged and come back with their next transactions before it
    takes the next batch (see :class:`_Rejoin`); the wait normally ends well before the bound,
    as soon as the callers' event loops have run them. With 0 the next batch starts at once,
    overlapping its commit with the previous batch's flush but committing half-full batches.
    """

    def __init__(
        self,
        path: str,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_readers: int = DEFAULT_MAX_READERS,
        group_commit_interval_ms: float = 2.0,
    ) -> None:
        if group_commit_interval_ms < 0:
            raise ValueError(f"group_commit_interval_ms must not be negative, got {group_commit_interval_ms}")
        key = (os.getpid(), os.path.realpath(path))
        with _registry_lock:
            env = _registry.get(key)
            if env is None:
                try:
                    env = _Environment(key[1], map_size, max_readers, group_commit_interval_ms / 1000)
                except lmdb.Error as e:
                    raise FS3Error(StatusCode.KV_STORE_FAILED, f"cannot open kv store {path}: {e}") from e
                _registry[key] = env
            env.refs += 1
        self._key = key
        self._shared: _Environment | None = env
        self._begin = env.env.begin
        self._submit = env.committer.submit
        log.info("kv lmdb opened path=%s", key[1])

    @property
    def path(self) -> str:
        return self._key[1]

    def _open_snapshot(self) -> Snapshot:
        if self._shared is None:
            raise FS3Error(StatusCode.KV_STORE_FAILED, f"kv store {self.path} is closed")
        try:
            return Snapshot(self._begin())
        except lmdb.Error as e:
            raise FS3Error(StatusCode.KV_STORE_FAILED, f"cannot read kv store {self.path}: {e}") from e

    def create_transaction(self) -> Transaction:
        return BufferedTransaction(self._open_snapshot, self._submit)

    def commit_stats(self) -> CommitStats | None:
        shared = self._shared
        return None if shared is None else shared.committer.stats()

    def failure(self) -> FS3Error | None:
        shared = self._shared
        return None if shared is None else shared.committer.failure

    def space(self) -> StoreSpace | None:
        shared = self._shared
        return None if shared is None else shared.committer.space()

    async def close(self) -> None:
        env, self._shared = self._shared, None
        if env is None:
            return
        with _registry_lock:
            env.refs -= 1
            last = env.refs == 0
            if last:
                del _registry[self._key]
        if last:
            await asyncio.to_thread(env.close)
