"""Opening a target folds its committed layered versions in batches: one metadata transaction
(one durable sync) per batch of chunks, not one per chunk, and a chunk that cannot be folded stays
layered while the others fold."""

from __future__ import annotations

import math
import os
import struct
import threading
from pathlib import Path

import pytest

from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_files import ChunkFiles
from fs3.storage.chunk_meta import ChunkMeta, block_size, crc32c

pytestmark = pytest.mark.timeout(120)

CS = 1 << 20
B = block_size(CS)
N = 300
BATCH = 256  # the engine's fold batch (chunk_engine._FOLD_BATCH)


def cid(n: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, 12, 0, n)


def layered_target(path: Path) -> tuple[dict[bytes, bytes], dict[bytes, tuple[ChunkMeta, Path, Path]]]:
    """A target of N committed layered chunks; their expected contents, and each one's metadata,
    data file and overlay file."""
    want: dict[bytes, bytes] = {}
    files: dict[bytes, tuple[ChunkMeta, Path, Path]] = {}
    with ChunkEngine(path, EngineOptions(sync=False)) as eng:
        for n in range(N):
            old = os.urandom(CS)
            eng.replace(cid(n), old, chunk_size=CS, chain_ver=1, version=1, commit=True)
            patch = os.urandom(100)
            at = (n % 200) * B + 7
            meta = eng.update(cid(n), at, patch, chunk_size=CS, chain_ver=1)
            committed = eng.commit(cid(n), meta.pending_ver)
            assert committed is not None and committed.committed.layered
            want[cid(n)] = old[:at] + patch + old[at + len(patch) :]
            v = committed.committed
            files[cid(n)] = (
                committed,
                eng._files.path(cid(n), v.file_id),  # noqa: SLF001
                eng._files.path(cid(n), v.overlay_file_id),  # noqa: SLF001
            )
    return want, files


def test_open_folds_layered_chunks_in_batches(tmp_path: Path) -> None:
    want, _ = layered_target(tmp_path)
    with ChunkEngine(tmp_path, EngineOptions(sync=True)) as eng:
        assert len(eng.recovery.layered) == N
        stats = eng.commit_stats()
        assert stats.changes == N
        assert stats.transactions <= math.ceil(N / BATCH) + 1
        for chunk_id, data in want.items():
            meta = eng.get_meta(chunk_id)
            assert meta is not None and meta.committed is not None
            v = meta.committed
            assert not v.layered
            assert (v.overlay_file_id, v.overlay_first, v.overlay_end, v.overlay_runs) == (0, 0, 0, ())
            assert v.crc == crc32c(data)
            assert eng.read(chunk_id).data == data
        # the overlay files are gone: one data file per chunk
        assert sum(1 for p in (tmp_path / "chunks").rglob("*") if p.is_file()) == N
        assert eng.space_info().used == N * CS


def test_a_chunk_that_cannot_be_folded_stays_layered(tmp_path: Path) -> None:
    want, files = layered_target(tmp_path)
    corrupt, lost = cid(3), cid(N - 2)  # in different batches
    overlay, gone = files[corrupt][2], files[lost][1]
    before = {c: files[c][0] for c in (corrupt, lost)}
    with open(overlay, "r+b") as f:
        first = f.read(2)
        f.seek(0)
        f.write(bytes(b ^ 0xFF for b in first))
    gone.unlink()
    with ChunkEngine(tmp_path, EngineOptions(sync=True)) as eng:
        assert eng.recovery.missing_files and len(eng.recovery.layered) == N
        assert eng.commit_stats().changes == N - 2
        for chunk_id in (corrupt, lost):
            assert eng.get_meta(chunk_id) == before[chunk_id]
            assert eng.get_meta(chunk_id).committed.layered
        assert overlay.exists()
        for chunk_id, data in want.items():
            if chunk_id in (corrupt, lost):
                continue
            assert not eng.get_meta(chunk_id).committed.layered
            assert eng.read(chunk_id).data == data


def test_folds_at_open_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fold ends with a sync of its data file; opening runs them side by side instead of one
    after another (the first folds wait for a second one to start: serially the open would fail)."""
    want, _ = layered_target(tmp_path)
    meeting = threading.Barrier(4, timeout=20)
    plain_write = ChunkFiles.write_ranges
    met: list[int] = []
    lock = threading.Lock()

    def write_ranges(self: ChunkFiles, *args: object, **kwargs: object) -> None:
        with lock:
            first = len(met) < 4
            if first:
                met.append(threading.get_ident())
        if first:
            meeting.wait()
        plain_write(self, *args, **kwargs)

    monkeypatch.setattr(ChunkFiles, "write_ranges", write_ranges)
    with ChunkEngine(tmp_path, EngineOptions(sync=True)) as eng:
        assert len(set(met)) == 4
        for chunk_id, data in want.items():
            assert not eng.get_meta(chunk_id).committed.layered
            assert eng.read(chunk_id).data == data
