"""An fsx-style exerciser: random operations on one file through a mount, each checked against a
model of the file in memory.

Writes large and small (runs of small ones at random offsets, which the mount gathers into one
update per chunk), reads, truncates that shrink and extend, fsync, close and reopen, and reads and
writes through a shared memory mapping; after every read its bytes are checked, after some
operations the file's size. :func:`two_writers` has two threads write and read their own stripes of
one file at once. A failure names the seed and the last operations, so that it can be replayed.
"""

from __future__ import annotations

import mmap
import os
import random
import threading
from array import array
from collections import deque
from pathlib import Path


class Mismatch(AssertionError):
    pass


def words(tag: int, n: int) -> bytes:
    """``n`` bytes of 8-byte words counting up from ``tag`` (a write's number in the high bits): a
    misplaced, stale or torn range shows."""
    return array("Q", range(tag, tag + (n + 7) // 8)).tobytes()[:n]


class Fsx:
    def __init__(self, path: Path, seed: int, *, max_size: int, mapped: bool = True) -> None:
        """``mapped``: also read and write through shared mappings (a FUSE file opened with
        direct_io cannot be mapped: ENODEV)."""
        self.ops = [(name, w) for name, w in self.OPS if mapped or not name.startswith("map_")]
        self.path = path
        self.seed = seed
        self.rng = random.Random(seed)
        self.max_size = max_size
        self.model = bytearray()
        self.log: deque[str] = deque(maxlen=25)
        self.counts: dict[str, int] = {}
        self._writes = 0
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- checks -----------------------------------------------------------------------------------

    def fail(self, what: str) -> None:
        raise Mismatch(f"fsx seed {self.seed}: {what}\nlast operations:\n  " + "\n  ".join(self.log))

    def _compare(self, offset: int, got: bytes, what: str) -> None:
        want = bytes(self.model[offset : offset + len(got)])
        if len(got) != len(want):
            self.fail(f"{what} at {offset}: {len(got)} bytes, the model has {len(want)}")
        if got != want:
            at = next(i for i in range(len(got)) if got[i] != want[i])
            self.fail(
                f"{what} at {offset}: byte {offset + at} is {got[at]:#04x}, the model has {want[at]:#04x} "
                f"({len(got)} bytes read)"
            )

    def check_size(self) -> None:
        size = os.fstat(self.fd).st_size
        if size != len(self.model):
            self.fail(f"size {size}, the model has {len(self.model)}")

    def check_all(self, fd: int | None = None) -> None:
        fd = self.fd if fd is None else fd
        got = bytearray()
        while len(got) < len(self.model) + 1:
            part = os.pread(fd, 1 << 20, len(got))
            if not part:
                break
            got += part
        self._compare(0, bytes(got), "whole file")

    # -- operations -------------------------------------------------------------------------------

    def _data(self, n: int) -> bytes:
        tag = (self._writes << 32) + ((self.seed & 0xFF) << 56)
        self._writes += 1
        return words(tag, n)

    def _offset(self) -> int:
        # mostly inside the file or just past it (appends, small holes); sometimes anywhere
        if self.rng.random() < 0.8:
            return self.rng.randrange(0, min(self.max_size, len(self.model) + 4096) + 1)
        return self.rng.randrange(0, self.max_size)

    def _put(self, offset: int, data: bytes) -> None:
        if offset > len(self.model):
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset : offset + len(data)] = data

    def write(self) -> None:
        offset = self._offset()
        n = self.rng.choice([1, 17, 4096, 65536, 300_000, 1_100_000])
        n = max(1, min(self.rng.randint(1, n), self.max_size - offset))
        data = self._data(n)
        self.log.append(f"write {offset}+{n}")
        if os.pwrite(self.fd, data, offset) != n:
            self.fail(f"short write at {offset}")
        self._put(offset, data)

    def small_writes(self) -> None:
        k = self.rng.randint(5, 40)
        self.log.append(f"{k} small writes")
        for _ in range(k):
            offset = self.rng.randrange(0, min(len(self.model) + 4096, self.max_size))
            n = self.rng.randint(1, min(4096, self.max_size - offset))
            data = self._data(n)
            os.pwrite(self.fd, data, offset)
            self._put(offset, data)

    def read(self) -> None:
        offset = self.rng.randrange(0, len(self.model) + 2)
        n = self.rng.choice([1, 4096, 65536, 1_200_000])
        n = self.rng.randint(1, n)
        self.log.append(f"read {offset}+{n}")
        self._compare(offset, os.pread(self.fd, n, offset), "read")

    def truncate(self) -> None:
        r = self.rng.random()
        if r < 0.5:
            size = self.rng.randrange(0, len(self.model) + 1)  # shrink
        elif r < 0.7:
            size = len(self.model)
        else:
            size = self.rng.randrange(len(self.model), self.max_size + 1)  # extend with zeros
        self.log.append(f"truncate {size}")
        os.ftruncate(self.fd, size)
        if size < len(self.model):
            del self.model[size:]
        else:
            self.model.extend(bytes(size - len(self.model)))

    def fsync(self) -> None:
        self.log.append("fsync")
        os.fsync(self.fd)

    def reopen(self) -> None:
        self.log.append("close and reopen")
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR)

    def map_read(self) -> None:
        if not self.model:
            return
        offset = self.rng.randrange(0, len(self.model))
        n = self.rng.randint(1, min(len(self.model) - offset, 200_000))
        self.log.append(f"mapped read {offset}+{n}")
        with mmap.mmap(self.fd, len(self.model), prot=mmap.PROT_READ) as m:
            self._compare(offset, m[offset : offset + n], "mapped read")

    def map_write(self) -> None:
        if not self.model:
            return
        offset = self.rng.randrange(0, len(self.model))
        n = self.rng.randint(1, min(len(self.model) - offset, 100_000))
        data = self._data(n)
        self.log.append(f"mapped write {offset}+{n}")
        with mmap.mmap(self.fd, len(self.model)) as m:
            m[offset : offset + n] = data
            m.flush()
        self._put(offset, data)

    OPS = (
        ("write", 20),
        ("small_writes", 8),
        ("read", 30),
        ("truncate", 5),
        ("fsync", 3),
        ("reopen", 4),
        ("map_read", 6),
        ("map_write", 4),
    )

    def run(self, steps: int) -> None:
        names = [name for name, _ in self.ops]
        weights = [w for _, w in self.ops]
        for step in range(steps):
            name = self.rng.choices(names, weights)[0]
            self.counts[name] = self.counts.get(name, 0) + 1
            getattr(self, name)()
            # not after every operation: a stat makes the mount send what it has buffered, and
            # reads should also meet writes still buffered there
            if self.rng.random() < 0.15:
                self.check_size()
            if step % 200 == 199:
                self.log.append("read the whole file")
                self.check_all()


STRIPE = 64 << 10


def two_writers(paths: tuple[Path, Path], seed: int, *, size: int, steps: int) -> dict[str, int]:
    """Two threads, each with its own descriptors (``paths[w]``: the same file, through one mount
    or two), own alternate 64 KiB stripes of one file of ``size`` bytes: gathered small writes,
    whole-stripe writes, reads of their own stripes (checked), fsync, close and reopen. Afterwards
    the whole file, read through ``paths[0]`` once both have closed, is both writers' bytes.
    Returns the operations done."""
    model = bytearray(size)
    fd = os.open(paths[0], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    errors: list[str] = []
    counts: dict[str, int] = {}

    def worker(w: int) -> None:
        rng = random.Random(seed * 10 + w)
        stripes = [s for s in range(size // STRIPE) if s % 2 == w]
        fd = os.open(paths[w], os.O_RDWR)
        tag = w << 60
        try:
            for step in range(steps):
                base = rng.choice(stripes) * STRIPE
                op = rng.random()
                if op < 0.5:
                    off = base + rng.randrange(STRIPE)
                    n = rng.randint(1, min(6000, base + STRIPE - off)) if op < 0.4 else STRIPE
                    off = off if op < 0.4 else base
                    tag += 1 << 32
                    data = words(tag, n)
                    os.pwrite(fd, data, off)
                    model[off : off + n] = data
                    name = "write"
                elif op < 0.94:
                    off = base + rng.randrange(STRIPE)
                    n = rng.randint(1, base + STRIPE - off)
                    if os.pread(fd, n, off) != model[off : off + n]:
                        errors.append(
                            f"seed {seed} writer {w} step {step}: read {off}+{n} is not what it wrote"
                        )
                        return
                    name = "read"
                elif op < 0.98:
                    os.fsync(fd)
                    name = "fsync"
                else:
                    os.close(fd)
                    fd = -1
                    fd = os.open(paths[w], os.O_RDWR)
                    name = "reopen"
                counts[name] = counts.get(name, 0) + 1
        finally:
            if fd >= 0:
                os.close(fd)

    threads = [threading.Thread(target=worker, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise Mismatch("; ".join(errors))
    with open(paths[0], "rb") as f:
        whole = f.read()
    if whole != model:
        at = next((i for i in range(min(len(whole), size)) if whole[i] != model[i]), min(len(whole), size))
        raise Mismatch(f"seed {seed}: the file ({len(whole)} bytes) differs from both writers' bytes at {at}")
    return counts
