"""Meta with real storage daemons: length from storage on close, truncate trims chunks, and the
collector removes an unlinked file's chunks only after its last session has closed."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from meta_cluster import Cluster, meta_client, start_meta, storage_on_tmpfs

from fs3.client.meta_client import ROOT_ID, MetaClient
from fs3.errors import FS3Error
from fs3.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(150)
CHUNK = 64 << 10
MiB = 1 << 20
CHUNK_1M = MiB


async def until(pred, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_length_truncate_and_gc_on_storage(tmp_path) -> None:
    async with Cluster(tmp_path, storage_nodes=2, chains=2, replication=2) as c:
        address = await start_meta(c, extra=f"default_stripe = 2\ndefault_chunk_size = {CHUNK}")
        meta = meta_client(c, address)
        storage = await c.storage_client()
        try:
            r = await meta.create(ROOT_ID, b"f", 0o644, flags=2, session=True)
            ino = r.inode
            assert sorted(ino.layout.chains) == [1, 2]

            def chain_of(i: int) -> int:
                return ino.layout.chains[i % len(ino.layout.chains)]

            data = bytes(range(256)) * (5 * CHUNK // 256) + b"tail"
            await storage.write_range(chain_of, ino.id, 0, data, CHUNK)
            # written_length 0 with wrote: meta asks storage
            closed = await meta.close_file(ino.id, r.session_id, 0, True)
            assert closed.size == len(data)
            await meta.setattr(ino.id, size=CHUNK + 10)
            lasts = [await storage.query_last_chunk(ch, ino.id) for ch in (1, 2)]
            assert (
                max(x.last_chunk_index * CHUNK + x.last_chunk_length for x in lasts if x.found) == CHUNK + 10
            )
            # unlinked while open: the chunks stay until the last close
            o = await meta.open(ino.id, 2)
            await meta.unlink(ROOT_ID, b"f")
            # A file queued after it and collected proves the collector has passed it by.
            g = (await meta.create(ROOT_ID, b"g", 0o644)).inode
            await storage.write(g.layout.chains[0], g.id, 0, 0, b"x" * 100, CHUNK)
            await meta.unlink(ROOT_ID, b"g")

            async def g_gone() -> bool:
                return not (await storage.query_last_chunk(g.layout.chains[0], g.id)).found

            await until(g_gone)
            assert g.id > ino.id  # the queue is visited in inode order
            assert (await storage.query_last_chunk(chain_of(0), ino.id)).found
            back = await storage.read_range(chain_of, ino.id, 0, 10, CHUNK)
            assert back == data[:10]
            await meta.close_file(ino.id, o.session_id)

            async def gone() -> bool:
                chunks = [(await storage.query_last_chunk(ch, ino.id)).found for ch in (1, 2)]
                return not any(chunks) and (await meta.statfs()).inodes == 1  # only the root left

            await until(gone)
            # Every target of both nodes lives on the disk under tmp_path, on this one host: statfs
            # counts that disk once, as df on it would (not once per target or per node).
            st = os.statvfs(tmp_path)
            fs = await meta.statfs()
            assert fs.capacity == st.f_blocks * st.f_frsize
            # used as df says (root's reserved blocks are not used), within other writers' changes
            assert abs(fs.used - (st.f_blocks - st.f_bfree) * st.f_frsize) < 256 << 20
            assert abs(fs.free - st.f_bfree * st.f_frsize) < 256 << 20
            assert fs.available <= st.f_bavail * st.f_frsize + (256 << 20)
        finally:
            await meta.close()


async def test_new_files_avoid_a_chain_low_on_space(tmp_path) -> None:
    """Storage reports a target low on space (under 4% free), mgmtd publishes it, and meta places
    new files on the chains with room until space is freed: writes keep succeeding."""
    # chain 1 = nodes 0 and 1, chain 2 = nodes 1 and 2; node 0's disk is a small tmpfs
    with storage_on_tmpfs(tmp_path / "c", ["64m"]) as root:
        async with Cluster(root, storage_nodes=3, chains=2, replication=2) as c:
            address = await start_meta(c)
            meta = meta_client(c, address)
            storage = await c.storage_client()
            names = (f"f{i}".encode() for i in range(10_000))
            try:

                async def chains_of_new_files(n: int) -> list[int]:
                    out = []
                    for _ in range(n):
                        ino = (await meta.create(ROOT_ID, next(names), 0o644)).inode
                        out += ino.layout.chains
                    return out

                assert sorted(set(await chains_of_new_files(4))) == [1, 2]
                filler = root / "storage-10001" / "filler"
                filler.write_bytes(b"\1" * (62 * MiB))  # 2 MiB left: 3% free

                async def low() -> bool:
                    return (await c.routing()).target(101).low_space

                await until(low)

                async def steered() -> bool:  # meta has the routing version that says so
                    return set(await chains_of_new_files(4)) == {2}

                await until(steered)
                files = []
                for _ in range(20):
                    ino = (await meta.create(ROOT_ID, next(names), 0o644)).inode
                    assert list(ino.layout.chains) == [2]
                    files.append(ino)
                for ino in files:  # more than chain 1's disk has left
                    await storage.write(2, ino.id, 0, 0, b"\2" * MiB, CHUNK_1M)
                assert not (await c.routing()).target(201).low_space
                # between 4% and 5% free it stays low (no flapping at the line) ...
                os.truncate(filler, 61 * MiB)
                await asyncio.sleep(2.5)  # two passes of the daemon's usage check
                assert await low()
                # ... and more than 5% free ends it
                filler.unlink()

                async def roomy() -> bool:
                    return set(await chains_of_new_files(4)) == {1, 2}

                await until(roomy)
                assert not (await c.routing()).target(101).low_space

                # a keep_free pushed above its default moves the line up with it: writes are
                # refused that much earlier, and meta must steer files away before that
                assert c.admin is not None
                await c.admin.set_config(common_pb2.NODE_STORAGE, "keep_free = 0.98\n")

                async def all_low() -> bool:
                    r = await c.routing()
                    return all(r.target(t).low_space for t in (101, 201))

                await until(all_low)
            finally:
                await meta.close()


async def test_a_truncate_whose_trim_fails_commits_nothing_and_leaves_nothing_to_trim_later(tmp_path) -> None:
    """A truncate trims the chunks past the new length on storage before it commits. When that
    trim fails (storage down) and meta dies, nothing was committed: the retry of the request
    trims and commits; a writer whose session predates the truncate writes and fsyncs after it,
    and no trim made later cuts those bytes (one owed since the truncate did, and the file's
    next open made it); a file cut and grown again reads zeros past the cut."""
    async with Cluster(tmp_path, storage_nodes=2, chains=1, replication=2) as c:
        extra = f"default_stripe = 1\ndefault_chunk_size = {CHUNK}"
        address = await start_meta(c, extra=extra)
        meta = meta_client(c, address)
        impatient = MetaClient([address], c.secret, timeout_s=2, rpc_timeout_s=1)
        storage = await c.storage_client()
        data = os.urandom(3 * CHUNK)
        ids: dict[bytes, int] = {}

        async def on_storage(name: bytes) -> int:
            last = await storage.query_last_chunk(1, ids[name])
            return last.last_chunk_index * CHUNK + last.last_chunk_length if last.found else 0

        try:
            for name in (b"retried", b"written", b"regrown"):
                r = await meta.create(ROOT_ID, name, 0o644, flags=os.O_WRONLY, session=True)
                ids[name] = r.inode.id
                await storage.write_range(lambda _i: 1, r.inode.id, 0, data, CHUNK)
                assert (await meta.close_file(r.inode.id, r.session_id, len(data), True)).size == len(data)
            writer = await meta.open(ids[b"written"], os.O_WRONLY)  # open across the truncate
            for i in range(2):
                c.kill_storage(i)
            retried = meta_pb2.OpenReq(inode_id=ids[b"retried"], flags=os.O_WRONLY | os.O_TRUNC)
            retried.hdr.request_id = 4242
            with pytest.raises(FS3Error):
                await impatient.call("Open", retried)
            with pytest.raises(FS3Error):
                await impatient.open(ids[b"written"], os.O_WRONLY | os.O_TRUNC)
            with pytest.raises(FS3Error):
                await impatient.setattr(ids[b"regrown"], size=10)
            proc = next(p for p in c.procs if p.name == "meta-100" and p.alive())
            assert proc.popen is not None
            os.kill(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)
            for i in range(2):
                await c.restart_storage(i)
            await c.wait_all_serving()
            storage = await c.storage_client()  # one that knows the daemons' new ports
            address = await start_meta(c, extra=extra)
            meta.addresses = impatient.addresses = [address]
            impatient.timeout_s = 30
            # nothing was committed, nor trimmed
            assert [(await meta.stat(ids[n])).size for n in ids] == [len(data)] * 3
            assert [await on_storage(n) for n in ids] == [len(data)] * 3

            rsp = await impatient.call("Open", retried)  # the retry, after the client's timeout
            assert rsp.inode.size == 0 and await on_storage(b"retried") == 0
            await meta.close_file(ids[b"retried"], rsp.session_id)

            new = os.urandom(CHUNK)  # the older session writes over the start, and fsyncs
            await storage.write_range(lambda _i: 1, ids[b"written"], 0, new, CHUNK)
            assert (await meta.sync(ids[b"written"], writer.session_id, CHUNK, True)).size == len(data)
            await meta.close_file(ids[b"written"], writer.session_id)
            o = await meta.open(ids[b"written"], os.O_RDONLY)  # the next opener trims nothing
            await meta.close_file(ids[b"written"], o.session_id)
            back = await storage.read_range(lambda _i: 1, ids[b"written"], 0, len(data), CHUNK)
            assert back == new + data[CHUNK:]

            assert (await meta.setattr(ids[b"regrown"], size=10)).size == 10
            assert (await meta.setattr(ids[b"regrown"], size=2 * CHUNK)).size == 2 * CHUNK
            back = await storage.read_range(lambda _i: 1, ids[b"regrown"], 0, 2 * CHUNK, CHUNK)
            assert back == data[:10] + bytes(2 * CHUNK - 10)
        finally:
            await impatient.close()
            await meta.close()
