"""Fixtures of the meta suite: a MetaStore over each engine, and a small tree with known owners."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from meta_tree import Tree, build_tree

from fs3.kv import open_database
from fs3.meta.layout import ChainAllocator, ChainTable, static_tables
from fs3.meta.store import MetaStore

TABLE = ChainTable(1, 1, tuple(range(101, 109)))


@pytest.fixture(params=["mem", "lmdb"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetaStore]:
    if request.param == "mem":
        db = await open_database("mem")
    else:
        db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=1 << 28)
    s = MetaStore(db, layouts=ChainAllocator(static_tables([TABLE]), default_stripe=2))
    await s.start(background=False)
    try:
        yield s
    finally:
        await s.stop()
        await db.close()


@pytest.fixture
async def tree(store: MetaStore) -> Tree:
    return await build_tree(store)
