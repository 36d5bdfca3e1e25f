"""Sessions of read-only opens, written after the open is answered.

Every open records a session so that a file unlinked while open keeps its chunks (DESIGN §7).
For a write session that record must be in the store before the client may write: the length
settles through it. For a read-only open it only has to be there before the collector looks for
sessions of the file, and the collector looks no sooner than ``gc_grace_s`` after the unlink. So a
read-only open (and the close of its session) is answered after a snapshot read that checks
access, and its session is put (cleared) by :class:`ReadSessions`, which commits what is queued in
one transaction per batch, a few milliseconds later. That takes a durable commit (about 0.7 ms
on the lmdb engine, more on FoundationDB) and its fsync off the path of every read-only open and
close, and batches them: a data loader opening small files is not held up by the store's flushes.

What stays the same: the collector of this process waits for the queue to be written before it
looks (:meth:`ReadSessions.settled`), as do the prune, a listing of sessions, and a touch or sync of
a queued session; the write of a session checks that its file is still there and not being
collected. An open of a file already unlinked (a reader that looked it up before the unlink)
writes its session before the answer, as before: the collector may claim that file any moment,
and only the open's own transaction is ordered against the claim. So do all opens while the
queue's last batch failed (it is tried again until it goes) or the batch being written began more
than ``gc_grace_s / 4`` ago: a store that is slow or failing then fails opens visibly rather than
leaving answered ones without a session. What is weaker, and why it is acceptable:

- Another meta process's collector does not see a queued session. It looks ``gc_grace_s`` (2 s by
  default) after the unlink, by when the session has long been written (see the bound above);
  read sessions are queued only while ``gc_grace_s`` is at least :data:`MIN_GRACE_S`, and
  otherwise written before the answer, as before.
- A meta process killed with sessions queued loses them. An open whose session was queued says so
  in its answer (``OpenRsp.session_queued``), as does a close whose end was (``InodeRsp.end_queued``);
  a client that loses this process within ``fs3.client.meta_client.RECLOSE_S`` of the answer puts
  the sessions of files it still holds open again (RestoreReadSessions) and ends the closed ones
  again (EndReadSessions), in batches, through any meta server (``QueuedSessions``); a client that
  goes too leaves nothing. A put comes too late only for a file unlinked and claimed by the
  collector before it (``gc_grace_s`` after the unlink; a killed process's connections end at
  once, a dead host's time out): the reader's reads then find no chunks, and since a handle whose
  session was queued asks meta at its first hole read (whatever mgmtd says of its client), they
  fail (EIO), never return zeros for removed data. A close lost otherwise (that client cut off from every meta server meanwhile)
  leaves the session until its client goes (its file, if unlinked, is collected then). A clean stop
  writes the queue first, before it closes its connections.
- A close or touch that reaches another meta process (a failover) within the few milliseconds
  before the session is written finds none: the close is answered META_BAD_HANDLE and the
  session, written after, stays until its client goes; after the touch a read-only handle opens
  its file again (its first session, written after, stays until its client goes too). The
  client sends a touch of a session queued so to the process that queued it first, which waits
  for its write.
- A retried read-only open that reaches the same process gets the same session (its id is derived
  from the request id with a key of the process's own, so it cannot be derived elsewhere), so a
  retry leaves no second session behind; one that reaches another process gets another. A
  retried close of a read session whose first close was answered is answered META_BAD_HANDLE
  instead of the first answer (the client's handle is closed either way).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from fs3 import metrics
from fs3.kv import Database, Transaction
from fs3.meta import schema
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

#: read sessions are queued only while the collector's grace is at least this long
MIN_GRACE_S = 0.5
#: sessions put or cleared in one transaction at most
BATCH = 512
#: how long the writer lets sessions gather before it writes a batch of fewer than BATCH
GATHER_S = 0.002
#: waits between attempts when a batch fails (a store that refuses commits), doubling up to the last
_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0)


class ReadSessions:
    """The queue of read sessions to put and clear, and the task that writes it (see the module
    docstring). One per meta process and store; its methods run on the process's event loop."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # session key -> (inode id, the session to put or None to clear it, the number of the
        # oldest change of the key this entry stands for), in queue order
        self._queued: dict[bytes, tuple[int, bytes | None, int]] = {}
        self._writing: dict[bytes, tuple[int, bytes | None, int]] = {}  # the batch being committed
        self._task: asyncio.Task[None] | None = None
        self._seq = 0  # changes queued so far
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._stopped = False
        self._failures = 0  # batches failed in a row
        self._writing_since: float | None = None  # when the batch being written began (monotonic)
        self._salt = os.urandom(16)
        # counters for the metrics
        self.batches = self.put = self.cleared = self.dropped = self.lost = 0

    # ---- queueing -------------------------------------------------------------------------------

    def open(self, inode_id: int, session_id: int, session: meta_pb2.FileSession) -> None:
        """Queue the session of a read-only open."""
        self._queue(schema.session_key(inode_id, session_id), inode_id, session.SerializeToString())

    def close(self, inode_id: int, session_id: int) -> None:
        """Queue the end of a read session. It replaces a put of the session still queued (which
        is then never written), and clears whatever a put written before left in the store."""
        self._queue(schema.session_key(inode_id, session_id), inode_id, None)

    def accepting(self, grace_s: float) -> bool:
        """Whether an open may be answered before its session is written: this is not stopped,
        its last batch did not fail, and the batch being written (if any) began less than a
        quarter of ``grace_s`` ago. Otherwise sessions go in the open's own transaction, as when
        the grace is short, so that a store that is slow or failing fails opens visibly instead
        of leaving answered ones without a session."""
        if self._stopped or self._failures:
            return False
        return self._writing_since is None or time.monotonic() - self._writing_since < grace_s / 4

    def session_id(self, client_id: int, request_id: int) -> int:
        """The session id of a read-only open with this request id: the same for a retry that
        reaches this process again (so it queues the same session, not a second one nobody
        would close); unguessable elsewhere (a session id is what a close presents)."""
        digest = hashlib.blake2b(b"%d:%d" % (client_id, request_id), digest_size=8, key=self._salt).digest()
        return (int.from_bytes(digest, "big") >> 1) + 1

    def lookup(self, key: bytes) -> tuple[bool, bytes | None]:
        """(whether a change of session ``key`` is queued or being written, the session it puts or
        None for an end); the store has the rest."""
        for changes in (self._queued, self._writing):
            if key in changes:
                return True, changes[key][1]
        return False, None

    def _queue(self, key: bytes, inode_id: int, value: bytes | None) -> None:
        if self._stopped:
            raise RuntimeError("read sessions are stopped")
        self._seq += 1
        earlier = self._queued.pop(key, None)  # a later change of a key goes after those before it
        self._queued[key] = (inode_id, value, earlier[2] if earlier is not None else self._seq)
        if self._task is None:
            # in a context of its own: not the first caller's (its call deadline, for one)
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="fs3-meta-read-sessions", context=contextvars.Context()
            )

    @property
    def queued(self) -> int:
        return len(self._queued) + len(self._writing)

    async def settled(self) -> None:
        """Return once every change queued before this call is in the store (or dropped)."""
        if not self._queued and not self._writing:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((self._seq, fut))
        await asyncio.shield(fut)

    async def stop(self) -> None:
        """Write what is queued, then refuse more."""
        self._stopped = True
        task = self._task
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- writing --------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._queued:
                if len(self._queued) < BATCH and not self._stopped:
                    # let opens and closes gather: a commit per few sessions would hold up the
                    # event loop, where the store commits on a fast disk (fs3.kv.lmdb_engine)
                    await asyncio.sleep(GATHER_S)
                keys = list(self._queued)[:BATCH]
                self._writing = {key: self._queued.pop(key) for key in keys}
                self._writing_since = time.monotonic()
                try:
                    puts, clears, dropped = await self._db.run(self._write)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    if self._stopped:
                        log.error("read sessions not written count=%d error=%s", len(self._writing), e)
                        self.lost += len(self._writing)
                    else:
                        # Tried again (after a pause) until it goes; meanwhile new opens write
                        # their sessions themselves (accepting). Back in front of the changes
                        # queued since: a key's later change stays after it, standing for both.
                        delay = _RETRY_S[min(self._failures, len(_RETRY_S) - 1)]
                        self._failures += 1
                        log.warning(
                            "read sessions not written, trying again count=%d failures=%d error=%s",
                            len(self._writing),
                            self._failures,
                            e,
                        )
                        merged = {}
                        for key, (inode_id, value, seq) in self._writing.items():
                            later = self._queued.pop(key, None)
                            merged[key] = (
                                (inode_id, value, seq)
                                if later is None
                                else (later[0], later[1], min(seq, later[2]))
                            )
                        merged.update(self._queued)
                        self._queued = merged
                        self._writing = {}
                        self._writing_since = None
                        await asyncio.sleep(delay)
                        continue
                else:
                    self.batches += 1
                    self.put += puts
                    self.cleared += clears
                    self.dropped += dropped
                self._failures = 0
                self._writing = {}
                self._writing_since = None
                self._wake()
        finally:
            # cancelled with changes left (the batch in flight among them): nothing will write them
            left = len(self._queued) + len(self._writing)
            if left:
                log.error("read sessions not written count=%d", left)
                self.lost += left
            self._queued, self._writing, self._writing_since = {}, {}, None
            self._task = None
            self._wake()

    async def _write(self, tr: Transaction) -> tuple[int, int, int]:
        tr.use_reserve()  # readers' sessions go on in a full store (a reader adds nothing else)
        puts = clears = dropped = 0
        for key, (inode_id, value, _) in self._writing.items():
            if value is None:
                tr.clear(key)
                clears += 1
                continue
            raw = await tr.get(schema.inode_key(inode_id))  # conflicts with the collector's claim
            ino = meta_pb2.Inode.FromString(raw) if raw is not None else None
            if ino is None or (ino.nlink == 0 and ino.collecting):
                dropped += 1  # being collected: no session, as an open now would be refused
                continue
            tr.set(key, value)
            puts += 1
        return puts, clears, dropped

    def _wake(self) -> None:
        """Wake the waiters of :meth:`settled` none of whose changes are still to be written."""
        if not self._waiters:
            return
        pending = [entry[2] for changes in (self._queued, self._writing) for entry in changes.values()]
        oldest = min(pending, default=self._seq + 1)
        waiting = []
        for at, fut in self._waiters:
            if at < oldest:
                if not fut.done():
                    fut.set_result(None)
            else:
                waiting.append((at, fut))
        self._waiters = waiting


class ReadSessionMetrics:
    """:class:`ReadSessions` as ``fs3_meta_read_sessions_*`` metrics, read when scraped."""

    def __init__(self, sessions: ReadSessions, reg: CollectorRegistry | None = None) -> None:
        self._sessions = sessions
        (reg or metrics.registry()).register(self)

    def collect(self) -> Iterator[Any]:
        s = self._sessions
        for name, doc, value in (
            ("fs3_meta_read_sessions_batches", "transactions that wrote queued read sessions", s.batches),
            ("fs3_meta_read_sessions_put", "read sessions written after their open was answered", s.put),
            (
                "fs3_meta_read_sessions_cleared",
                "read sessions ended after their close was answered",
                s.cleared,
            ),
            (
                "fs3_meta_read_sessions_dropped",
                "read sessions not written: their file was being collected meanwhile",
                s.dropped,
            ),
            (
                "fs3_meta_read_sessions_lost",
                "read session changes never written: the store failed while stopping, or the writer ended",
                s.lost,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily(
            "fs3_meta_read_sessions_queued", "read session changes not yet written", s.queued
        )
