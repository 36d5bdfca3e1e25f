"""A chaos workload: native clients write, overwrite, append, truncate, rename and unlink files while
random daemons (one or two storage daemons, meta, mgmtd) are killed with SIGKILL and restarted; then
every acknowledged byte is checked. mgmtd is stopped with SIGTERM instead half the time: it then sets
its stop fence (``stop_fence_s``, MGMTD_STOP_FENCE_S here), and the storage daemons serve on their
extended leases while it is down, with storage daemons killed during the fence as in any cycle.

Every byte written is part of a self-describing 512-byte *sector* (writer, write id, sector index,
generation, and a payload derived from those), so any sector read back can be judged on its own: it
is either zero (a hole) or a valid sector of the file's writer at its own position. A torn, foreign,
misplaced or corrupt sector is a violation even while the outcome of an operation is unknown.

Each writer keeps a model of the *acknowledged* state of its files only: content is recorded after
``fsync`` or ``close`` returns, a truncate, rename or unlink after it returns. When an operation fails
(a daemon died under it, or the client's retry budget ran out: ``client_retry_s`` makes that common)
its outcome is ambiguous, but only within bounds (:func:`failed_op_problem`): the writer reads what
is there, checks it against the acknowledged state and the operation in flight, then rewrites or
removes the file until that succeeds, which makes the model definitive again.

:func:`run_workload` returns the problems found; an empty list means:

- every read during the run returned only zero or valid sectors of the right writer and position;
- every acknowledged read-back during the run, and every file at the end, holds exactly the modelled
  bytes and size; deleted files are gone;
- a file unlinked while a reader held it open reads back, past the collector's grace, exactly the
  bytes it held when unlinked (its read session kept it; never zeros, old data or a lost session);
- after a failed operation its files hold the acknowledged state, changed only as far as that
  operation could have changed it (no acknowledged byte lost, no byte of another write);
- no operation failed with a status other than a transient one (a daemon gone, a deadline, a
  retry budget spent): a checksum mismatch or an internal error is a problem; none hung;
- at the end every chain's replicas hold the same chunks (length and checksum), none pending or
  lost, and no chunk belongs to an inode that no longer exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import itertools
import logging
import os
import random
import signal
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from cluster import Proc, wait_until
from fs_cluster import FsCluster

from fs3.client.filesystem import FileSystem
from fs3.errors import RETRYABLE, FS3Error, StatusCode, to_errno

log = logging.getLogger(__name__)

# the stop fence of a mgmtd stopped with SIGTERM: longer than the lease (0.8 of the tests' 2 s
# heartbeat timeout) and the longest time a stopped daemon stays down, so that its end matters
MGMTD_STOP_FENCE_S = 6.0

SECTOR = 512
MAGIC = b"CHAO"
_HEADER = struct.Struct("<4sIQQQ")  # magic, writer, write id, sector index, generation: 32 bytes
# what a caller may see while daemons die: a daemon gone or not serving yet, a deadline, a retry
# budget spent (anything else, such as a checksum mismatch or an internal error, is a problem)
_EXPECTED_CODES = RETRYABLE | {StatusCode.DEADLINE_EXCEEDED, StatusCode.KV_RETRY_LIMIT, StatusCode.CANCELLED}
GC_GRACE_S = 2.0  # meta's gc_grace_s (its default): when the collector may take an unlinked file

T = TypeVar("T")


@dataclass(slots=True)
class WorkloadConfig:
    """Shape of one run. ``cycles`` kill/restart cycles take about 5 s each."""

    seed: int
    cycles: int
    writers: int = 6
    clients: int = 2  # writers share these native clients round-robin
    readers: int = 2
    files_per_writer: int = 5
    max_sectors: int = 600  # largest sequentially written file, in sectors
    max_gap_s: float = 5.0  # longest pause between cycles
    max_down_s: float = 5.0  # longest time a killed daemon stays down
    readback_probability: float = 0.2
    client_retry_s: float | None = None  # the clients' retry budget for meta and storage calls
    hang_s: float = 150.0  # an operation taking longer than this is a hang
    settle_s: float = 300.0  # time for the cluster to serve every chain again at the end
    chunk_settle_s: float = 60.0  # time for resync and chunk GC to finish at the end


# -- sectors --------------------------------------------------------------------------------------


def sector(writer: int, write_id: int, index: int, generation: int) -> bytes:
    """The sector ``writer`` writes at sector ``index`` in write ``write_id``."""
    header = _HEADER.pack(MAGIC, writer, write_id, index, generation)
    payload = hashlib.blake2b(header, digest_size=64).digest() * 8
    return header + payload[: SECTOR - len(header)]


def sectors(writer: int, write_id: int, offset: int, count: int, generation: int) -> bytes:
    """``count`` consecutive sectors starting at byte ``offset`` (a multiple of SECTOR)."""
    first = offset // SECTOR
    return b"".join(sector(writer, write_id, first + i, generation) for i in range(count))


def bad_sectors(writer: int, data: bytes) -> list[str]:
    """Every sector of ``data`` that is neither zero nor a valid sector of ``writer`` at its place."""
    bad = []
    for pos in range(0, len(data), SECTOR):
        s = data[pos : pos + SECTOR]
        if s.count(0) == len(s):
            continue
        if len(s) < SECTOR or s[:4] != MAGIC:
            bad.append(f"@{pos}: garbage {s[:32].hex()}")
            continue
        _, w, write_id, index, generation = _HEADER.unpack(s[: _HEADER.size])
        if w != writer:
            bad.append(f"@{pos}: foreign sector of writer {w} (write {write_id}, index {index})")
        elif index != pos // SECTOR:
            bad.append(f"@{pos}: sector of index {index} at the wrong position")
        elif s != sector(w, write_id, index, generation):
            bad.append(f"@{pos}: corrupt payload")
    return bad


def first_difference(a: bytes, b: bytes) -> int | None:
    """The first offset where ``a`` and ``b`` differ (the shorter one's end if one is a prefix)."""
    if a == b:
        return None
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))


# -- findings -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Findings:
    """What the workload saw while running; ``problems`` is what makes a run fail."""

    hang_s: float
    ops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # expected errors, by op and code
    problems: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # the kills, to reproduce a failure
    max_latency_s: float = 0.0

    def problem(self, text: str) -> None:
        log.error("violation %s", text)
        self.problems.append(text)

    def error(self, what: str, exc: BaseException) -> None:
        """Count an operation's failure; a status other than a transient one is a problem."""
        if isinstance(exc, FS3Error):
            code = StatusCode(exc.code).name if exc.code in StatusCode._value2member_map_ else exc.code
            en = to_errno(exc.code)
            self.errors[f"{what}:{code}/{errno.errorcode.get(en, en)}"] += 1
            if exc.code not in _EXPECTED_CODES:
                self.problem(f"{what}: unexpected {code} ({errno.errorcode.get(en, en)}): {exc}")
        elif isinstance(exc, TimeoutError):
            self.errors[f"{what}:hang"] += 1  # already reported by timed()
        else:
            self.problem(f"{what}: unexpected {type(exc).__name__}: {exc}")

    async def timed(self, what: str, op: Awaitable[T]) -> T:
        """Await ``op``; one that takes longer than ``hang_s`` is a problem (and raises TimeoutError)."""
        start = time.monotonic()
        try:
            return await asyncio.wait_for(op, self.hang_s)
        except TimeoutError:
            self.problem(f"hang: {what} took more than {self.hang_s}s")
            raise
        finally:
            self.max_latency_s = max(self.max_latency_s, time.monotonic() - start)


# -- failed operations ----------------------------------------------------------------------------


@dataclass(slots=True)
class InFlight:
    """The operation a writer has under way, enough to bound what its failure may have left."""

    kind: str
    before: dict[str, bytes | None]  # each file's acknowledged content as the operation began
    write_id: int | None = None  # the sectors it writes carry this id
    opened: bool = False  # seqwrite: its truncating open returned
    new_length: int | None = None  # truncate: the length asked for


def _is_sector_of(s: bytes, writer: int, write_id: int | None, index: int) -> bool:
    """Whether ``s`` is a whole, valid sector that ``writer``'s write ``write_id`` puts at ``index``."""
    if write_id is None or len(s) < SECTOR or s[:4] != MAGIC:
        return False
    _, w, wid, i, generation = _HEADER.unpack(s[: _HEADER.size])
    return (w, wid, i) == (writer, write_id, index) and s == sector(w, wid, i, generation)


def _written_over(data: bytes, acked: bytes, writer: int, write_id: int | None) -> str | None:
    """What is wrong with ``data`` as ``acked`` after writes of ``write_id`` that may or may not
    have landed: every acknowledged sector is there or was written over by that write, and past the
    acknowledged end there is only that write's sectors or zeros. None if nothing."""
    if len(data) < len(acked):
        return f"shorter ({len(data)}) than acknowledged ({len(acked)})"
    for pos in range(0, len(data), SECTOR):
        s = data[pos : pos + SECTOR]
        if pos < len(acked) and s == acked[pos : pos + SECTOR]:
            continue
        if _is_sector_of(s, writer, write_id, pos // SECTOR):
            continue
        if pos >= len(acked) and s.count(0) == len(s):
            continue
        return f"sector @{pos} is neither acknowledged nor of the write in flight: {bad_sectors(writer, s) or s[:32].hex()}"
    return None


def write_ids(data: bytes) -> dict[int, int]:
    """How many sectors of each write id ``data`` holds (0: zero sectors; -1: not a sector)."""
    ids: Counter[int] = Counter()
    for pos in range(0, len(data), SECTOR):
        s = data[pos : pos + SECTOR]
        if s.count(0) == len(s):
            ids[0] += 1
        elif len(s) == SECTOR and s[:4] == MAGIC:
            ids[_HEADER.unpack(s[: _HEADER.size])[2]] += 1
        else:
            ids[-1] += 1
    return dict(ids)


def failed_op_problem(
    op: InFlight, writer: int, acked: dict[str, bytes], found: dict[str, bytes | None]
) -> str | None:
    """What is wrong with ``found`` (each file's content, None if absent) after ``op`` failed, its
    outcome unknown; ``acked`` is the writer's model then (what fsyncs during the operation
    acknowledged). None if it is one of the operation's possible outcomes."""
    before = op.before
    if op.kind == "rename":
        a, b = list(before)
        if found[a] is None:  # applied
            return (
                None if found[b] == before[a] else "renamed, but the target does not hold the source's bytes"
            )
        return None if found[a] == before[a] and found[b] == before[b] else "not renamed, but changed"
    (name,) = before
    data, old = found[name], before[name]
    if op.kind == "unlink":
        return None if data is None or data == old else "not unlinked, but changed"
    if data is None:
        return f"gone after a failed {op.kind}" if old is not None or op.opened else None
    if op.kind == "truncate":
        assert old is not None and op.new_length is not None
        return _cut(data, old, op.new_length)
    if op.kind == "seqwrite" and not op.opened:  # its O_TRUNC open may or may not have happened
        return _cut(data, old or b"", 0)
    return _written_over(data, acked.get(name, b""), writer, op.write_id)


def _cut(data: bytes, old: bytes, new: int) -> str | None:
    """What is wrong with ``data`` as what a truncate of ``old`` to ``new`` bytes that failed may
    have left: the old length or the new, the bytes below the cut unchanged, and past it old bytes
    or zeros (meta trims storage first, then sets the length: a failure in between leaves the old
    length with the trimmed chunks reading as zeros, meta/namespace.py)."""
    if len(data) not in (len(old), new):
        return f"length {len(data)}, neither the old {len(old)} nor the new {new}"
    keep = min(new, len(old), len(data))
    if data[:keep] != old[:keep]:
        return f"bytes below the cut changed at {first_difference(data[:keep], old[:keep])}"
    for pos in range(keep, len(data), SECTOR):
        s = data[pos : pos + SECTOR]
        if s.count(0) != len(s) and s != old[pos : pos + SECTOR]:
            return f"sector @{pos} past the cut is neither old nor zero"
    return None


# -- writers and readers --------------------------------------------------------------------------


class Writer:
    """One writer task over its own directory ``/w<n>``, keeping the model of acknowledged content."""

    def __init__(
        self,
        index: int,
        fs: FileSystem,
        rng: random.Random,
        config: WorkloadConfig,
        write_ids: Iterator[int],
        findings: Findings,
    ) -> None:
        self.index = index
        self.fs = fs
        self.rng = rng
        self.config = config
        self.write_ids = write_ids
        self.findings = findings
        self.dir = f"/w{index}"
        self.names = [f"f{k}" for k in range(config.files_per_writer)]
        self.model: dict[str, bytearray] = {}  # name -> acknowledged content
        self.generation = 0
        self.held: set[asyncio.Task[None]] = set()  # reads of files unlinked while held open
        self.op = InFlight("", {})

    def path(self, name: str) -> str:
        return f"{self.dir}/{name}"

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._run(stop)
        finally:
            await asyncio.gather(*self.held)

    async def _run(self, stop: asyncio.Event) -> None:
        await self.fs.mkdir(self.dir)
        while not stop.is_set():
            kind, names = self._choose()
            what = f"w{self.index} {kind} {names}"
            self.op = InFlight(kind, {n: bytes(self.model[n]) if n in self.model else None for n in names})
            try:
                await self.findings.timed(what, getattr(self, "_" + kind)(*names))
                self.findings.ops[kind] += 1
                if self.rng.random() < self.config.readback_probability:
                    await self.readback([n for n in names if n in self.model])
            except Exception as e:
                log.info("op failed what=%r error=%r", what, str(e)[:200])
                self.findings.error(kind, e)
                await self.recover(names)

    def _choose(self) -> tuple[str, list[str]]:
        rng = self.rng
        existing = [n for n in self.names if n in self.model]
        r = rng.random()
        if not existing or r < 0.25:
            return "seqwrite", [rng.choice(self.names)]
        if r < 0.50:
            return "overwrite", [rng.choice(existing)]
        if r < 0.65:
            return "append", [rng.choice(existing)]
        if r < 0.77:
            return "truncate", [rng.choice(existing)]
        if r < 0.90:
            a = rng.choice(existing)
            return "rename", [a, rng.choice([n for n in self.names if n != a])]
        return "unlink", [rng.choice(existing)]

    @contextlib.asynccontextmanager
    async def _open(self, name: str, mode: str):  # type: ignore[no-untyped-def]
        """Open; close on success (the close is an acknowledgement), best-effort close on failure."""
        f = await self.fs.open(self.path(name), mode)
        try:
            yield f
        except BaseException:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(f.close(), 90)
            raise
        await f.close()

    async def _seqwrite(self, name: str) -> None:
        """O_TRUNC create, then sequential writes with occasional fsyncs."""
        write_id, self.generation = next(self.write_ids), self.generation + 1
        self.op.write_id = write_id
        content = bytearray()
        async with self._open(name, "w") as f:
            self.model[name] = bytearray()  # the truncating open returned
            self.op.opened = True
            total = self.rng.randint(1, self.config.max_sectors)
            pos = 0
            while pos < total:
                n = min(total - pos, self.rng.randint(1, 80))
                data = sectors(self.index, write_id, pos * SECTOR, n, self.generation)
                await f.write(data)
                content += data
                pos += n
                if self.rng.random() < 0.1:
                    await f.fsync()
                    self.model[name] = bytearray(content)
            if self.rng.random() < 0.5:
                await f.fsync()
                self.model[name] = bytearray(content)
        self.model[name] = content

    async def _overwrite(self, name: str) -> None:
        """Rounds of random pwrites (also past the end, leaving holes), each round fsynced."""
        write_id = self.op.write_id = next(self.write_ids)
        content = bytearray(self.model[name])
        async with self._open(name, "r+") as f:
            for _ in range(self.rng.randint(1, 4)):
                self.generation += 1
                for _ in range(self.rng.randint(1, 8)):
                    size_sectors = (len(content) + SECTOR - 1) // SECTOR
                    off = self.rng.randrange(0, size_sectors + 16) * SECTOR
                    data = sectors(self.index, write_id, off, self.rng.randint(1, 64), self.generation)
                    await f.pwrite(data, off)
                    if len(content) < off:
                        content.extend(bytes(off - len(content)))
                    content[off : off + len(data)] = data
                await f.fsync()
                self.model[name] = bytearray(content)
        self.model[name] = content

    async def _append(self, name: str) -> None:
        """O_APPEND writes, sometimes fsynced."""
        write_id, self.generation = next(self.write_ids), self.generation + 1
        self.op.write_id = write_id
        content = bytearray(self.model[name])
        if len(content) % SECTOR:
            return
        async with self._open(name, "a") as f:
            for _ in range(self.rng.randint(1, 6)):
                data = sectors(self.index, write_id, len(content), self.rng.randint(1, 40), self.generation)
                await f.write(data)
                content += data
            if self.rng.random() < 0.5:
                await f.fsync()
                self.model[name] = bytearray(content)
        self.model[name] = content

    async def _truncate(self, name: str) -> None:
        """Shrink or extend (with zeros), by path or through an open file."""
        content = self.model[name]
        new = self.op.new_length = self.rng.randint(0, len(content) // SECTOR + 8) * SECTOR
        if self.rng.random() < 0.5:
            await self.fs.truncate(self.path(name), new)
        else:
            async with self._open(name, "r+") as f:
                await f.truncate(new)
        if new <= len(content):
            del content[new:]
        else:
            content.extend(bytes(new - len(content)))

    async def _rename(self, a: str, b: str) -> None:
        """Rename, replacing ``b`` if it exists."""
        await self.fs.rename(self.path(a), self.path(b))
        self.model[b] = self.model.pop(a)

    async def _unlink(self, name: str) -> None:
        """Unlink; sometimes with the file held open by a reader that reads it after the collector's
        grace (meta's read session must keep its chunks until the close)."""
        held = None
        if self.rng.random() < 0.4:
            held = await self.fs.open(self.path(name))
        try:
            await self.fs.unlink(self.path(name))
        except BaseException:
            if held is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(held.close(), 90)
            raise
        want = bytes(self.model.pop(name))
        if held is not None:
            task = asyncio.create_task(self._read_held(held, name, want))
            self.held.add(task)
            task.add_done_callback(self.held.discard)

    async def _read_held(self, f, name: str, want: bytes) -> None:  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(GC_GRACE_S + 1.5 + self.rng.random())
            data = await self.findings.timed(f"w{self.index} read unlinked {name}", f.pread(len(want) + 1, 0))
            self._compare(name, "unlinked while held open: read back", data, want)
            self.findings.ops["held read"] += 1
        except FS3Error as e:
            if e.code == StatusCode.SESSION_LOST:  # meta lost the read session: the file went
                self.findings.problem(f"{self.path(name)} unlinked while held open: {e}")
            else:
                self.findings.error("held read", e)
        except Exception as e:
            self.findings.error("held read", e)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(f.close(), 90)

    async def recover(self, names: list[str]) -> None:
        """After a failed operation: read what each of ``names`` holds (until a read succeeds) and
        judge it against the acknowledged state and the operation (:func:`failed_op_problem`), then
        rewrite or remove each until that succeeds, so that the model is definitive again."""
        timed = self.findings.timed
        deadline = time.monotonic() + 2 * self.config.hang_s
        found: dict[str, bytes | None] = {}
        for name in names:
            while name not in found:
                try:
                    if await timed(f"w{self.index} recover exists", self.fs.exists(self.path(name))):
                        found[name] = await timed(
                            f"w{self.index} recover read", self.fs.read_file(self.path(name))
                        )
                    else:
                        found[name] = None
                except Exception as e:
                    self.findings.error("recover read", e)
                    if time.monotonic() > deadline:
                        raise AssertionError(f"could not read {self.path(name)}: {e!r}") from e
                    await asyncio.sleep(0.5 + self.rng.random())
        acked = {n: bytes(c) for n, c in self.model.items()}
        if problem := failed_op_problem(self.op, self.index, acked, found):
            now = {n: None if d is None else write_ids(d) for n, d in found.items()}
            was = {n: None if d is None else write_ids(d) for n, d in self.op.before.items()}
            self.findings.problem(
                f"after a failed {self.op.kind} of {[self.path(n) for n in names]} (write "
                f"{self.op.write_id}): {problem}; sectors by write id before {was}, now {now}"
            )
        for name in names:
            gone = found[name] is None
            while True:
                try:
                    if gone:
                        self.model.pop(name, None)
                    elif self.rng.random() < 0.3:
                        await timed(f"w{self.index} recover unlink", self.fs.unlink(self.path(name)))
                        self.model.pop(name, None)
                    else:
                        await timed(f"w{self.index} recover seqwrite", self._seqwrite(name))
                    break
                except Exception as e:
                    self.findings.error("recover", e)
                    if time.monotonic() > deadline:
                        raise AssertionError(f"could not recover {self.path(name)}: {e!r}") from e
                    await asyncio.sleep(0.5 + self.rng.random())

    async def readback(self, names: list[str]) -> None:
        """Read files whose state is acknowledged; they must match the model exactly."""
        for name in names:
            try:
                data = await self.findings.timed(
                    f"w{self.index} readback {name}", self.fs.read_file(self.path(name))
                )
            except Exception as e:
                self.findings.error("readback", e)
                continue
            self._compare(name, "acknowledged read-back mismatch,", data, bytes(self.model[name]))
            self.findings.ops["readback"] += 1

    def _compare(self, name: str, what: str, data: bytes, want: bytes) -> None:
        if data != want:
            self.findings.problem(
                f"{self.path(name)}: {what} len {len(data)} (want {len(want)}), first difference at "
                f"{first_difference(data, want)}, bad sectors {bad_sectors(self.index, data)[:3]}"
            )


async def read_randomly(
    fs: FileSystem, writers: int, stop: asyncio.Event, rng: random.Random, findings: Findings
) -> None:
    """Read random files of random writers while they change; every sector must be zero or valid."""
    while not stop.is_set():
        w = rng.randrange(writers)
        try:
            names = await findings.timed("reader listdir", fs.listdir(f"/w{w}"))
            if names:
                path = f"/w{w}/{rng.choice(names)}"
                data = await findings.timed(f"reader read {path}", fs.read_file(path))
                if bad := bad_sectors(w, data):
                    findings.problem(f"reader: {path} (len {len(data)}): {bad[:4]}")
                findings.ops["reader"] += 1
        except FS3Error as e:
            if e.code != StatusCode.NOT_FOUND:  # the writer renamed or removed it meanwhile
                findings.error("reader", e)
        except Exception as e:
            findings.error("reader", e)
        await asyncio.sleep(0.02)


# -- daemon kills ---------------------------------------------------------------------------------


class DaemonKiller:
    """Kills random daemons with SIGKILL and restarts them on the same address after a random delay."""

    def __init__(self, fc: FsCluster, rng: random.Random, config: WorkloadConfig, findings: Findings):
        self.fc = fc
        self.cluster = fc.cluster
        self.rng = rng
        self.config = config
        self.findings = findings

    def _victims(self, cycle: int) -> list[tuple[str, int]]:
        """One or two storage daemons, meta, or mgmtd; the first four cycles go through these kinds
        in turn, so that even a short run kills each kind once."""
        r = (0.0, 0.6, 0.8, 0.9)[cycle] if cycle < 4 else self.rng.random()
        if r < 0.55:
            return [("storage", self.rng.randrange(len(self.cluster.nodes)))]
        if r < 0.75:
            return [("storage", i) for i in self.rng.sample(range(len(self.cluster.nodes)), 2)]
        if r < 0.85:
            return [("meta", 0)]
        return [("mgmtd", 0)]

    def _proc(self, kind: str, index: int) -> Proc:
        proc = {
            "storage": lambda: self.cluster.nodes[index].proc,
            "meta": lambda: self.fc.meta_procs[index],
            "mgmtd": lambda: self.cluster.mgmtd_proc,
        }[kind]()
        assert proc is not None and proc.popen is not None
        return proc

    def _kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        assert proc.popen is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, sig)
        proc.popen.wait(timeout=30)

    async def _restart(self, kind: str, index: int) -> None:
        c = self.cluster
        if kind == "storage":
            c.start_storage(index)
            await c._wait_port(c.nodes[index], 30)
        elif kind == "meta":
            self.fc.start_meta(index)
            await c._read_port(c.tmp / f"meta-{index}.port", self.fc.meta_procs[index], 30)
        else:
            await self.cluster.restart_mgmtd()

    async def run(self) -> None:
        for cycle in range(self.config.cycles):
            victims = self._victims(cycle)
            down_s = self.rng.uniform(0, self.config.max_down_s)
            sig = signal.SIGTERM if victims == [("mgmtd", 0)] and self.rng.random() < 0.5 else signal.SIGKILL
            for kind, index in victims:
                self._kill(self._proc(kind, index), sig)
            how = "stopped (SIGTERM, stop fence)" if sig == signal.SIGTERM else "killed"
            event = f"cycle {cycle}: {how} {victims}, restarting after {down_s:.2f}s"
            log.info(event)
            self.findings.events.append(event)
            await asyncio.sleep(down_s)
            for kind, index in victims:
                await self._restart(kind, index)
            if self.rng.random() < 0.3:
                with contextlib.suppress(AssertionError):  # not required, only a chance to settle
                    await self.cluster.wait_all_serving(120)
            await asyncio.sleep(self.rng.uniform(0.2, self.config.max_gap_s))


# -- final verification ---------------------------------------------------------------------------


async def settle(fc: FsCluster, timeout_s: float) -> None:
    """Wait until mgmtd knows every storage daemon's current process and every chain serves."""
    admin = fc.cluster.admin
    assert admin is not None
    for node in fc.cluster.nodes:
        assert node.proc is not None and node.proc.popen is not None
        pid = node.proc.popen.pid

        async def heard(node_id: int = node.node_id, pid: int = pid) -> bool:
            return any(n.node_id == node_id and n.pid == pid for n in await admin.list_nodes())

        await wait_until(heard, 60, f"mgmtd to hear from storage {node.node_id}")
    await fc.cluster.wait_all_serving(timeout_s)


async def verify_files(fs: FileSystem, writers: list[Writer]) -> tuple[list[str], set[int]]:
    """Every writer's directory holds exactly its modelled files with exactly the modelled bytes.
    Returns the problems and the inode ids of the live files."""
    problems: list[str] = []
    inodes: set[int] = set()
    for w in writers:
        names = sorted(await fs.listdir(w.dir))
        if names != sorted(w.model):
            problems.append(f"{w.dir} lists {names}, acknowledged state is {sorted(w.model)}")
        for name, content in w.model.items():
            try:
                st = await fs.stat(w.path(name))
                inodes.add(st.st_ino)
                data = await fs.read_file(w.path(name))
            except Exception as e:
                problems.append(f"{w.path(name)}: cannot read an acknowledged file: {e!r}")
                continue
            if st.st_size != len(content):
                problems.append(f"{w.path(name)}: size {st.st_size}, acknowledged size {len(content)}")
            if data != content:
                problems.append(
                    f"{w.path(name)} (inode {st.st_ino:#x}): content differs from the acknowledged "
                    f"content: len {len(data)} (want {len(content)}), first difference at "
                    f"{first_difference(data, content)}, bad sectors {bad_sectors(w.index, data)[:4]}"
                )
    return problems, inodes


async def chunk_problems(fs: FileSystem, chain_targets: dict[int, list[int]], live: set[int]) -> list[str]:
    """Every chain's replicas hold the same chunks with the same length and checksum, none pending
    or lost, and none of an inode that is not live (a leftover of a deleted or truncated file)."""
    problems: list[str] = []
    for chain_id, targets in chain_targets.items():
        dumps = {}
        for tid in targets:
            metas = await fs.storage.dump_chunk_meta(tid, 0)
            dumps[tid] = {(m.key.inode_id, m.key.chunk_index): m for m in metas}
        head = dumps[targets[0]]
        for tid, chunks in dumps.items():
            if unsettled := [k for k, m in chunks.items() if m.pending_version != 0 or m.lost]:
                problems.append(f"chain {chain_id} target {tid}: pending or lost chunks {unsettled[:5]}")
            mine = {k: (m.length, m.crc32c) for k, m in chunks.items()}
            theirs = {k: (m.length, m.crc32c) for k, m in head.items()}
            if mine != theirs:
                diff = sorted(set(mine.items()) ^ set(theirs.items()))[:6]
                problems.append(f"chain {chain_id}: replica {tid} differs from {targets[0]}: {diff}")
        if leftovers := sorted({k[0] for k in head if k[0] not in live}):
            problems.append(f"chain {chain_id}: chunks of deleted inodes {[hex(i) for i in leftovers[:10]]}")
    return problems


async def verify(fc: FsCluster, writers: list[Writer], config: WorkloadConfig) -> list[str]:
    """The final checks, through a fresh client. Chunk checks are retried until ``chunk_settle_s``
    passes, since resync and garbage collection finish in the background after the chains serve."""
    fs = await fc.connect()
    problems, live = await verify_files(fs, writers)
    deadline = time.monotonic() + config.chunk_settle_s
    while chunks := await chunk_problems(fs, fc.cluster.chain_targets, live):
        if time.monotonic() > deadline:
            return problems + chunks
        await asyncio.sleep(1)
    return problems


async def run_workload(tmp: Path, config: WorkloadConfig) -> Findings:
    """Start a cluster under ``tmp``, run the workload through ``config.cycles`` kill/restart cycles,
    verify, and stop everything. The returned findings' ``problems`` is empty on success."""
    rng = random.Random(config.seed)
    findings = Findings(config.hang_s)
    fc = FsCluster(
        tmp, chains=3, stripe=3, chunk_size=64 * 1024, mgmtd_extra={"stop_fence_s": MGMTD_STOP_FENCE_S}
    )
    try:
        await fc.start()
        clients = [await fc.connect() for _ in range(config.clients)]
        if config.client_retry_s is not None:  # failures become common: their checks then run
            for c in clients:
                c.meta.timeout_s = c.storage.retry.total_s = config.client_retry_s
        write_ids = itertools.count(1)
        writers = [
            Writer(i, clients[i % len(clients)], random.Random(rng.random()), config, write_ids, findings)
            for i in range(config.writers)
        ]
        stop = asyncio.Event()
        reader_fs = await fc.connect()
        workers = [asyncio.create_task(w.run(stop)) for w in writers] + [
            asyncio.create_task(
                read_randomly(reader_fs, config.writers, stop, random.Random(rng.random()), findings)
            )
            for _ in range(config.readers)
        ]
        killer = asyncio.create_task(DaemonKiller(fc, random.Random(rng.random()), config, findings).run())
        try:
            # a worker must not end before the kills do; if one does, its exception ends the run
            done, _ = await asyncio.wait([killer, *workers], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
            if killer not in done:
                raise AssertionError("a workload task ended before the kills did")
            stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), 2 * config.hang_s)
        finally:
            for t in [killer, *workers]:
                t.cancel()
            await asyncio.gather(killer, *workers, return_exceptions=True)
        log.info("workload done ops=%s errors=%s", dict(findings.ops), dict(findings.errors))
        await settle(fc, config.settle_s)
        findings.problems += await verify(fc, writers, config)
        log.info("verified max_latency_s=%.1f problems=%d", findings.max_latency_s, len(findings.problems))
    finally:
        await fc.stop()
    return findings
