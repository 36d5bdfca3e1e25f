"""Primary election by a lease record in the KV store, with fencing of every write.

Every mgmtd runs :meth:`Election.tick` periodically. The lease (``SING mgmtd-lease``) names a holder,
an epoch and an expiry time; a mgmtd takes it when it is free or expired (incrementing the epoch), and
the holder extends it. Because the store is serializable, two mgmtds racing for an expired lease
cannot both win: the loser's transaction conflicts, re-reads, and sees the winner.

Fencing: :meth:`Election.check` is called inside every write transaction of the primary. It reads
the lease in that same transaction and fails it with MGMTD_LEASE_LOST unless this mgmtd still holds
the lease with the same epoch and it has not expired. A deposed primary that has not noticed yet
therefore cannot write: either its transaction sees the new holder, or it conflicts with the
takeover and re-reads.

Time: no decision compares one host's wall clock with another's, nor trusts a wall clock not to
step (NTP, an operator's ``date``). The holder trusts its lease for ``lease_interval_s -
trust_margin`` on its steady clock (CLOCK_BOOTTIME: it goes on through a suspend) from the moment it
began the renewal; another mgmtd takes the lease only once it has seen the same lease record,
unchanged, for ``lease_interval_s`` on its own steady clock from when it read it (a live holder
changes it every renewal), or when the record says it was released.
So a holder whose clock steps back still stops acting as primary before anyone may take over, a
clock stepping forward on any host does not end a live holder's lease, and a dead holder whose
clock ran ahead is replaced within a lease interval. ``expires_at`` (wall clock) is for people.

A standby also records, every quarter of a lease at most, that it is there (``standby_key``), so
that a primary stopping cleanly knows one will take over within a second and needs no stop fence
(``fs3.mgmtd.server``); its clean stop clears the record. The holder trusts its lease in memory
only until ``trust_margin`` before expiry, so a primary that cannot reach the store stops acting as
primary before anyone else may take over.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable

from fs3.clock import boottime
from fs3.errors import FS3Error, StatusCode
from fs3.kv import prefix_end
from fs3.kv.base import Database, ReadView, Transaction
from fs3.mgmtd import schema
from fs3.proto import mgmtd_pb2

log = logging.getLogger(__name__)


def decode_lease(raw: bytes | None) -> mgmtd_pb2.MgmtdLease | None:
    return None if raw is None else mgmtd_pb2.MgmtdLease.FromString(raw)


class Election:
    """This mgmtd's view of the lease. Not thread-safe; use from one event loop."""

    def __init__(
        self,
        db: Database,
        node_id: int,
        address: str,
        lease_interval_s: float,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = boottime,
    ) -> None:
        self._db = db
        self.node_id = node_id
        self.address = address
        self.lease_interval_s = lease_interval_s
        self.trust_margin_s = lease_interval_s * 0.25
        self._clock = clock  # wall clock: only for the records people read (expires_at, standby)
        self._mono = monotonic
        self._held: mgmtd_pb2.MgmtdLease | None = None
        self._trusted_until = 0.0  # monotonic: until when the holder acts on its lease
        self.last_seen: mgmtd_pb2.MgmtdLease | None = None
        # the lease record as last read, and since when (monotonic) it has read the same
        self._seen_raw: bytes | None = None
        self._seen_since = 0.0
        self._standby_noted = -1e18  # when this standby last recorded itself (monotonic)

    @property
    def epoch(self) -> int:
        return self._held.epoch if self._held is not None else 0

    def is_primary(self) -> bool:
        """Whether this mgmtd holds the lease with enough of it left to act on."""
        return self._held is not None and self._mono() < self._trusted_until

    def primary_address(self) -> tuple[int, str]:
        """(node id, address) of the primary as last seen; (0, "") when none is known to hold it."""
        lease = self.last_seen
        if lease is None or _released(lease) or self.takeover_in() <= 0:
            return 0, ""
        return lease.node_id, lease.address

    def takeover_in(self) -> float:
        """Seconds until the lease record last seen may be taken over if it stays unchanged."""
        if self._seen_raw is None:
            return 0.0
        return self._seen_since + self.lease_interval_s - self._mono()

    def _note_seen(self, raw: bytes | None, at: float) -> None:
        if raw != self._seen_raw:
            self._seen_raw = raw
            self._seen_since = at

    async def tick(self) -> tuple[bool, bool]:
        """Take or extend the lease if possible. Returns (is_primary, newly_acquired)."""
        now = self._clock()
        began = self._mono()  # the holder's trust counts from here: before the store saw anything
        held = self._held
        taken: list[mgmtd_pb2.MgmtdLease] = []  # what an attempt below wrote to take the lease
        # the lease record as the last attempt read it, and when: a standby times a record from its
        # read, not from the tick's start (a slow store or a busy loop between the two would count
        # as time the holder had already used of a renewal it made after the tick began)
        read: list[tuple[bytes | None, float]] = []

        async def txn(tr: Transaction) -> tuple[mgmtd_pb2.MgmtdLease | None, mgmtd_pb2.MgmtdLease]:
            raw = await tr.get(schema.LEASE_KEY)
            read[:] = [(raw, self._mono())]
            # a full store refuses what adds data: not the lease, or mgmtd loses its role over
            # and over while the store is full (and every daemon with it)
            tr.use_reserve(whole=True)
            cur = decode_lease(raw)
            # ours: the lease this mgmtd holds, or the one an attempt of this tick took, committed
            # with its outcome unknown (FoundationDB's commit_unknown_result is retried as a
            # conflict): not someone else's lease to wait out
            mine = (
                cur is not None
                and cur.node_id == self.node_id
                and (held is not None and cur.epoch == held.epoch or cur in taken)
            )
            if mine:
                new = mgmtd_pb2.MgmtdLease()
                new.CopyFrom(cur)
                new.expires_at = now + self.lease_interval_s
                new.address = self.address
                new.renewals += 1  # changed at every renewal, whatever the wall clock says
            elif (
                cur is None
                or _released(cur)
                or (raw == self._seen_raw and self._mono() >= self._seen_since + self.lease_interval_s)
            ):
                new = mgmtd_pb2.MgmtdLease(
                    node_id=self.node_id,
                    address=self.address,
                    epoch=(cur.epoch if cur is not None else 0) + 1,
                    expires_at=now + self.lease_interval_s,
                    acquired_at=now,
                )
                taken.append(new)
                tr.clear(schema.standby_key(self.node_id))
            else:
                if began - self._standby_noted >= self.lease_interval_s / 4:
                    tr.set(schema.standby_key(self.node_id), schema.encode_f64(now))
                    noted.append(began)
                return None, cur
            tr.set(schema.LEASE_KEY, new.SerializeToString())
            return new, new

        noted: list[float] = []

        try:
            won, seen = await self._db.run(txn)
        except FS3Error as e:
            log.warning("lease renewal failed node_id=%d error=%s", self.node_id, e)
            if self._held is not None and not self.is_primary():
                self._held = None
            return self.is_primary(), False
        self.last_seen = seen
        if won is not None:
            self._trusted_until = began + self.lease_interval_s - self.trust_margin_s
            self._note_seen(won.SerializeToString(), began)
        elif read:
            self._note_seen(*read[0])
        if noted:
            self._standby_noted = noted[-1]
        newly = won is not None and (held is None or held.epoch != won.epoch)
        if won is None and held is not None:
            log.warning(
                "lease lost node_id=%d new_holder=%d epoch=%d", self.node_id, seen.node_id, seen.epoch
            )
        self._held = won
        if newly:
            log.info("became primary node_id=%d epoch=%d address=%s", self.node_id, won.epoch, self.address)
        return self.is_primary(), newly

    async def check(self, tr: Transaction) -> None:
        """Fencing: fail ``tr`` unless this mgmtd still holds the lease (call in every write)."""
        held = self._held
        cur = decode_lease(await tr.get(schema.LEASE_KEY))
        if (
            held is None
            or cur is None
            or cur.node_id != self.node_id
            or cur.epoch != held.epoch
            or not self.is_primary()
        ):
            raise FS3Error(StatusCode.MGMTD_LEASE_LOST, f"mgmtd {self.node_id} no longer holds the lease")

    def drop(self) -> None:
        """Forget the lease without touching the store (after a fencing failure)."""
        self._held = None

    async def standbys(self, within_s: float) -> list[int]:
        """The other mgmtds that recorded themselves as standbys in the last ``within_s`` seconds."""
        now = self._clock()

        async def fn(tr: Transaction) -> list[int]:
            rows = await tr.snapshot.get_range(schema.STANDBY_PREFIX, prefix_end(schema.STANDBY_PREFIX))
            found = []
            for key, value in rows:
                node_id = struct.unpack(">I", key[len(schema.STANDBY_PREFIX) :])[0]
                # wall clock of another mgmtd's host: a stamp "from the future" (this clock stepped
                # back, or that one runs ahead) proves nothing about now, and is not counted
                if node_id != self.node_id and abs(now - schema.decode_f64(value)) <= within_s:
                    found.append(node_id)
            return found

        return await self._db.run(fn, read_only=True)

    async def release(self) -> None:
        """Give the lease up on a clean shutdown, so that a standby takes over at once; a standby
        clears its record."""
        held = self._held
        if held is None:
            if self._standby_noted > -1e18:
                with contextlib.suppress(FS3Error):
                    await self._db.run(lambda tr: _clear(tr, schema.standby_key(self.node_id)))
            return
        self._held = None

        async def txn(tr: Transaction) -> None:
            cur = decode_lease(await tr.get(schema.LEASE_KEY))
            if cur is not None and cur.node_id == self.node_id and cur.epoch == held.epoch:
                cur.expires_at = 0.0
                tr.set(schema.LEASE_KEY, cur.SerializeToString())

        try:
            await self._db.run(txn)
            log.info("lease released node_id=%d epoch=%d", self.node_id, held.epoch)
        except FS3Error as e:
            log.warning("lease release failed node_id=%d error=%s", self.node_id, e)


def _released(lease: mgmtd_pb2.MgmtdLease) -> bool:
    """Whether the holder gave the lease up (a clean stop): anyone may take it at once."""
    return lease.expires_at == 0.0


async def _clear(tr: Transaction, key: bytes) -> None:
    tr.clear(key)


async def read_lease(rv: ReadView) -> mgmtd_pb2.MgmtdLease | None:
    return decode_lease(await rv.get(schema.LEASE_KEY))
