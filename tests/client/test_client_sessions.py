"""A client keeps a mgmtd client session, so meta does not expire its open files (it expires only
those of clients without one, after its ``session_timeout_s``)."""

from __future__ import annotations

import asyncio
import os

import pytest
from fs_cluster import FsCluster

from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2

pytestmark = pytest.mark.timeout(120)


async def test_files_held_open_past_the_meta_session_timeout_stay_open(tmp_path) -> None:
    # meta expires sessions untouched for 1 s whose client has no mgmtd session (every 0.5 s);
    # mgmtd's list counts as complete once it has been primary for its 5 s session timeout
    async with FsCluster(tmp_path, meta_extra={"session_timeout_s": 1.0}) as c:
        fs = await c.connect()
        sessions = await fs.mgmtd.list_client_sessions()
        assert [(s.client_id, s.type) for s in sessions] == [(str(fs.meta.client_id), common_pb2.NODE_CLIENT)]
        data = os.urandom(300_000)
        f = await fs.open("/held-open", "w")
        await f.write(data)
        await f.flush()  # on storage; the length is reported at close
        reader = await fs.open("/held-open")
        await asyncio.sleep(8)  # no fsync, no meta call on these files
        await f.write(b"tail")
        await f.close()  # the write session is still there
        assert (await fs.stat("/held-open")).st_size == len(data) + 4
        assert await reader.read() == data + b"tail"
        await reader.close()

        # a client that vanishes without closing: its session goes
        gone = await c.connect()
        g = await gone.open("/abandoned", "w")
        await g.write(b"x" * 1000)
        await gone._session.stop()  # stops extending its mgmtd session, as a dead client would
        await asyncio.sleep(8)  # past mgmtd's session timeout and meta's
        with pytest.raises(FS3Error) as e:
            await gone.meta.sync(g.handle.inode_id, g.handle.session_id, 1000, wrote=True)
        assert e.value.code == StatusCode.META_BAD_HANDLE
