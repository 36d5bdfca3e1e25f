"""The collector's grace over a real meta daemon (on uvloop, as deployed): a file unlinked while
open is collected as soon as its grace is over after its last close, not at the next periodic
round of the collector."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster import wait_until
from fs_cluster import FsCluster

from fs3.errors import FS3Error, StatusCode

pytestmark = pytest.mark.timeout(90)


async def test_a_file_unlinked_while_open_is_collected_once_its_grace_is_over(tmp_path: Path) -> None:
    # the periodic round an hour away: only the wake of the last close, and the one at the end of
    # the grace it schedules, can collect the file within the test
    async with FsCluster(
        tmp_path, chains=1, stripe=1, meta_extra={"gc_interval_s": 3600.0, "gc_grace_s": 1.0}
    ) as c:
        fs = await c.connect()
        files = [await fs.open(f"/f{i}", "w") for i in range(2)]
        for f in files:  # unlinked 0.25 s apart: their graces end 0.25 s apart
            await f.write(b"x" * 4096)
            await fs.unlink(f.path)
            await asyncio.sleep(0.25)
        for f in files:  # meta finds each unlinked and wakes the collector, within both graces
            await f.close()

        async def gone() -> bool:
            for f in files:
                try:
                    await fs.meta.stat(f.inode_id)
                except FS3Error as e:
                    if e.code != StatusCode.NOT_FOUND:
                        raise
                else:
                    return False
            return True

        await wait_until(gone, 20, "the files to be collected once their grace was over")
        for targets in c.cluster.chain_targets.values():
            for target in targets:
                for f in files:
                    assert await fs.storage.dump_chunk_meta(target, f.inode_id) == []
        assert "gc round failed" not in c.logs()
