"""Child process of the crash test: runs chunk updates and commits until it is SIGKILLed.

Usage: ``python chunk_crash_workload.py TARGET_DIR SEED [MODE]``. MODE ``mixed`` (the default) mixes
every kind of update on small chunks; ``small-overwrites`` mostly overwrites a few KiB, or several
small ranges at once, inside 1 MiB chunks (layered versions, folded by the next update). Protocol on stdout, one flushed line per event, chunk
ids in hex:

    READY                         the engine is open
    B <chunk>                     an operation on <chunk> begins
    P <chunk> <version> <crc>     the update returned: <version> is pending with content CRC <crc>
    C <chunk> <version> <crc> <length>   commit returned: that version is committed (acknowledged)
    R <chunk> <version>           commit of a removal returned: the chunk is gone (acknowledged)

The child checks its own work: before each operation it reads the committed content, applies the
operation in memory, and requires the engine's CRC of the new version to match.
"""

from __future__ import annotations

import random
import struct
import sys

from fs3.storage.chunk_engine import ChunkEngine
from fs3.storage.chunk_meta import ChunkMeta, crc32c

CHUNKS = 6


def chunk_id(n: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, 42, 0, n)


def chunk_size(n: int, mode: str) -> int:
    return 1 << 20 if mode == "small-overwrites" else (64 * 1024) << (n % 3)


def small_overwrite(rng: random.Random, old: bytes) -> tuple[int, bytes]:
    """A few KiB inside the chunk, often across a checksum block boundary."""
    length = min(len(old), rng.choice([1, 512, 4096, 8192, 70_000]))
    offset = rng.randrange(0, len(old) - length + 1)
    return offset, rng.randbytes(length)


def small_ranges(rng: random.Random, old: bytes) -> list[tuple[int, bytes]]:
    """Several small ranges inside the chunk, increasing and apart (a gathered random write)."""
    starts = sorted(rng.sample(range(0, len(old) - 600, 600), rng.randint(2, 12)))
    return [(start + rng.randrange(100), rng.randbytes(rng.choice([1, 100, 400]))) for start in starts]


def update_ranges(
    engine: ChunkEngine, cid: bytes, old: bytes, ranges: list[tuple[int, bytes]], size: int
) -> tuple[ChunkMeta, bytearray]:
    """Write ``ranges`` (``(offset, bytes)``, increasing and apart) in one update of a chunk whose
    committed content is ``old``; returns the update's metadata and the content it makes."""
    new = bytearray(old)
    for offset, data in ranges:
        new[offset : offset + len(data)] = data
    joined = b"".join(data for _, data in ranges)
    extents = [(offset, len(data)) for offset, data in ranges]
    meta = engine.update(
        cid, extents[0][0], joined, chunk_size=size, chain_ver=1, checksum=crc32c(joined), extents=extents
    )
    return meta, new


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    target, seed = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "mixed"
    rng = random.Random(seed)
    engine = ChunkEngine(target)
    emit("READY")
    while True:
        n = rng.randrange(CHUNKS)
        cid, size = chunk_id(n), chunk_size(n, mode)
        meta = engine.get_meta(cid)
        assert meta is None or meta.pending is None, "the parent settles pending versions"
        old = engine.read(cid).data if meta is not None else b""
        emit(f"B {cid.hex()}")
        op = rng.random()
        if mode == "small-overwrites" and len(old) > 20_000 and op < 0.35:
            meta, new = update_ranges(engine, cid, old, small_ranges(rng, old), size)
        elif mode == "small-overwrites" and len(old) > 0 and op < 0.7:
            offset, data = small_overwrite(rng, old)
            new = bytearray(old)
            new[offset : offset + len(data)] = data
            meta = engine.update(cid, offset, data, chunk_size=size, chain_ver=1, checksum=crc32c(data))
        elif mode == "small-overwrites" and op < 0.75:  # a chunk to overwrite: whole, or most of one
            new = bytearray(rng.randbytes(rng.choice([size, size - 1, size // 2 + 1])))
            version = (meta.committed_ver if meta else 0) + 1
            meta = engine.replace(cid, new, chunk_size=size, chain_ver=2, version=version)
        elif op < 0.45:  # overwrite (copy-on-write), possibly extending
            offset = rng.randrange(0, max(1, len(old)))
            data = rng.randbytes(rng.randrange(1, min(size - offset, 20_000) + 1))
            new = bytearray(old)
            new[offset : offset + len(data)] = data
            meta = engine.update(cid, offset, data, chunk_size=size, chain_ver=1, checksum=crc32c(data))
        elif op < 0.75 and len(old) < size:  # append at the end (in place)
            data = rng.randbytes(rng.randrange(1, min(size - len(old), 30_000) + 1))
            new = bytearray(old + data)
            meta = engine.update(cid, len(old), data, chunk_size=size, chain_ver=1)
        elif op < 0.85:
            length = rng.randrange(0, size + 1)
            new = bytearray(old[:length] + bytes(max(0, length - len(old))))
            meta = engine.truncate(cid, length, chunk_size=size, chain_ver=1)
        elif op < 0.93 and meta is not None:
            meta = engine.remove(cid, chain_ver=1)
            emit(f"P {cid.hex()} {meta.pending_ver} removal")
            assert engine.commit(cid, meta.pending_ver) is None
            emit(f"R {cid.hex()} {meta.pending_ver}")
            continue
        else:  # full-chunk replace, as resync or a syncing successor would receive
            new = bytearray(rng.randbytes(rng.randrange(0, size + 1)))
            version = (meta.committed_ver if meta else 0) + 1
            meta = engine.replace(cid, new, chunk_size=size, chain_ver=2, version=version)
        crc = crc32c(new)
        assert meta.pending.crc == crc and meta.pending.length == len(new), "engine disagrees with model"
        emit(f"P {cid.hex()} {meta.pending_ver} {crc}")
        committed = engine.commit(cid, meta.pending_ver)
        assert committed is not None and committed.crc == crc
        emit(f"C {cid.hex()} {committed.committed_ver} {crc} {len(new)}")


if __name__ == "__main__":
    main()
