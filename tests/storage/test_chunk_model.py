"""Property test: random sequences of chunk operations (and reopens) against a model in memory."""

from __future__ import annotations

import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fs3.errors import FS3Error, StatusCode
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions

CHUNK_SIZES = [64 * 1024, 128 * 1024, 64 * 1024, 512 * 1024]  # 512 KiB: layered overwrites


def cid(n: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, 5, 0, n)


@dataclass
class Model:
    committed: bytes | None = None
    committed_ver: int = 0
    pending: bytes | None = None  # None with pending_ver > 0: a pending removal
    pending_ver: int = 0

    @property
    def exists(self) -> bool:
        return self.committed is not None or self.pending_ver > 0


chunks = st.integers(0, len(CHUNK_SIZES) - 1)
_PATTERN = bytes(range(251)) * 800  # 251 is prime: any slice is distinguishable from a shifted one


def _payload(start: int, length: int) -> bytes:
    return _PATTERN[start : start + length]


# cheap to generate (hypothesis is slow at drawing large binaries), varied enough to expose offsets
payloads = st.binary(max_size=40) | st.builds(_payload, st.integers(0, 250), st.integers(0, 140_000))


class ChunkEngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="fs3-chunk-model-"))
        self.engine = ChunkEngine(self.dir, EngineOptions(sync=False))
        self.model = [Model() for _ in CHUNK_SIZES]

    def teardown(self) -> None:
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _expect_version_error(self, m: Model) -> bool:
        return m.pending_ver not in (0, m.committed_ver + 1)

    def _set_pending(self, n: int, content: bytes | None) -> None:
        m = self.model[n]
        m.pending, m.pending_ver = content, m.committed_ver + 1

    @rule(n=chunks, offset=st.integers(0, 140_000), data=payloads)
    def update(self, n: int, offset: int, data: bytes) -> None:
        m, size = self.model[n], CHUNK_SIZES[n]
        try:
            self.engine.update(cid(n), offset, data, chunk_size=size, chain_ver=1)
        except FS3Error as exc:
            if offset + len(data) > size:
                assert exc.code is StatusCode.STORAGE_CHUNK_TOO_LARGE
            else:
                assert self._expect_version_error(m) and exc.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
            return
        assert offset + len(data) <= size and not self._expect_version_error(m)
        base = bytearray(m.committed or b"")
        base.extend(bytes(max(0, offset - len(base))))
        base[offset : offset + len(data)] = data
        self._set_pending(n, bytes(base))

    @rule(
        n=chunks,
        first=st.integers(0, 140_000),
        pieces=st.lists(st.tuples(st.integers(1, 24_000), st.integers(1, 3_000)), min_size=1, max_size=8),
        start=st.integers(0, 250),
        commit=st.booleans(),
    )
    def update_ranges(
        self, n: int, first: int, pieces: list[tuple[int, int]], start: int, commit: bool
    ) -> None:
        """Several ranges in one update (gap before each but the first, length), as a client's
        gathered random writes: few small ones make a layered version with several overlay runs;
        ``commit`` as the tail of a chain does."""
        m, size = self.model[n], CHUNK_SIZES[n]
        extents, pos = [], first
        for i, (gap, length) in enumerate(pieces):
            at = pos if i == 0 else pos + gap
            extents.append((at, length))
            pos = at + length
        data = _payload(start, sum(length for _, length in extents))
        try:
            self.engine.update(
                cid(n), first, data, chunk_size=size, chain_ver=1, commit=commit, extents=extents
            )
        except FS3Error as exc:
            if pos > size:
                assert exc.code is StatusCode.STORAGE_CHUNK_TOO_LARGE
            else:
                assert self._expect_version_error(m) and exc.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
            return
        assert pos <= size and not self._expect_version_error(m)
        new = bytearray(m.committed or b"")
        new.extend(bytes(max(0, pos - len(new))))
        taken = 0
        for at, length in extents:
            new[at : at + length] = data[taken : taken + length]
            taken += length
        if commit:
            m.committed, m.committed_ver, m.pending, m.pending_ver = bytes(new), m.committed_ver + 1, None, 0
        else:
            self._set_pending(n, bytes(new))

    @rule(n=chunks, start=st.integers(0, 250))
    def fill(self, n: int, start: int) -> None:
        """The whole chunk written and committed: what small overwrites then layer over."""
        m, size = self.model[n], CHUNK_SIZES[n]
        data = (_PATTERN * 3)[start : start + size]
        try:
            self.engine.update(cid(n), 0, data, chunk_size=size, chain_ver=1, commit=True)
        except FS3Error as exc:
            assert self._expect_version_error(m) and exc.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
            return
        assert not self._expect_version_error(m)
        m.committed, m.committed_ver, m.pending, m.pending_ver = data, m.committed_ver + 1, None, 0

    @rule(n=chunks, offset=st.integers(0, 140_000), length=st.integers(0, 140_000))
    def read_range(self, n: int, offset: int, length: int) -> None:
        """A piece of the committed version (across a layered version's runs and data file)."""
        m = self.model[n]
        if m.committed is None:
            return
        assert bytes(self.engine.read(cid(n), offset, length).data) == m.committed[offset : offset + length]

    @rule(n=chunks, data=payloads)
    def append(self, n: int, data: bytes) -> None:
        """At the committed end: where an update may go in place."""
        self.update(n, len(self.model[n].committed or b""), data)

    @rule(n=chunks, length=st.integers(0, 140_000))
    def truncate(self, n: int, length: int) -> None:
        m, size = self.model[n], CHUNK_SIZES[n]
        try:
            self.engine.truncate(cid(n), length, chunk_size=size, chain_ver=1)
        except FS3Error as exc:
            expected = (
                StatusCode.STORAGE_CHUNK_TOO_LARGE
                if length > size
                else StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
            )
            assert exc.code is expected and (length > size or self._expect_version_error(m))
            return
        base = m.committed or b""
        self._set_pending(n, base[:length] + bytes(max(0, length - len(base))))

    @rule(n=chunks)
    def remove(self, n: int) -> None:
        m = self.model[n]
        try:
            meta = self.engine.remove(cid(n), chain_ver=1)
        except FS3Error as exc:
            assert self._expect_version_error(m) and exc.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
            return
        assert (meta is None) == (not m.exists)
        if meta is not None:
            self._set_pending(n, None)

    @rule(n=chunks, data=payloads, ahead=st.integers(1, 3), commit=st.booleans())
    def replace(self, n: int, data: bytes, ahead: int, commit: bool) -> None:
        m, size = self.model[n], CHUNK_SIZES[n]
        version = m.committed_ver + ahead
        try:
            self.engine.replace(cid(n), data, chunk_size=size, chain_ver=2, version=version, commit=commit)
        except FS3Error as exc:
            assert len(data) > size and exc.code is StatusCode.STORAGE_CHUNK_TOO_LARGE
            return
        if commit:
            m.committed, m.committed_ver, m.pending, m.pending_ver = data, version, None, 0
        else:
            m.pending, m.pending_ver = data, version

    @precondition(lambda self: any(m.pending_ver for m in self.model))
    @rule(n=chunks)
    def commit(self, n: int) -> None:
        m = self.model[n]
        if not m.pending_ver:
            return
        result = self.engine.commit(cid(n), m.pending_ver)
        if m.pending is None:
            assert result is None
            self.model[n] = Model()
            assert self.engine.commit(cid(n), m.pending_ver) is None  # retried
            return
        assert result is not None and result.committed_ver == m.pending_ver
        m.committed, m.committed_ver, m.pending, m.pending_ver = m.pending, m.pending_ver, None, 0
        # a retried commit changes nothing
        assert self.engine.commit(cid(n), m.committed_ver).committed_ver == m.committed_ver

    @rule(n=chunks)
    def abort(self, n: int) -> None:
        m = self.model[n]
        self.engine.abort(cid(n))
        if m.committed is None:
            self.model[n] = Model()
        else:
            m.pending, m.pending_ver = None, 0

    @rule()
    def reopen(self) -> None:
        self.engine.close()
        self.engine = ChunkEngine(self.dir, EngineOptions(sync=False))
        assert self.engine.recovery.orphans_removed == 0 and self.engine.recovery.files_trimmed == 0

    @invariant()
    def matches_model(self) -> None:
        for n, m in enumerate(self.model):
            meta = self.engine.get_meta(cid(n))
            if not m.exists:
                assert meta is None
                continue
            assert (meta.committed_ver, meta.pending_ver) == (m.committed_ver, m.pending_ver)
            if m.committed is not None:
                assert self.engine.read(cid(n)).data == m.committed
            if m.pending is not None:
                assert self.engine.read(cid(n), version=m.pending_ver).data == m.pending
            elif m.pending_ver:
                assert meta.pending.removal

    @invariant()
    def space_matches_the_files(self) -> None:
        files = [p for p in (self.dir / "chunks").rglob("*") if p.is_file()]
        info = self.engine.space_info()
        assert info.used == sum(p.stat().st_size for p in files)
        assert info.chunk_count == sum(m.exists for m in self.model)
        referenced = sum(len(meta.file_lengths()) for meta in self.engine.dump_metadata())
        assert len(files) == referenced


TestChunkEngineModel = ChunkEngineMachine.TestCase
TestChunkEngineModel.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestChunkEngineModel = pytest.mark.timeout(120)(TestChunkEngineModel)
