"""The admin operations of the primary: cluster init, targets, chains, chain tables, users, configs.

Each operation validates its input against the current records, refuses with a clear
:class:`~fs3.errors.FS3Error` when it would break an invariant (a target in two chains, a chain
naming an unknown target, a table naming an unknown chain, ...), and then writes through
:meth:`Cluster.write`, i.e. in one fenced transaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import tomllib

from fs3.config import SERVICE_CONFIGS, load_config
from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import MAX_VALUE_SIZE, Transaction
from fs3.mgmtd import chain_state, schema, users
from fs3.mgmtd.chain_state import ChainTarget, PublicState
from fs3.mgmtd.cluster import (
    Apply,
    Cluster,
    TargetRuntime,
    chain_targets,
    draining_chain,
    make_chain,
    serialized,
    serving_staying,
)
from fs3.proto import common_pb2, mgmtd_pb2

log = logging.getLogger(__name__)

MAX_CHAIN_LENGTH = 32
MAX_TABLE_CHAINS = 100_000
MAX_CONFIG_BYTES = 64 * 1024
MAX_CONFIG_DESCRIPTION_BYTES = 4096

_CONFIG_SERVICE = {
    common_pb2.NODE_MGMTD: "mgmtd",
    common_pb2.NODE_META: "meta",
    common_pb2.NODE_STORAGE: "storage",
    common_pb2.NODE_CLIENT: "client",
}


class Admin:
    """Admin operations over one :class:`Cluster` (the primary's)."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    def _require_init(self) -> None:
        if not self.c.rec.initialized:
            raise FS3Error(
                StatusCode.MGMTD_NOT_INITIALIZED, "the cluster is not initialized (run init first)"
            )

    # ---- cluster -------------------------------------------------------------------------------

    @serialized
    async def init_cluster(self, req: mgmtd_pb2.InitClusterRequest) -> mgmtd_pb2.InitClusterReply:
        name = req.admin_name or "root"
        users.check_user_fields(name, [])
        now = self.c.wall()
        out: dict[str, str] = {}
        record = mgmtd_pb2.ClusterRecord(cluster_id=req.cluster_id, created_at=now).SerializeToString()

        def apply() -> None:
            self.c.rec.initialized = True

        async def fn(tr: Transaction) -> Apply:
            if (found := await tr.get(schema.CLUSTER_KEY)) is not None:
                # An attempt of this call that committed, its outcome unknown (FoundationDB's
                # commit_unknown_result is retried as a conflict): done, with the token it made.
                if found == record and "token" in out:
                    return apply
                raise FS3Error(StatusCode.ALREADY_EXISTS, "the cluster is already initialized")
            tr.set(schema.CLUSTER_KEY, record)
            stored = mgmtd_pb2.StoredUser(
                user=mgmtd_pb2.User(uid=req.admin_uid, name=name, gid=req.admin_gid, admin=True, root=True)
            )
            out["token"] = users.add_token(stored, now)
            users.save_user(tr, stored)
            return apply

        await self.c.write(fn, routing=False)
        log.info("cluster initialized cluster_id=%s admin_uid=%d", req.cluster_id, req.admin_uid)
        return mgmtd_pb2.InitClusterReply(admin_token=out["token"], admin_uid=req.admin_uid)

    # ---- targets -------------------------------------------------------------------------------

    @serialized
    async def create_targets(self, specs: list[mgmtd_pb2.TargetSpec]) -> None:
        self._require_init()
        if not specs:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "no targets given")
        new: list[mgmtd_pb2.TargetInfo] = []
        seen: set[int] = set()
        for s in specs:
            if s.target_id == 0:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, "target id 0 is not valid")
            if s.target_id in seen:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"target {s.target_id} given twice")
            seen.add(s.target_id)
            node = self.c.rec.nodes.get(s.node_id)
            if node is None:
                raise FS3Error(
                    StatusCode.MGMTD_UNKNOWN_NODE, f"target {s.target_id}: node {s.node_id} is not registered"
                )
            if node.type != common_pb2.NODE_STORAGE:
                raise FS3Error(
                    StatusCode.INVALID_ARGUMENT,
                    f"target {s.target_id}: node {s.node_id} is not a storage node",
                )
            t = mgmtd_pb2.TargetInfo(target_id=s.target_id, node_id=s.node_id, disk_index=s.disk_index)
            old = self.c.rec.targets.get(s.target_id)
            if old is not None:
                if old == t:
                    continue  # creating the same target again is a no-op
                raise FS3Error(
                    StatusCode.ALREADY_EXISTS,
                    f"target {s.target_id} exists on node {old.node_id} disk {old.disk_index}",
                )
            new.append(t)
        if not new:
            return

        async def fn(tr: Transaction) -> Apply:
            for t in new:
                tr.set(schema.target_key(t.target_id), schema.stored_target(t))

            def apply() -> None:
                for t in new:
                    self.c.rec.targets[t.target_id] = t
                    self.c.target_rt.setdefault(t.target_id, TargetRuntime())
                self.c.reindex()

            return apply

        await self.c.write(fn)
        log.info("targets created ids=%s", [t.target_id for t in new])

    def _target(self, target_id: int) -> mgmtd_pb2.TargetInfo:
        t = self.c.rec.targets.get(target_id)
        if t is None:
            raise FS3Error(StatusCode.MGMTD_UNKNOWN_TARGET, f"target {target_id} does not exist")
        return t

    @serialized
    async def remove_target(self, target_id: int) -> None:
        self._require_init()
        self._target(target_id)
        chain_id = self.c.target_chain.get(target_id)
        if chain_id:
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION,
                f"target {target_id} is in chain {chain_id}; remove it from the chain first",
            )

        async def fn(tr: Transaction) -> Apply:
            tr.clear(schema.target_key(target_id))

            def apply() -> None:
                self.c.rec.targets.pop(target_id, None)
                self.c.target_rt.pop(target_id, None)
                self.c.reindex()

            return apply

        await self.c.write(fn)
        log.info("target removed target_id=%d", target_id)

    # ---- chains --------------------------------------------------------------------------------

    def _chain(self, chain_id: int) -> mgmtd_pb2.ChainInfo:
        c = self.c.rec.chains.get(chain_id)
        if c is None:
            raise FS3Error(StatusCode.MGMTD_UNKNOWN_CHAIN, f"chain {chain_id} does not exist")
        return c

    @serialized
    async def upload_chains(self, specs: list[mgmtd_pb2.ChainSpec], set_preferred: bool) -> None:
        self._require_init()
        if not specs:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "no chains given")
        owner = dict(self.c.target_chain)  # target -> chain, growing as the upload is checked
        seen_chains: set[int] = set()
        new: list[mgmtd_pb2.ChainInfo] = []
        for s in specs:
            if s.chain_id == 0:
                raise FS3Error(StatusCode.MGMTD_INVALID_CHAIN, "chain id 0 is not valid")
            if s.chain_id in seen_chains:
                raise FS3Error(StatusCode.MGMTD_INVALID_CHAIN, f"chain {s.chain_id} given twice")
            seen_chains.add(s.chain_id)
            try:
                chain_state.check_chain(list(s.target_ids))
            except FS3Error as e:
                raise FS3Error(e.code, f"chain {s.chain_id}: {e.message}") from None
            if len(s.target_ids) > MAX_CHAIN_LENGTH:
                raise FS3Error(
                    StatusCode.MGMTD_INVALID_CHAIN,
                    f"chain {s.chain_id}: more than {MAX_CHAIN_LENGTH} targets",
                )
            old = self.c.rec.chains.get(s.chain_id)
            if old is not None:
                if sorted(t.target_id for t in old.targets) != sorted(s.target_ids):
                    raise FS3Error(
                        StatusCode.MGMTD_INVALID_CHAIN,
                        f"chain {s.chain_id} exists with targets {[t.target_id for t in old.targets]}; "
                        "change it with UpdateChain",
                    )
                if set_preferred and list(old.preferred_order) != list(s.target_ids):
                    c = mgmtd_pb2.ChainInfo()
                    c.CopyFrom(old)
                    del c.preferred_order[:]
                    c.preferred_order.extend(s.target_ids)
                    new.append(c)
                continue
            for tid in s.target_ids:
                if tid not in self.c.rec.targets:
                    raise FS3Error(
                        StatusCode.MGMTD_UNKNOWN_TARGET, f"chain {s.chain_id}: target {tid} does not exist"
                    )
                if tid in owner:
                    raise FS3Error(
                        StatusCode.MGMTD_INVALID_CHAIN,
                        f"chain {s.chain_id}: target {tid} is already in chain {owner[tid]}",
                    )
                owner[tid] = s.chain_id
            self._refuse_shared_node(s.chain_id, list(s.target_ids))
            # fresh targets hold nothing yet, so each is trivially up to date
            new.append(
                make_chain(
                    s.chain_id,
                    1,
                    [ChainTarget(tid, PublicState.SERVING) for tid in s.target_ids],
                    s.target_ids if set_preferred else (),
                )
            )
        if new:
            await self._put_chains(new)
            log.info("chains uploaded ids=%s", [c.chain_id for c in new])

    async def _put_chains(self, chains: list[mgmtd_pb2.ChainInfo]) -> None:
        async def fn(tr: Transaction) -> Apply:
            for c in chains:
                tr.set(schema.chain_key(c.chain_id), c.SerializeToString())

            def apply() -> None:
                for c in chains:
                    self.c.rec.chains[c.chain_id] = c
                self.c.reindex()
                self.c.changed.set()

            return apply

        await self.c.write(fn)

    async def _change_chain(self, chain_id: int, new_targets: list[ChainTarget]) -> mgmtd_pb2.ChainInfo:
        old = self._chain(chain_id)
        if new_targets == chain_targets(old):
            return old
        c = make_chain(chain_id, old.version + 1, new_targets, old.preferred_order, old.draining)
        await self._put_chains([c])
        log.info("chain changed by admin chain_id=%d version=%d", chain_id, c.version)
        return c

    async def _take_out(
        self, chain_id: int, new_targets: list[ChainTarget], *, remove: bool = False, force: bool = False
    ) -> mgmtd_pb2.ChainInfo:
        """Make ``new_targets`` (an admin operation's chain) the chain; but where it takes SERVING
        targets out of the data path, and their nodes may still be alive, only mark them draining
        (see mgmtd_pb2.DrainingTarget): the chain updater makes the change once their daemons act
        on that (:meth:`Cluster._take_out_drained`). ``remove``: the operation removes them (else
        they go OFFLINE; ``force``: even as the chain's last server). A chain where nothing else
        would serve is changed at once (a forced offline of its last server: nothing else serves
        reads, and writes stop anyway)."""
        old = self._chain(chain_id)
        before = chain_targets(old)
        still = {t.target_id for t in new_targets if t.state == PublicState.SERVING}
        leaving = [t.target_id for t in before if t.state == PublicState.SERVING and t.target_id not in still]
        if (
            not leaving
            or not still
            or not any(self.c.may_serve(self._target(tid).node_id) for tid in leaving)
        ):
            return await self._change_chain(chain_id, new_targets)
        if set(leaving) <= {d.target_id for d in old.draining}:
            return old  # asked again: already under way
        c = draining_chain(old, leaving, remove=remove, force=force)
        now = self.c._mono()
        for d in c.draining:
            self.c.draining_since.setdefault((chain_id, d.target_id), now)
        await self._put_chains([c])
        log.info("chain targets draining chain_id=%d version=%d targets=%s", chain_id, c.version, leaving)
        return c

    def _refuse_shared_node(self, chain_id: int, target_ids: list[int]) -> None:
        """Refuse a chain with two targets on one node: a storage daemon serves one target per
        chain (requests name the chain), so the second would never be written, and one node's
        failure would take every copy on it."""
        on: dict[int, int] = {}  # node -> the chain's target there
        for tid in target_ids:
            node = self.c.rec.targets[tid].node_id
            if node in on:
                raise FS3Error(
                    StatusCode.MGMTD_INVALID_CHAIN,
                    f"chain {chain_id}: targets {on[node]} and {tid} are both on node {node}; the "
                    "targets of a chain must be on different nodes (to replace a target by another "
                    "on its node, remove the old one from the chain first)",
                )
            on[node] = tid

    @serialized
    async def update_chain(
        self, chain_id: int, target_id: int, mode: int, force: bool = True
    ) -> mgmtd_pb2.ChainInfo:
        """Add a target to a chain or remove one. Without ``force`` a removal that leaves the chain
        fewer than two SERVING targets (one copy of its data, or none to read) is refused: here,
        one admin request at a time, where the CLI's own check of a listing let two removals at
        once both pass (a chain left one copy), and another OFFLINE target counted as a copy."""
        self._require_init()
        chain = self._chain(chain_id)
        self._target(target_id)
        if mode == mgmtd_pb2.CHAIN_UPDATE_ADD:
            owner = self.c.target_chain.get(target_id)
            if owner:
                raise FS3Error(
                    StatusCode.MGMTD_INVALID_CHAIN, f"target {target_id} is already in chain {owner}"
                )
            if len(chain.targets) >= MAX_CHAIN_LENGTH:
                raise FS3Error(
                    StatusCode.MGMTD_INVALID_CHAIN, f"chain {chain_id} has {MAX_CHAIN_LENGTH} targets"
                )
            self._refuse_shared_node(chain_id, [*(t.target_id for t in chain.targets), target_id])
            new = chain_state.add_target(chain_targets(chain), target_id)
        elif mode == mgmtd_pb2.CHAIN_UPDATE_REMOVE:
            self._refuse_last_once_drained(chain, target_id, "removed")
            if not force:
                _refuse_losing_copies(chain, target_id)
            # (make_chain keeps the preferred order to the chain's members)
            new = chain_state.remove_target(chain_targets(chain), target_id)
            return await self._take_out(chain_id, new, remove=True)
        else:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown chain update mode {mode}")
        return await self._change_chain(chain_id, new)

    @serialized
    async def offline_target(self, target_id: int, force: bool) -> mgmtd_pb2.ChainInfo:
        self._require_init()
        self._target(target_id)
        chain_id = self.c.target_chain.get(target_id)
        if not chain_id:
            raise FS3Error(StatusCode.FAILED_PRECONDITION, f"target {target_id} is in no chain")
        chain = self._chain(chain_id)
        if not force:
            self._refuse_last_once_drained(chain, target_id, "offlined")
        elif not self._last_once_drained(chain, target_id):
            # Not needed now, so not kept for the end of the drain: should the target become the
            # last server meanwhile (the others failing), it alone holds what was written since,
            # and the drain is given up (see Cluster._take_out_drained) rather than forced.
            force = False
        return await self._take_out(
            chain_id, chain_state.offline_target(chain_targets(chain), target_id, force=force), force=force
        )

    @staticmethod
    def _last_once_drained(chain: mgmtd_pb2.ChainInfo, target_id: int) -> bool:
        """Whether the target will be its chain's last server once the targets draining there
        leave (they are on their way out: they count for none). False for a draining target
        itself (asked again: under way)."""
        draining = {d.target_id for d in chain.draining}
        if target_id in draining:
            return False
        rest = [t for t in chain_targets(chain) if t.target_id not in draining]
        return any(t.target_id == target_id for t in rest) and chain_state.is_last_server(rest, target_id)

    def _refuse_last_once_drained(self, chain: mgmtd_pb2.ChainInfo, target_id: int, what: str) -> None:
        """Refuse to take out a target that is not the chain's last server only because targets
        still draining count as serving: once they leave, it is (two drains at once would leave
        the chain with nothing to read from, and the second be given up at the end)."""
        if chain.draining and self._last_once_drained(chain, target_id):
            leaving = ", ".join(str(d.target_id) for d in chain.draining)
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION,
                f"target {target_id} cannot be {what}: once the targets draining from chain "
                f"{chain.chain_id} ({leaving}) leave, it is the chain's last server, the last one known "
                "to hold all its data",
            )

    @serialized
    async def rotate_lastsrv(self, chain_id: int) -> mgmtd_pb2.ChainInfo:
        self._require_init()
        chain = self._chain(chain_id)
        return await self._change_chain(chain_id, chain_state.rotate_lastsrv(chain_targets(chain)))

    @serialized
    async def set_preferred_order(self, chain_id: int, order: list[int]) -> mgmtd_pb2.ChainInfo:
        self._require_init()
        chain = self._chain(chain_id)
        chain_state.check_preferred_order(chain_targets(chain), order)
        c = mgmtd_pb2.ChainInfo()
        c.CopyFrom(chain)
        del c.preferred_order[:]
        c.preferred_order.extend(order)
        # The preferred order is advice for rotation, not the data path: routing changes, the chain
        # version (which storage checks on every write) does not.
        await self._put_chains([c])
        return c

    @serialized
    async def rotate_as_preferred(self, chain_id: int) -> mgmtd_pb2.ChainInfo:
        self._require_init()
        chain = self._chain(chain_id)
        return await self._take_out(
            chain_id, chain_state.rotate_to_preferred(chain_targets(chain), list(chain.preferred_order))
        )

    @serialized
    async def upload_chain_table(self, req: mgmtd_pb2.UploadChainTableRequest) -> int:
        self._require_init()
        if req.table_id == 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "chain table id 0 is not valid")
        if not req.chain_ids:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"chain table {req.table_id} names no chain")
        if len(req.chain_ids) > MAX_TABLE_CHAINS:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT, f"a chain table holds at most {MAX_TABLE_CHAINS} chains"
            )
        if len(set(req.chain_ids)) != len(req.chain_ids):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"chain table {req.table_id} names a chain twice")
        # one table is one stored value: how many chains fit depends on their ids' sizes
        size = mgmtd_pb2.ChainTable(
            table_id=req.table_id, version=1 << 31, chain_ids=req.chain_ids, description=req.description
        ).ByteSize()
        if size > MAX_VALUE_SIZE:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT,
                f"chain table {req.table_id} of {len(req.chain_ids)} chains takes {size} bytes, more than "
                f"a stored value may ({MAX_VALUE_SIZE}): fewer chains, or smaller chain ids",
            )
        for cid in req.chain_ids:
            if cid not in self.c.rec.chains:
                raise FS3Error(
                    StatusCode.MGMTD_UNKNOWN_CHAIN, f"chain table {req.table_id}: chain {cid} does not exist"
                )
        versions = [v for (tid, v) in self.c.rec.tables if tid == req.table_id]
        latest = max(versions, default=0)
        if latest and list(self.c.rec.tables[(req.table_id, latest)].chain_ids) == list(req.chain_ids):
            return latest
        table = mgmtd_pb2.ChainTable(
            table_id=req.table_id, version=latest + 1, chain_ids=req.chain_ids, description=req.description
        )

        async def fn(tr: Transaction) -> Apply:
            tr.set(schema.chain_table_key(table.table_id, table.version), table.SerializeToString())

            def apply() -> None:
                self.c.rec.tables[(table.table_id, table.version)] = table

            return apply

        await self.c.write(fn)
        log.info(
            "chain table uploaded table_id=%d version=%d chains=%d",
            table.table_id,
            table.version,
            len(table.chain_ids),
        )
        return table.version

    # ---- users ---------------------------------------------------------------------------------

    @serialized
    async def add_user(self, req: mgmtd_pb2.AddUserRequest) -> mgmtd_pb2.UserTokenReply:
        self._require_init()
        users.check_user_fields(req.name, req.groups)
        now = self.c.wall()
        out = mgmtd_pb2.UserTokenReply()
        written: list[mgmtd_pb2.StoredUser] = []

        async def fn(tr: Transaction) -> None:
            if (found := await users.load_user(tr, req.uid)) is not None:
                if written and found == written[-1]:
                    return  # this call's, committed by an attempt of unknown outcome (see init_cluster)
                raise FS3Error(StatusCode.ALREADY_EXISTS, f"user {req.uid} exists")
            stored = mgmtd_pb2.StoredUser(
                user=mgmtd_pb2.User(
                    uid=req.uid,
                    name=req.name,
                    gid=req.gid,
                    groups=dict.fromkeys(req.groups),  # once each, in the order given
                    admin=req.admin,
                    root=req.root,
                )
            )
            out.token = users.add_token(stored, now)
            out.user.CopyFrom(users.public_user(stored, now))
            users.save_user(tr, stored)
            written.append(stored)

        await self.c.write(fn, routing=False)
        log.info("user added uid=%d name=%s admin=%s", req.uid, req.name, req.admin)
        return out

    async def _load_user(self, tr: Transaction, uid: int) -> mgmtd_pb2.StoredUser:
        stored = await users.load_user(tr, uid)
        if stored is None:
            raise FS3Error(StatusCode.NOT_FOUND, f"user {uid} does not exist")
        return stored

    async def _other_admin_exists(self, tr: Transaction, uid: int) -> bool:
        for kv in await tr.get_prefix(schema.USER):
            u = mgmtd_pb2.StoredUser.FromString(kv.value).user
            if u.admin and u.uid != uid:
                return True
        return False

    @serialized
    async def remove_user(self, uid: int) -> None:
        self._require_init()
        cleared: list[int] = []

        async def fn(tr: Transaction) -> None:
            if cleared and await users.load_user(tr, uid) is None:
                return  # an attempt of unknown outcome removed it (see init_cluster)
            stored = await self._load_user(tr, uid)
            if stored.user.admin and not await self._other_admin_exists(tr, uid):
                raise FS3Error(StatusCode.FAILED_PRECONDITION, f"user {uid} is the last admin")
            tr.clear(schema.user_key(uid))
            cleared.append(uid)

        await self.c.write(fn, routing=False)
        log.info("user removed uid=%d", uid)

    @serialized
    async def set_user(self, req: mgmtd_pb2.SetUserRequest) -> mgmtd_pb2.User:
        self._require_init()
        now = self.c.wall()
        out = mgmtd_pb2.User()

        async def fn(tr: Transaction) -> None:
            stored = await self._load_user(tr, req.uid)
            u = stored.user
            if req.name:
                u.name = req.name
            if req.HasField("gid"):
                u.gid = req.gid
            if req.set_groups:
                del u.groups[:]
                u.groups.extend(dict.fromkeys(req.groups))  # once each, in the order given
            if req.HasField("admin"):
                if u.admin and not req.admin and not await self._other_admin_exists(tr, req.uid):
                    raise FS3Error(StatusCode.FAILED_PRECONDITION, f"user {req.uid} is the last admin")
                u.admin = req.admin
            if req.HasField("root"):
                u.root = req.root
            users.check_user_fields(u.name, u.groups)
            users.save_user(tr, stored)
            out.CopyFrom(users.public_user(stored, now))

        await self.c.write(fn, routing=False)
        return out

    @serialized
    async def issue_token(self, req: mgmtd_pb2.IssueTokenRequest) -> mgmtd_pb2.UserTokenReply:
        self._require_init()
        now = self.c.wall()
        out = mgmtd_pb2.UserTokenReply()

        async def fn(tr: Transaction) -> None:
            stored = await self._load_user(tr, req.uid)
            out.token = users.add_token(stored, now, req.ttl_s, invalidate_existing=req.invalidate_existing)
            out.user.CopyFrom(users.public_user(stored, now))
            users.save_user(tr, stored)

        await self.c.write(fn, routing=False)
        return out

    async def get_user(self, uid: int) -> mgmtd_pb2.User:
        now = self.c.wall()

        async def fn(tr: Transaction) -> mgmtd_pb2.User:
            return users.public_user(await self._load_user(tr, uid), now)

        return await self.c.db.run(fn, read_only=True)

    async def list_users(self) -> list[mgmtd_pb2.User]:
        now = self.c.wall()

        async def fn(tr: Transaction) -> list[mgmtd_pb2.User]:
            return [
                users.public_user(mgmtd_pb2.StoredUser.FromString(kv.value), now)
                for kv in await tr.get_prefix(schema.USER)
            ]

        return await self.c.db.run(fn, read_only=True)

    # ---- configs -------------------------------------------------------------------------------

    @serialized
    async def set_config(self, req: mgmtd_pb2.SetConfigRequest) -> int:
        self._require_init()
        service = _CONFIG_SERVICE.get(req.node_type)
        if service is None:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"no config for node type {req.node_type}")
        if len(req.content.encode()) > MAX_CONFIG_BYTES:
            raise FS3Error(StatusCode.CONFIG_INVALID, f"config larger than {MAX_CONFIG_BYTES} bytes")
        if len(req.description.encode()) > MAX_CONFIG_DESCRIPTION_BYTES:
            # (content and description are one store value: a long one failed with the store's
            # KV_VALUE_TOO_LARGE, naming neither)
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                f"config description of {len(req.description.encode())} bytes is longer than "
                f"{MAX_CONFIG_DESCRIPTION_BYTES}",
            )
        await asyncio.to_thread(_validate_config, service, req.content)
        old = self.c.rec.configs.get(req.node_type)
        cfg = mgmtd_pb2.ConfigInfo(
            node_type=req.node_type,
            version=(old.version if old is not None else 0) + 1,
            content=req.content,
            description=req.description,
        )

        async def fn(tr: Transaction) -> Apply:
            tr.set(schema.config_key(cfg.node_type, cfg.version), cfg.SerializeToString())

            def apply() -> None:
                self.c.rec.configs[cfg.node_type] = cfg

            return apply

        await self.c.write(fn, routing=False)
        log.info("config set type=%s version=%d", common_pb2.NodeType.Name(cfg.node_type), cfg.version)
        return cfg.version

    async def get_config(self, node_type: int, version: int) -> mgmtd_pb2.ConfigInfo | None:
        if version == 0:
            return self.c.rec.configs.get(node_type)
        if node_type not in common_pb2.NodeType.values():
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown node type {node_type}")

        async def fn(tr: Transaction) -> bytes | None:
            return await tr.get(schema.config_key(node_type, version))

        raw = await self.c.db.run(fn, read_only=True)
        if raw is None:
            raise FS3Error(StatusCode.NOT_FOUND, f"config version {version} does not exist")
        return mgmtd_pb2.ConfigInfo.FromString(raw)


#: settings that name one node or its disks: a pushed config (for every node of a type) has none
_PER_NODE = frozenset({"node_id", "target_ids", "target_paths"})


def _validate_config(service: str, content: str) -> None:
    """Refuse a config the service would refuse at start: bad TOML, unknown keys, bad values."""
    try:
        settings = tomllib.loads(content)
    except tomllib.TOMLDecodeError as e:
        raise FS3Error(StatusCode.CONFIG_INVALID, f"not valid TOML: {e}") from None
    if own := sorted(_PER_NODE & settings.keys()):
        # one pushed config is every node's of the type: these would be taken for no node
        raise FS3Error(
            StatusCode.CONFIG_INVALID,
            f"{', '.join(own)}: each node's own, set in its config file, not pushed to every {service} node",
        )
    fd, path = tempfile.mkstemp(suffix=".toml", prefix=f"fs3-{service}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
        load_config(SERVICE_CONFIGS[service], path, environ={})
    except FS3Error as e:
        raise FS3Error(StatusCode.CONFIG_INVALID, e.message.replace(path, "the uploaded config")) from None
    finally:
        os.unlink(path)


def _refuse_losing_copies(chain: mgmtd_pb2.ChainInfo, target_id: int) -> None:
    """FAILED_PRECONDITION if removing ``target_id`` from ``chain`` leaves it fewer than two
    SERVING targets (an OFFLINE one holds no current copy)."""
    if target_id not in {t.target_id for t in chain.targets}:
        return  # (update_chain's removal says what is wrong)
    # a target draining (removed or taken offline a moment ago) counts for none
    serving = serving_staying(chain, (target_id,))
    state = next(t.public_state for t in chain.targets if t.target_id == target_id)
    if state == common_pb2.LASTSRV:
        why = (
            f"target {target_id} is its LASTSRV, the only one holding its last writes: removed, they are lost"
        )
    elif not serving:
        draining = {d.target_id for d in chain.draining}
        gone = all(t.target_id == target_id or t.target_id in draining for t in chain.targets)
        why = f"without target {target_id} it would have no SERVING target left (its data unavailable{' and gone' if gone else ''})"
    elif len(serving) >= 2:
        return
    elif target_id in serving_staying(chain):
        why = (
            f"without target {target_id} it would have one copy of its data left (on target "
            f"{serving[0]}), which one failed disk loses"
        )
    else:  # it does not lower the copies; it is the way back to a second one
        why = (
            f"it has one copy of its data (on target {serving[0]}); target {target_id} "
            f"({common_pb2.PublicTargetState.Name(state)}) would make a second one when it returns"
        )
    raise FS3Error(StatusCode.FAILED_PRECONDITION, f"chain {chain.chain_id}: {why} (--force to do it anyway)")
