"""A target whose file system runs low on space refuses writes with STORAGE_SPACE_KEPT (ENOSPC) and
stays online: what it holds stays readable, removes free space, and writes resume.

Each storage daemon's targets live on a tmpfs of their own; one is small. With the small one at
the head the head refuses; at the tail the head and the middle have stored the update as pending
before the tail refuses it, and drop it as the refusal comes back: nothing of a refused write
remains to be settled (and made to appear) later.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest
from cluster import Cluster, storage_on_tmpfs, wait_until

from fs3.client.storage_client import STORAGE_SERVICE, crc32c, node_address
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2, storage_pb2

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
CHUNK = MiB
INODE = 42


@pytest.fixture
def disks(tmp_path: Path, request: pytest.FixtureRequest):
    """Cluster directory whose storage-1000N directories are tmpfs mounts: 24 MiB for the node
    ``request.param`` names, 256 MiB for the others."""
    sizes = ["24m" if i == request.param else "256m" for i in range(3)]
    with storage_on_tmpfs(tmp_path / "c", sizes) as root:
        yield root, request.param


async def committed(c: Cluster, client, chain_id: int) -> dict[int, list[tuple[int, int, int]]]:
    """(chunk index, length, crc) of every committed chunk of INODE, per replica; and no replica
    holds a pending version: a refused write leaves nothing behind to be settled later."""
    out = {}
    for tid in c.chain_targets[chain_id]:
        metas = await client.dump_chunk_meta(tid, INODE)
        assert [m.key.chunk_index for m in metas if m.pending_version] == [], tid
        out[tid] = sorted((m.key.chunk_index, m.length, m.crc32c) for m in metas if m.committed_version)
    return out


@pytest.mark.parametrize("disks", [0, 2], ids=["head-full", "tail-full"], indirect=True)
async def test_a_full_target_refuses_writes_and_stays_online(disks: tuple[Path, int]) -> None:
    root, full = disks
    small = root / f"storage-{10001 + full}"
    async with Cluster(root, storage_extra={"keep_free": 0.25}) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        written: dict[int, bytes] = {}
        with pytest.raises(FS3Error) as err:
            for i in range(64):  # 64 MiB: far more than 24 MiB less a quarter
                data = os.urandom(CHUNK)
                await client.write(chain_id, INODE, i, 0, data, CHUNK)
                written[i] = data
        refused = len(written)
        e = err.value
        assert e.code == StatusCode.STORAGE_SPACE_KEPT and e.errno == errno.ENOSPC, e
        assert "keeps 25.0%" in e.message and "remove files" in e.message
        assert 8 <= refused <= 18, refused
        st = os.statvfs(small)
        assert st.f_bavail * st.f_frsize >= 5 * MiB  # refused before the disk filled

        # nothing went offline; every replica holds exactly the acknowledged chunks
        chain = (await c.routing()).chain(chain_id)
        assert [t.public_state for t in chain.targets] == [common_pb2.SERVING] * 3
        expected = sorted((i, CHUNK, crc32c(d)) for i, d in written.items())
        assert all(v == expected for v in (await committed(c, client, chain_id)).values())
        for i, data in written.items():
            assert await client.read(chain_id, INODE, i, 0, CHUNK) == data

        # an overwrite is refused too and leaves the old bytes readable
        with pytest.raises(FS3Error) as err:
            await client.write(chain_id, INODE, 0, 0, os.urandom(CHUNK), CHUNK)
        assert err.value.code == StatusCode.STORAGE_SPACE_KEPT
        assert await client.read(chain_id, INODE, 0, 0, CHUNK) == written[0]
        assert all(v == expected for v in (await committed(c, client, chain_id)).values())

        # removing chunks makes room: the refused chunk and the overwrite go through now
        await client.remove_chunks(chain_id, INODE, 0, refused // 2)
        for i in range(refused // 2):
            del written[i]
        for i in (refused, 0):
            written[i] = os.urandom(CHUNK)
            await client.write(chain_id, INODE, i, 0, written[i], CHUNK)
        for i, data in written.items():
            assert await client.read(chain_id, INODE, i, 0, CHUNK) == data
        expected = sorted((i, CHUNK, crc32c(d)) for i, d in written.items())
        assert all(v == expected for v in (await committed(c, client, chain_id)).values())
        chain = (await c.routing()).chain(chain_id)
        assert [t.public_state for t in chain.targets] == [common_pb2.SERVING] * 3

        # Finishing a pending version (a predecessor settling one) is never refused for space, as
        # a removal may wait on it; sent here as the full target's predecessor (or as the full
        # head's) would, the flag carried down the chain. Fill the disk up to its limit again first.
        for i in range(refused + 1, 64):
            try:
                await client.write(chain_id, INODE, i, 0, os.urandom(CHUNK), CHUNK)
            except FS3Error as e:
                assert e.code == StatusCode.STORAGE_SPACE_KEPT
                break
        routing = await c.routing()
        receiver = routing.chain(chain_id).targets[max(full - 1, 0)].target_id
        data = os.urandom(CHUNK)
        with pytest.raises(FS3Error) as err:
            await forward_replace(client, routing, receiver, chain_id, 999, data, settle=False)
        assert err.value.code == StatusCode.STORAGE_SPACE_KEPT
        await forward_replace(client, routing, receiver, chain_id, 999, data, settle=True)
        # (with the full target at the tail the head never saw this version: the test ends here)
        full_tid = routing.chain(chain_id).targets[full].target_id
        metas = {m.key.chunk_index: m for m in await client.dump_chunk_meta(full_tid, INODE)}
        assert metas[999].committed_version == 1 and metas[999].crc32c == crc32c(data)


async def forward_replace(
    client, routing, target_id: int, chain_id: int, index: int, data: bytes, settle: bool
):
    """A predecessor's whole-chunk replace of version 1 of chunk ``index`` to ``target_id``."""
    req = storage_pb2.UpdateReq(target_id=target_id, settle=settle)
    io = req.io
    io.key.chain_id, io.key.chain_version = chain_id, routing.chain(chain_id).version
    io.key.inode_id, io.key.chunk_index = INODE, index
    io.type, io.chunk_size, io.update_version = storage_pb2.UPDATE_REPLACE, CHUNK, 1
    io.length, io.crc32c = len(data), crc32c(data)
    address = node_address(routing, target_id, backend=True)
    return await client.rpc.call(address, STORAGE_SERVICE["Update"], req, payload=data, timeout=10)


@pytest.mark.parametrize("disks", [2], ids=["small-tail"], indirect=True)
async def test_a_syncing_target_without_room_goes_offline_and_its_chain_writes_on(
    disks: tuple[Path, int],
) -> None:
    """A target added to (or returning to) a chain on a disk too small for the chain's data: the
    resync filled the disk and failed on and on, and the target, SYNCING, refused every forwarded
    write for space, so every client write of the chain failed with ENOSPC although its SERVING
    replicas had room (only removing the target from the chain helped). It goes offline now, and
    the chain's writes go on without it."""
    root, small = disks
    async with Cluster(root, storage_extra={"keep_free": 0.25}) as c:
        assert c.admin is not None
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        (target,) = c.nodes[small].targets
        c.kill_storage(small)
        await c.wait_chains(
            lambda ch: target not in ch.serving and len(ch.serving) == 2, 30, "the chain without it"
        )
        written: dict[int, bytes] = {}
        for i in range(30):  # 30 MiB: more than its 24 MiB disk holds
            written[i] = os.urandom(CHUNK)
            await client.write(chain_id, INODE, i, 0, written[i], CHUNK)
        proc = c.start_storage(small)

        async def syncing_or_out() -> bool:
            if "no room for its chain's data while syncing" in proc.log():
                return True
            states = {t.target_id: t.public_state for t in (await c.routing()).chain(chain_id).targets}
            return states.get(target) == common_pb2.SYNCING

        await wait_until(syncing_or_out, 60, "it to sync")
        for i in range(30, 45):  # while it syncs, runs out of room, and goes offline
            written[i] = os.urandom(CHUNK)
            await asyncio.wait_for(client.write(chain_id, INODE, i, 0, written[i], CHUNK), 60)
        await wait_until(
            lambda: "no room for its chain's data while syncing" in proc.log(), 30, "it to say so"
        )
        routing = await c.routing()
        chain = routing.chain(chain_id)
        assert target not in chain.serving and len(chain.serving) == 2
        for i, data in written.items():
            assert await client.read(chain_id, INODE, i, 0, CHUNK) == data


@pytest.mark.parametrize("disks", [2], ids=["small-successor"], indirect=True)
async def test_a_successor_whose_disk_is_full_fails_the_write_with_enospc(disks: tuple[Path, int]) -> None:
    """No space kept free (keep_free 0), and a successor's disk (the middle's or the tail's, as
    the chain's order came out) fills up: the write that finds it full fails with
    STORAGE_NO_SPACE (ENOSPC) after a short retry, not after the predecessors retried it for their
    whole forward timeout (the client's own deadline ran out first: ETIMEDOUT after a minute); and
    a middle does not store a whole chunk while forwarding it once its disk is nearly full (its
    disk found full then took the target offline until a restart). The chain stays SERVING,
    acknowledged chunks read back, and once chunks are removed writes go through again."""
    root, _ = disks
    async with Cluster(root, storage_extra={"keep_free": 0}) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        written: dict[int, bytes] = {}
        with pytest.raises(FS3Error) as err:
            for i in range(64):  # 64 MiB: far more than the tail's 24 MiB
                data = os.urandom(CHUNK)
                await client.write(chain_id, INODE, i, 0, data, CHUNK)
                written[i] = data
        e = err.value
        no_room = (StatusCode.STORAGE_NO_SPACE, StatusCode.STORAGE_SPACE_KEPT)
        assert e.code in no_room and e.errno == errno.ENOSPC, e
        assert "no space" in e.message.lower() or "No space left" in e.message, e
        assert 10 <= len(written) <= 24, len(written)
        chain = (await c.routing()).chain(chain_id)
        assert [t.public_state for t in chain.targets] == [common_pb2.SERVING] * 3
        for i, data in written.items():
            assert await client.read(chain_id, INODE, i, 0, CHUNK) == data
        await client.remove_chunks(chain_id, INODE, 0, len(written) // 2)
        data = os.urandom(CHUNK)
        await client.write(chain_id, INODE, 100, 0, data, CHUNK)
        assert await client.read(chain_id, INODE, 100, 0, CHUNK) == data
        # the write that failed stays failed: a later one to its chunk does not bring it back
        # (its predecessors kept it pending, and the next update of the chunk settled it)
        failed = len(written)
        await client.write(chain_id, INODE, failed, 10, b"z", CHUNK)
        assert await client.read(chain_id, INODE, failed, 0, CHUNK) == bytes(10) + b"z"
