"""Fixtures of the operations tests: daemons and local clusters cleaned up by PID even on failure."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_helpers import Spawner, cleanup_local, fs3


@pytest.fixture
def spawner(tmp_path: Path) -> Iterator[Spawner]:
    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def local_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for ``fs3 local``; whatever runs there is stopped at teardown."""
    d = tmp_path / "cluster"
    try:
        yield d
    finally:
        cleanup_local(d)


@pytest.fixture(scope="session")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running ``fs3 local`` cluster (2 storage nodes, 2 replicas, no mount) shared by the tests
    that only read from it or add their own files; it already holds /m.bin (100 000 bytes)."""
    d = tmp_path_factory.mktemp("small") / "cluster"
    try:
        up = fs3("local", "up", "--dir", str(d), "--no-mount", "--storage-nodes", "2", "--replicas", "2",
                 "--targets-per-node", "1")  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        asyncio.run(_traffic(d))
        yield d
    finally:
        cleanup_local(d)


async def _traffic(d: Path) -> None:
    """A write and a read, so that per-method series exist."""
    from fs3.client import FileSystem

    async with await FileSystem.connect(d / "config" / "client.toml") as fs:
        async with await fs.open("/m.bin", "w") as f:
            await f.write(os.urandom(100_000))
        async with await fs.open("/m.bin", "r") as f:
            assert len(await f.read()) == 100_000
