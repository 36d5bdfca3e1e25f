"""The engine-independent half of a transaction: buffered writes, read-your-writes and the read set.

The ``mem`` and ``lmdb`` engines share this class. An engine supplies a :class:`Snapshot` (a frozen,
consistent view of the store, taken at the transaction's first read) and a ``submit`` coroutine that
commits a :class:`CommitRequest`. Commits use *value validation*: the request carries every value
and range content the transaction's non-snapshot reads observed, and the engine commits only if the
store still holds exactly those when it applies the writes (see :func:`validate`). That is
serializable, because a transaction whose observations still hold at its commit point is equivalent
to one that ran entirely at that point, and it needs no per-key version bookkeeping, so several
processes sharing one LMDB environment detect each other's conflicts for free. A range read of more
than :data:`EXACT_RANGE_ROWS` rows is carried as the count and a hash of its rows rather than the
rows themselves (a :class:`RangeDigest`), so a transaction's memory stays bounded; validation
re-reads the range and compares, so a large read, like a small one, conflicts only with changes
inside the range it read. An engine that numbers its states (lmdb) need not re-read what a
transaction read from the state its batch begins on, but only what earlier members of the batch
wrote (see :class:`BatchValidator`).

Writes are kept normalised so that commit order does not depend on call order: a set of merged
cleared ranges (applied first) and a map of point operations (applied after), where a point operation
issued before a covering ``clear_range`` is dropped by that clear.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import hashlib
import itertools
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import MAX_KEY_SIZE, MAX_TXN_SIZE, MAX_VALUE_SIZE, KeyValue, ReadView, Transaction

# Keys at or above 0xFF are FoundationDB's system keyspace; refusing them everywhere keeps code that
# works on the embedded engines working on FoundationDB.
SYSTEM_KEYS = b"\xff"

# A long range read hands the event loop back after this many rows (well under a millisecond's
# worth) so one scan cannot stall it.
_ROWS_PER_YIELD = 512
# A transaction keeps the rows of a range read of at most this many rows until it commits, and only a
# RangeDigest of a larger one, bounding its memory. Validation re-reads the range either way, so it
# holds the store's write lock about as long as the read took.
EXACT_RANGE_ROWS = 10_000

# Prefixes each row in a RangeDigest's hash: with the lengths first, no two different row sequences
# hash the same bytes.
_ROW_LENGTHS = struct.Struct("<II")


class Atomics:
    """Atomic operations (add, max) queued on a key whose stored value this transaction has not
    seen: ``(apply, operand)`` pairs, applied in order to the stored value at commit."""

    __slots__ = ("ops",)

    def __init__(self, ops: list[tuple[Callable[[bytes | None, bytes], bytes], bytes]]) -> None:
        self.ops = ops


# A point operation: a value to set, None to clear, or atomic operations to apply to the stored value.
PointOp = bytes | None | Atomics

_MISSING = object()


def apply_add(base: bytes | None, operand: bytes) -> bytes:
    """FoundationDB's ADD: little-endian sum truncated (or zero-extended) to the operand's width."""
    width = len(operand)
    if width == 0:
        return b""
    old = int.from_bytes(base[:width], "little") if base else 0
    total = (old + int.from_bytes(operand, "little")) & ((1 << (8 * width)) - 1)
    return total.to_bytes(width, "little")


def apply_max(base: bytes | None, operand: bytes) -> bytes:
    """FoundationDB's MAX: the larger of the stored value (truncated or zero-extended to the
    operand's width) and the operand, both read as little-endian unsigned integers; the operand
    where nothing is stored."""
    if base is None:
        return operand
    width = len(operand)
    old = base[:width].ljust(width, b"\0")
    return old if int.from_bytes(old, "little") > int.from_bytes(operand, "little") else operand


def resolve_point(op: PointOp, base: bytes | None) -> bytes | None:
    """The value a point operation leaves when the stored value is ``base``."""
    if isinstance(op, Atomics):
        for fn, operand in op.ops:
            base = fn(base, operand)
        return base
    return op


class Snapshot(Protocol):
    """A frozen view of the store, as engines provide it to :class:`BufferedTransaction`."""

    def get(self, key: bytes) -> bytes | None: ...

    def iter_range(self, begin: bytes, end: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]: ...

    def release(self) -> None: ...

    def version(self) -> int | None:
        """Which committed state of the store this is, where the engine numbers them (see
        :class:`BatchValidator`); None where it does not."""
        ...


class Store(Protocol):
    """The live store as an engine's committer sees it while it validates and applies."""

    def get(self, key: bytes) -> bytes | None: ...

    def iter_range(self, begin: bytes, end: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def delete_range(self, begin: bytes, end: bytes) -> None: ...


class RowHash:
    """A running hash of rows, fed in ascending key order, and how many there were."""

    __slots__ = ("rows", "_hash")

    def __init__(self) -> None:
        self.rows = 0
        self._hash = hashlib.blake2b(digest_size=32)

    def update(self, rows: list[tuple[bytes, bytes]]) -> None:
        pack = _ROW_LENGTHS.pack
        self._hash.update(b"".join([part for k, v in rows for part in (pack(len(k), len(v)), k, v)]))
        self.rows += len(rows)

    def digest(self) -> bytes:
        return self._hash.digest()


class RangeDigest(NamedTuple):
    """A non-snapshot read of more than EXACT_RANGE_ROWS rows: the rows it saw in [begin, end)."""

    begin: bytes
    end: bytes
    rows: int
    digest: bytes  # RowHash.digest() of the rows, in ascending order


# The event-loop time after which nobody waits for this task's commits (a served call's deadline;
# meta sets it). A commit the engine has not begun by then fails DEADLINE_EXCEEDED instead of being
# made (lmdb: one queued behind the write lock another process holds). It was made after its caller
# had given up: a change the caller had been told failed (a meta server frozen while it held the
# lock; the other's queued mkdir was made at the thaw).
COMMIT_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "fs3_kv_commit_deadline", default=None
)

# Who this task's commits are for (meta sets the client its call came from): the lmdb engine's
# group commit holds a batch open a little while callers of its previous batch have not sent their
# next transaction yet, so that callers answered together stay in one batch (see
# fs3.kv.lmdb_engine._Committer._gather).
COMMIT_CALLER: contextvars.ContextVar[object] = contextvars.ContextVar("fs3_kv_commit_caller", default=None)


@dataclass(slots=True)
class CommitRequest:
    """Everything an engine needs to validate and apply one transaction."""

    # Non-snapshot point reads: key -> the value observed (None when absent).
    reads: dict[bytes, bytes | None]
    # Non-snapshot range reads of at most EXACT_RANGE_ROWS rows: (begin, end, the pairs observed in
    # [begin, end) in ascending order).
    ranges: list[tuple[bytes, bytes, list[tuple[bytes, bytes]]]]
    # The larger ones.
    digests: list[RangeDigest]
    clears: list[tuple[bytes, bytes]]
    points: dict[bytes, PointOp]
    # Bytes of mutations and conflict ranges, as counted against MAX_TXN_SIZE.
    size: int = 0
    # Filled in by the engine.
    ok: bool = field(default=False)
    # The engine did not apply it, for this reason (a full store; see lmdb_engine's reserve).
    refused: FS3Error | None = field(default=None)
    # It may commit into a full store's reserve (Transaction.use_reserve): 0 no, 1 its first half,
    # 2 all of it.
    reserved: int = 0
    # time.monotonic() after which the engine must not begin it (see COMMIT_DEADLINE).
    deadline: float | None = None
    # The version of the snapshot its reads observed (Snapshot.version), if any.
    version: int | None = None

    @property
    def frees(self) -> bool:
        """Whether it removes anything (a clear, a range clear): what a full store still takes."""
        return bool(self.clears) or any(op is None for op in self.points.values())


def validate(store: Store, req: CommitRequest) -> bool:
    """True when every observation in ``req`` still holds in ``store``."""
    get = store.get
    for key, seen in req.reads.items():
        if get(key) != seen:
            return False
    for begin, end, seen_pairs in req.ranges:
        i = 0
        n = len(seen_pairs)
        for pair in store.iter_range(begin, end, False):
            if i >= n or seen_pairs[i] != pair:
                return False
            i += 1
        if i != n:
            return False
    for begin, end, n, digest in req.digests:
        rows = store.iter_range(begin, end, False)
        now = RowHash()
        while chunk := list(itertools.islice(rows, _ROWS_PER_YIELD)):
            now.update(chunk)
            if now.rows > n:  # a range that grew is given up on without reading all of it
                return False
        if now.rows != n or now.digest() != digest:
            return False
    return True


def apply(store: Store, req: CommitRequest) -> None:
    """Write ``req``'s mutations into ``store`` (clears first, then point operations)."""
    for begin, end in req.clears:
        store.delete_range(begin, end)
    for key, op in req.points.items():
        if op is None:
            store.delete(key)
        elif isinstance(op, Atomics):
            store.put(key, resolve_point(op, store.get(key)))  # type: ignore[arg-type]
        else:
            store.put(key, op)


def validate_and_apply(store: Store, req: CommitRequest) -> bool:
    req.ok = validate(store, req)
    if req.ok:
        apply(store, req)
    return req.ok


class BatchValidator:
    """Validates and applies the members of one batch in turn, as :func:`validate_and_apply` does,
    but without reading again what a member read where it cannot have changed.

    ``base`` is the version of the store the batch began on (None: unknown). A member whose
    snapshot is that version saw the store as it stands, but for what the members before it in
    the batch wrote: its observations still hold unless one of its point reads is a key they wrote,
    or it read a range while they wrote anything, or they cleared a range. Only then is it
    validated by reading (and every member whose snapshot is older, or of another version).
    """

    __slots__ = ("_base", "_written", "_cleared")

    def __init__(self, base: int | None) -> None:
        self._base = base
        self._written: set[bytes] = set()  # keys the batch's applied members wrote
        self._cleared = False  # whether one of them cleared a range

    def validate_and_apply(self, store: Store, req: CommitRequest) -> bool:
        written = self._written
        if (
            req.version is not None
            and req.version == self._base
            and not self._cleared
            and (not written or (not req.ranges and not req.digests and written.isdisjoint(req.reads)))
        ):
            req.ok = True
        elif not validate(store, req):
            req.ok = False
            return False
        else:
            req.ok = True
        apply(store, req)
        written.update(req.points)
        if req.clears:
            self._cleared = True
        return True


def check_key(key: bytes, *, point: bool = True) -> None:
    """``point``: a key read or written itself, which may not be empty (LMDB cannot store the
    empty key, so no engine takes it); a range may begin there."""
    if not key and point:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "the empty key is not a key (a range may begin there)")
    if len(key) > MAX_KEY_SIZE:
        raise FS3Error(StatusCode.KV_KEY_TOO_LARGE, f"key of {len(key)} bytes exceeds {MAX_KEY_SIZE}")


def check_write_key(key: bytes, *, point: bool = True) -> None:
    check_key(key, point=point)
    if key >= SYSTEM_KEYS:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "keys starting with 0xff are reserved")


def check_value(value: bytes) -> None:
    if len(value) > MAX_VALUE_SIZE:
        raise FS3Error(StatusCode.KV_VALUE_TOO_LARGE, f"value of {len(value)} bytes exceeds {MAX_VALUE_SIZE}")


def clamp_end(end: bytes) -> bytes:
    """Range ends past the user keyspace (e.g. ``prefix_end(b"\\xff...")``) mean "to the end"."""
    return SYSTEM_KEYS if end > SYSTEM_KEYS else end


class _SnapshotView(ReadView):
    """``tr.snapshot``: the same reads, recording no conflicts."""

    __slots__ = ("_tr",)

    def __init__(self, tr: BufferedTransaction) -> None:
        self._tr = tr

    async def get(self, key: bytes) -> bytes | None:
        return self._tr._get(key, False)

    async def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return await self._tr._get_range(begin, end, limit, reverse, False)


class BufferedTransaction(Transaction):
    """A transaction over an engine's snapshots, committing through ``submit``.

    ``open_snapshot`` is called at the first read; ``submit`` receives the request once the
    transaction has writes (a transaction without writes commits trivially, as on FoundationDB).
    """

    def __init__(
        self,
        open_snapshot: Callable[[], Snapshot],
        submit: Callable[[CommitRequest], Awaitable[None]],
    ) -> None:
        self._open_snapshot = open_snapshot
        self._submit = submit
        self._snap: Snapshot | None = None
        self._closed = False
        self._points: dict[bytes, PointOp] = {}
        self._sorted_points: list[bytes] | None = None
        self._clears: list[tuple[bytes, bytes]] = []  # sorted, disjoint, non-adjacent
        self._reads: dict[bytes, bytes | None] = {}
        self._ranges: list[tuple[bytes, bytes, list[tuple[bytes, bytes]]]] = []
        self._digests: list[RangeDigest] = []
        self._explicit: list[tuple[bytes, bytes]] = []  # add_read_conflict_range, read at commit
        self._size = 0
        self._reserved = 0

    # -- reads -----------------------------------------------------------------------------------

    @property
    def snapshot(self) -> ReadView:
        # not kept: a view kept here (it refers to the transaction) is a reference cycle, which
        # kept every transaction that read a snapshot, writes and all, until a cyclic collection
        return _SnapshotView(self)

    async def get(self, key: bytes) -> bytes | None:
        return self._get(key, True)

    async def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return await self._get_range(begin, end, limit, reverse, True)

    def _snapshot(self) -> Snapshot:
        if self._closed:
            raise FS3Error(StatusCode.KV_TXN_CLOSED, "transaction already committed or cancelled")
        snap = self._snap
        if snap is None:
            snap = self._snap = self._open_snapshot()
        return snap

    def _cleared(self, key: bytes) -> bool:
        clears = self._clears
        if not clears:
            return False
        i = bisect.bisect_right(clears, (key, b"\xff" * (MAX_KEY_SIZE + 2))) - 1
        return i >= 0 and clears[i][0] <= key < clears[i][1]

    def _get(self, key: bytes, conflict: bool) -> bytes | None:
        snap = self._snap
        if snap is None or self._closed:
            snap = self._snapshot()
        if not key or len(key) > MAX_KEY_SIZE:
            check_key(key)
        op = self._points.get(key, _MISSING)
        if op is not _MISSING and not isinstance(op, Atomics):
            return op  # type: ignore[return-value]
        if self._clears and self._cleared(key):
            return None
        if key >= SYSTEM_KEYS:
            return None
        value = snap.get(key)
        if conflict and key not in self._reads:
            self._reads[key] = value
            self._size += len(key)
        if op is _MISSING:
            return value
        return resolve_point(op, value)  # type: ignore[arg-type]

    def _points_in(self, begin: bytes, end: bytes) -> list[bytes]:
        keys = self._sorted_points
        if keys is None:
            keys = self._sorted_points = sorted(self._points)
        return keys[bisect.bisect_left(keys, begin) : bisect.bisect_left(keys, end)]

    def _clears_in(self, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        return [(b, e) for b, e in self._clears if b < end and e > begin]

    async def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, conflict: bool
    ) -> list[KeyValue]:
        snap = self._snapshot()
        end = clamp_end(end)
        if limit < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative range limit {limit}")
        if begin >= end:
            return []
        points = self._points_in(begin, end) if self._points else []
        clears = self._clears_in(begin, end) if self._clears else []
        underlying = snap.iter_range(begin, end, reverse)
        seen: list[tuple[bytes, bytes]] = []
        out: list[KeyValue] = []
        if not points and not clears:
            # The common case: nothing buffered in the range, results are the snapshot's rows.
            while True:
                want = min(_ROWS_PER_YIELD, limit - len(out)) if limit else _ROWS_PER_YIELD
                chunk = list(itertools.islice(underlying, want))
                seen += chunk
                out += itertools.starmap(KeyValue, chunk)
                if len(chunk) < want or len(out) == limit:
                    break
                await asyncio.sleep(0)
        else:
            await self._merge(underlying, points, clears, limit, reverse, seen, out)
        if conflict:
            await self._record_range(begin, end, limit, reverse, seen, out)
        return out

    async def _merge(
        self,
        underlying: Iterator[tuple[bytes, bytes]],
        points: list[bytes],
        clears: list[tuple[bytes, bytes]],
        limit: int,
        reverse: bool,
        seen: list[tuple[bytes, bytes]],
        out: list[KeyValue],
    ) -> None:
        """Merge the snapshot's rows with this transaction's buffered writes, in scan order."""
        if reverse:
            points = points[::-1]
        ops = self._points

        def cleared(key: bytes) -> bool:
            return any(b <= key < e for b, e in clears)

        def before(a: bytes, b: bytes) -> bool:
            return a > b if reverse else a < b

        nxt = next(underlying, None)
        pi = 0
        steps = 0
        while nxt is not None or pi < len(points):
            pkey = points[pi] if pi < len(points) else None
            if nxt is not None and (pkey is None or before(nxt[0], pkey)):
                seen.append(nxt)
                if not cleared(nxt[0]):
                    out.append(KeyValue(*nxt))
                nxt = next(underlying, None)
            else:
                assert pkey is not None
                base = None
                if nxt is not None and nxt[0] == pkey:
                    seen.append(nxt)
                    base = nxt[1]
                    nxt = next(underlying, None)
                value = resolve_point(ops[pkey], base)
                if value is not None:
                    out.append(KeyValue(pkey, value))
                pi += 1
            if limit and len(out) >= limit:
                break
            steps += 1
            if steps % _ROWS_PER_YIELD == 0:
                await asyncio.sleep(0)

    async def _record_range(
        self,
        begin: bytes,
        end: bytes,
        limit: int,
        reverse: bool,
        seen: list[tuple[bytes, bytes]],
        out: list[KeyValue],
    ) -> None:
        # As on FoundationDB, a read that stopped at its limit conflicts only up to the last row
        # it returned, not with writes beyond it.
        if limit and len(out) >= limit:
            last = out[-1].key
            if reverse:
                begin = last
                seen = [p for p in seen if p[0] >= last]
            else:
                end = last + b"\x00"
                seen = [p for p in seen if p[0] <= last]
        self._size += len(begin) + len(end)
        # What validation compares with is what the snapshot held, not the view merged with this
        # transaction's own writes: the store holds the same until some other transaction commits.
        if reverse:
            seen.reverse()
        if len(seen) > EXACT_RANGE_ROWS:
            await self._record_digest(begin, end, iter(seen))
        else:
            self._ranges.append((begin, end, seen))

    async def _record_digest(self, begin: bytes, end: bytes, rows: Iterator[tuple[bytes, bytes]]) -> None:
        """Remember ``rows``, what the snapshot holds in [begin, end) in ascending order, as a
        :class:`RangeDigest`."""
        hashed = RowHash()
        while chunk := list(itertools.islice(rows, _ROWS_PER_YIELD)):
            hashed.update(chunk)
            await asyncio.sleep(0)
        self._digests.append(RangeDigest(begin, end, hashed.rows, hashed.digest()))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._snapshot()  # the range is judged against this transaction's snapshot
        end = clamp_end(end)
        if begin >= end:
            return
        self._size += len(begin) + len(end)
        self._check_size()
        # What the snapshot holds there is read at commit, where it can yield to the event loop.
        self._explicit.append((begin, end))

    async def _read_explicit_ranges(self) -> None:
        snap = self._snapshot()
        for begin, end in self._explicit:
            rows = snap.iter_range(begin, end, False)
            seen: list[tuple[bytes, bytes]] = []
            while len(seen) <= EXACT_RANGE_ROWS:
                chunk = list(itertools.islice(rows, _ROWS_PER_YIELD))
                seen += chunk
                if len(chunk) < _ROWS_PER_YIELD:
                    break
                await asyncio.sleep(0)
            if len(seen) > EXACT_RANGE_ROWS:
                # The rest of the range streams into the hash rather than into memory.
                await self._record_digest(begin, end, itertools.chain(seen, rows))
            else:
                self._ranges.append((begin, end, seen))

    # -- writes ----------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self._closed:
            raise FS3Error(StatusCode.KV_TXN_CLOSED, "transaction already committed or cancelled")

    def _check_size(self) -> None:
        if self._size > MAX_TXN_SIZE:
            raise FS3Error(
                StatusCode.KV_TXN_TOO_LARGE,
                f"transaction of {self._size} bytes exceeds {MAX_TXN_SIZE}",
            )

    def _put_point(self, key: bytes, op: PointOp, size: int) -> None:
        self._size += size
        self._check_size()
        if key not in self._points:
            self._sorted_points = None
        self._points[key] = op

    def set(self, key: bytes, value: bytes) -> None:
        # The hottest write path, so the checks of _writable/_put_point are inlined.
        if self._closed:
            self._writable()
        if not key or len(key) > MAX_KEY_SIZE or key >= SYSTEM_KEYS:
            check_write_key(key)
        if len(value) > MAX_VALUE_SIZE:
            check_value(value)
        self._size += len(key) + len(value)
        if self._size > MAX_TXN_SIZE:
            self._check_size()
        points = self._points
        if key not in points:
            self._sorted_points = None
        points[key] = value if type(value) is bytes else bytes(value)

    def clear(self, key: bytes) -> None:
        self._writable()
        check_write_key(key)
        self._put_point(key, None, len(key))

    def add(self, key: bytes, operand: bytes) -> None:
        self._atomic(key, operand, apply_add)

    def atomic_max(self, key: bytes, operand: bytes) -> None:
        self._atomic(key, operand, apply_max)

    def _atomic(self, key: bytes, operand: bytes, fn: Callable[[bytes | None, bytes], bytes]) -> None:
        # (a create makes two: the checks of _writable and _put_point are inlined, as in set)
        if self._closed:
            self._writable()
        if not key or len(key) > MAX_KEY_SIZE or key >= SYSTEM_KEYS:
            check_write_key(key)
        if len(operand) > MAX_VALUE_SIZE:
            check_value(operand)
        if type(operand) is not bytes:
            operand = bytes(operand)
        points = self._points
        op = points.get(key, _MISSING)
        if op is _MISSING:
            new: PointOp = (
                fn(None, operand) if self._clears and self._cleared(key) else Atomics([(fn, operand)])
            )
            self._sorted_points = None
        elif isinstance(op, Atomics):
            new = Atomics([*op.ops, (fn, operand)])
        else:
            new = fn(op, operand)  # type: ignore[arg-type]
        self._size += len(key) + len(operand)
        if self._size > MAX_TXN_SIZE:
            self._check_size()
        points[key] = new

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._writable()
        check_key(begin, point=False)
        if begin >= SYSTEM_KEYS:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "keys starting with 0xff are reserved")
        end = clamp_end(end)
        if begin >= end:
            return
        self._size += len(begin) + len(end)
        self._check_size()
        for key in self._points_in(begin, end):
            del self._points[key]
            self._sorted_points = None
        # Merge with overlapping or touching ranges so the list stays sorted and disjoint.
        keep: list[tuple[bytes, bytes]] = []
        for b, e in self._clears:
            if e < begin or b > end:
                keep.append((b, e))
            else:
                begin, end = min(b, begin), max(e, end)
        keep.append((begin, end))
        keep.sort()
        self._clears = keep

    # -- lifetime --------------------------------------------------------------------------------

    async def commit(self) -> None:
        self._writable()
        self._check_size()
        if not self._points and not self._clears:
            self.cancel()
            return
        if self._explicit:
            await self._read_explicit_ranges()
        self._closed = True
        snap = self._snap
        version = snap.version() if snap is not None else None
        self._release()
        await self._submit(
            CommitRequest(
                reads=self._reads,
                ranges=self._ranges,
                digests=self._digests,
                clears=self._clears,
                points=self._points,
                size=self._size,
                reserved=self._reserved,
                version=version,
            )
        )

    def use_reserve(self, whole: bool = False) -> None:
        self._reserved = max(self._reserved, 2 if whole else 1)

    def cancel(self) -> None:
        self._closed = True
        self._release()

    def _release(self) -> None:
        snap, self._snap = self._snap, None
        if snap is not None:
            snap.release()
