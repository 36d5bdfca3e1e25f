"""Fixtures of the operations tests: daemons and local clusters cleaned up by PID even on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_helpers import Spawner, cleanup_local


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
