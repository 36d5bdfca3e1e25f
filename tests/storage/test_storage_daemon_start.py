"""A storage daemon started with targets that mgmtd does not place on its node refuses to start,
and leaves its disks as it found them: no directory is made for a target it will not serve."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cluster import Cluster, wait_until
from prometheus_client import CollectorRegistry

from fs3.config import StorageConfig, load_config
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2
from fs3.storage.daemon import StorageDaemon, owner_mark

pytestmark = pytest.mark.timeout(120)

OTHER_NODE = 10009  # registered with mgmtd, with no targets of its own


def _tree(root) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _contents(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown-target", "target 999 is not known"),
        ("another-nodes-target", "target 101 belongs to node 10001"),
    ],
)
async def test_a_refused_start_creates_no_target_directory(tmp_path, case: str, expected: str) -> None:
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1) as c:
        assert c.admin is not None
        await c.admin.register_node(OTHER_NODE, common_pb2.NODE_STORAGE)
        node = c.nodes[0]
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        disk = tmp_path / "disk"  # the new targets' disk: mounted, empty
        disk.mkdir()
        if case == "unknown-target":
            # its own target (on a new disk) and one mgmtd never heard of
            node_id, ids = node.node_id, [*node.targets, 999]
        else:
            node_id, ids = OTHER_NODE, list(node.targets)
        cfg = dataclasses.replace(
            cfg,
            node_id=node_id,
            listen_port=0,
            metrics_port=0,
            target_ids=ids,
            target_paths=[str(disk / f"target-{t}") for t in ids],
        )
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        with pytest.raises(FS3Error) as info:
            await daemon.start()  # a failed start stops what it started
        assert expected in str(info.value)
        assert _tree(disk) == []


def test_a_target_directory_with_an_empty_id_file_is_refused_with_what_to_do(tmp_path) -> None:
    """The id file was written without a sync, so a crash soon after a target's first start could
    leave it empty: every start after said "belongs to target , not 101". It is synced now (file,
    then the directory), and an empty one says what it is."""
    from fs3.storage.daemon import _claim_target_dir

    target = tmp_path / "t101"
    _claim_target_dir(target, 101)
    assert (target / "target_id").read_text() == "101\n"
    _claim_target_dir(target, 101)  # its own: accepted
    (target / "target_id").write_text("")
    with pytest.raises(FS3Error) as e:
        _claim_target_dir(target, 101)
    assert "target id file" in e.value.message and "is empty" in e.value.message
    assert "write 101 into it" in e.value.message


async def test_a_target_directory_of_another_cluster_is_refused_and_kept(tmp_path) -> None:
    """Target ids repeat across clusters (every fs3 local cluster numbers its targets alike): a
    storage daemon of another cluster whose config pointed at this cluster's target directory took
    it, and its resync emptied it (found by use). The directory records which cluster claimed it
    (a fingerprint of the cluster secret): another cluster's daemon refuses it at start and
    leaves every file in it; a directory of an older version, with no record, is claimed."""
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1) as c:
        node = c.nodes[0]
        c.kill_storage(0)
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        target = Path(cfg.target_paths[0])
        assert (target / "cluster_owner").read_text().strip() == owner_mark(c.secret)
        before = _contents(target)
        other = StorageDaemon(cfg, secret=b"another-clusters-secret", registry=CollectorRegistry())
        with pytest.raises(FS3Error) as info:
            await other.start()
        assert info.value.code == StatusCode.CONFIG_INVALID
        assert "belongs to another cluster" in info.value.message, info.value.message
        assert _contents(target) == before
        # an older version's directory (no owner recorded) is claimed by the cluster that starts it
        (target / "cluster_owner").unlink()
        await c.restart_storage(0)
        await wait_until(lambda: (target / "cluster_owner").exists(), 30, "the directory to be claimed")
        assert (target / "cluster_owner").read_text().strip() == owner_mark(c.secret)


async def test_a_target_whose_disk_fails_at_start_is_left_out_and_the_others_serve(tmp_path) -> None:
    """One dead disk at a restart (its target cannot be opened: EROFS, EIO) stopped the whole
    daemon, so the node's healthy targets went offline too. That target is left out (mgmtd takes
    an unreported target for offline) and the others serve; with no target left, the start fails."""
    async with Cluster(tmp_path / "c", storage_nodes=1, chains=2, replication=1) as c:
        node = c.nodes[0]
        good, bad = node.targets
        c.kill_storage(0)
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        dead = Path(cfg.target_paths[cfg.target_ids.index(bad)])
        lock = dead / "target.lock"
        lock.unlink()
        lock.mkdir()  # what opening it meets stands for a disk that fails (EISDIR, as EROFS would)
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        try:
            assert daemon.targets is not None
            assert list(daemon.targets.targets) == [good]
            assert c.admin is not None

            async def states() -> dict[int, int]:
                return {t.target_id: t.public_state for t in await c.admin.list_targets()}

            async def settled() -> bool:
                s = await states()
                return s[good] == common_pb2.SERVING and s[bad] != common_pb2.SERVING

            await wait_until(settled, 30, "the good target to serve and the broken one not to")
        finally:
            await daemon.stop()
        # its directory unreadable too (EIO, standing for it: its id file cannot be read): the
        # check made before mgmtd is asked leaves it to the start, which leaves it out
        lock.rmdir()
        (dead / "target_id").unlink()
        (dead / "target_id").mkdir()
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        try:
            assert daemon.targets is not None and list(daemon.targets.targets) == [good]
        finally:
            await daemon.stop()
        # no target left to serve: the start fails, with the disk's error
        cfg = dataclasses.replace(cfg, target_ids=[bad], target_paths=[str(dead)])
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        with pytest.raises(FS3Error) as e:
            await daemon.start()
        assert "Is a directory" in str(e.value)


async def test_a_target_removed_from_the_cluster_is_left_out_at_the_next_start(tmp_path) -> None:
    """update-chain remove and remove-target, the documented way to take a target out for good:
    the node's config still names it, and the node's next start refused with "not known to mgmtd
    (create it first ...)", taking every target of the node offline. A target whose directory
    records that it served here is left out with a warning now; the others serve."""
    from fs3.proto import mgmtd_pb2

    async with Cluster(tmp_path / "c", storage_nodes=2, chains=2, replication=2) as c:
        assert c.admin is not None
        client = await c.storage_client()
        node = c.nodes[0]
        kept, gone = sorted(node.targets)  # 101 (chain 1), 102 (chain 2)
        # (one copy left: forced, as an operator replacing a node knowingly does)
        await c.admin.update_chain(2, gone, mgmtd_pb2.CHAIN_UPDATE_REMOVE, force=True)
        assert c.admin is not None
        admin = c.admin

        async def removed() -> bool:  # once the chain has drained it
            try:
                await admin.remove_target(gone)
            except FS3Error as e:
                if "remove it from the chain first" not in e.message:
                    raise
                return False
            return True

        await wait_until(removed, 30, "the target to leave its chain and be removed")
        c.kill_storage(0)
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        assert gone in cfg.target_ids
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        try:
            assert daemon.targets is not None and list(daemon.targets.targets) == [kept]

            async def kept_serves() -> bool:
                states = {t.target_id: t.public_state for t in await admin.list_targets()}
                return states.get(kept) == common_pb2.SERVING

            await wait_until(kept_serves, 60, "the kept target to serve")
            await client.write(1, 1, 0, 0, b"served", 1 << 20)
            assert await client.read(1, 1, 0, 0, 6) == b"served"
        finally:
            await daemon.stop()
        # a node whose every target was removed has nothing to serve: said so
        cfg = dataclasses.replace(
            cfg, target_ids=[gone], target_paths=[cfg.target_paths[cfg.target_ids.index(gone)]]
        )
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        with pytest.raises(FS3Error) as e:
            await daemon.start()
        assert "was removed from the cluster" in e.value.message


async def test_a_mgmtd_that_knows_no_targets_is_not_taken_to_have_removed_them(tmp_path) -> None:
    """A storage node asking a mgmtd with an empty store (a second mgmtd host with an lmdb store of
    its own, which serves as a primary of its own) found all its targets unknown, took them for
    removed from the cluster and exited, telling the operator to delete their directories: good
    replicas. It refuses to start now, saying that mgmtd is not its cluster's."""
    async with Cluster(tmp_path / "c", storage_nodes=1, chains=1, replication=1) as c:
        node = c.nodes[0]
        c.kill_storage(0)
        assert c.mgmtd_proc is not None and c.mgmtd_proc.popen is not None
        c.mgmtd_proc.popen.kill()
        c.mgmtd_proc.popen.wait()
        (c.tmp / "kv").rename(c.tmp / "kv.old")  # the same address, an empty store
        await c.restart_mgmtd()
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        with pytest.raises(FS3Error) as e:
            await daemon.start()
        assert "mgmtd knows no targets at all" in e.value.message, e.value.message
        assert all(p.is_dir() for p in node.targets.values())


async def test_a_target_created_for_a_running_node_is_named_as_not_served_yet(tmp_path) -> None:
    """A target created (create-targets) for a node whose daemon is running is not taken up until
    that daemon restarts; asked for it meanwhile (fs3 admin checksum), the daemon answered "target
    T is not on node N" while mgmtd listed it on node N. It says that it does not serve it, and
    why."""
    from fs3.proto import mgmtd_pb2

    async with Cluster(tmp_path / "c", storage_nodes=1, chains=1, replication=1) as c:
        assert c.admin is not None
        client = await c.storage_client()
        await c.admin.create_targets([mgmtd_pb2.TargetSpec(target_id=999, node_id=10001, disk_index=5)])

        async def listed() -> bool:
            await client.routing.refresh()
            return 999 in client.routing.routing.targets

        await wait_until(listed, 30, "the new target in routing")
        with pytest.raises(FS3Error) as e:
            await client.dump_chunk_meta(999)
        assert "node 10001 does not serve target 999" in e.value.message, e.value.message
        assert "restart it after create-targets" in e.value.message
