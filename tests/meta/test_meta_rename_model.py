"""Hypothesis state machine: creates, mkdirs, renames, exchanges (RENAME_EXCHANGE), unlinks and
rmdirs sent to TWO real meta daemons at once (two per step, one to each, concurrently) over one
lmdb store, checked against an in-memory model. Each step's outcome must be that of one of the two
serial orders; after every step the namespace, walked through readdir, must be a tree that equals
the model."""

from __future__ import annotations

import asyncio
import copy
import errno
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from meta_harness import MetaProcesses

from fs3.client.meta_client import ROOT_ID, MetaClient
from fs3.errors import FS3Error
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

NAMES = [b"a", b"b", b"c"]
OK = 0


@dataclass
class Node:
    kind: str  # "f" or "d"
    parent: int
    name: bytes


@dataclass
class Model:
    """Inode id -> node for live inodes; entries (parent, name) -> id."""

    top: int
    nodes: dict[int, Node] = field(default_factory=dict)
    entries: dict[tuple[int, bytes], int] = field(default_factory=dict)

    def is_dir(self, i: int) -> bool:
        return i == self.top or (i in self.nodes and self.nodes[i].kind == "d")

    def children(self, d: int) -> list[int]:
        return [i for (p, _), i in self.entries.items() if p == d]

    def ancestors(self, d: int) -> Iterator[int]:
        while d != self.top and d in self.nodes:
            yield d
            d = self.nodes[d].parent
        yield d

    def apply(self, op: tuple, result_id: int) -> int:
        """Apply ``op`` as the service would; returns OK or an errno. ``result_id`` is the id a
        successful create/mkdir got from the service."""
        kind = op[0]
        if kind in ("create", "mkdir"):
            _, p, name = op
            if not self.is_dir(p):
                return errno.ENOENT
            if (p, name) in self.entries:
                return errno.EEXIST
            self.nodes[result_id] = Node("f" if kind == "create" else "d", p, name)
            self.entries[(p, name)] = result_id
            return OK
        if kind in ("unlink", "rmdir"):
            _, p, name = op
            if not self.is_dir(p) or (p, name) not in self.entries:
                return errno.ENOENT
            i = self.entries[(p, name)]
            if kind == "unlink" and self.nodes[i].kind == "d":
                return errno.EISDIR
            if kind == "rmdir":
                if self.nodes[i].kind != "d":
                    return errno.ENOTDIR
                if self.children(i):
                    return errno.ENOTEMPTY
            del self.entries[(p, name)]
            del self.nodes[i]
            return OK
        if kind == "exchange":
            return self._exchange(*op[1:])
        _, p1, n1, p2, n2 = op
        if not self.is_dir(p1) or not self.is_dir(p2) or (p1, n1) not in self.entries:
            return errno.ENOENT
        src = self.entries[(p1, n1)]
        dst = self.entries.get((p2, n2))
        if dst == src:
            return OK
        if dst is not None:
            if self.nodes[src].kind == "d" and self.nodes[dst].kind != "d":
                return errno.ENOTDIR
            if self.nodes[src].kind != "d" and self.nodes[dst].kind == "d":
                return errno.EISDIR
        if self.nodes[src].kind == "d" and p1 != p2 and src in self.ancestors(p2):
            return errno.EINVAL
        if dst is not None:
            if self.nodes[dst].kind == "d" and self.children(dst):
                return errno.ENOTEMPTY
            del self.nodes[dst]
        del self.entries[(p1, n1)]
        self.entries[(p2, n2)] = src
        self.nodes[src].parent, self.nodes[src].name = p2, n2
        return OK

    def _exchange(self, p1: int, n1: bytes, p2: int, n2: bytes) -> int:
        """renameat2 RENAME_EXCHANGE: both names must exist; neither may move into its own subtree."""
        if not self.is_dir(p1) or not self.is_dir(p2):
            return errno.ENOENT
        a, b = self.entries.get((p1, n1)), self.entries.get((p2, n2))
        if a is None or b is None:
            return errno.ENOENT
        if a == b:
            return OK
        if p1 != p2 and (a in self.ancestors(p2) or b in self.ancestors(p1)):
            return errno.EINVAL
        self.entries[(p1, n1)], self.entries[(p2, n2)] = b, a
        self.nodes[a].parent, self.nodes[a].name = p2, n2
        self.nodes[b].parent, self.nodes[b].name = p1, n1
        return OK


async def run_op(c: MetaClient, op: tuple) -> tuple[int, int]:
    """(OK or errno, id of a created inode)."""
    try:
        if op[0] == "create":
            return OK, (await c.create(op[1], op[2], 0o644, 0o200)).inode.id
        if op[0] == "mkdir":
            return OK, (await c.mkdir(op[1], op[2], 0o755)).id
        if op[0] == "unlink":
            await c.unlink(op[1], op[2])
        elif op[0] == "rmdir":
            await c.rmdir(op[1], op[2])
        else:
            await c.rename(*op[1:], 2 if op[0] == "exchange" else 0)
        return OK, 0
    except FS3Error as e:
        return e.errno, 0


class TwoMetas(RuleBasedStateMachine):
    clients: list[MetaClient]
    loop: asyncio.AbstractEventLoop
    counter = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        c = self.clients[0]
        top = self.loop.run_until_complete(c.mkdir(ROOT_ID, f"ex{next(self.counter)}".encode(), 0o755))
        self.model = Model(top.id)
        self.candidates: list[Model] = []
        self.dirs = [top.id]  # every directory id ever made here, removed ones too

    def _op(self, data: st.DataObject) -> tuple:
        # Indexes, not sampled_from(self.dirs): the list's length depends on the daemons' outcomes,
        # and hypothesis needs the same draws when it replays a case.
        kind = data.draw(
            st.sampled_from(["create", "mkdir", "unlink", "rmdir", "rename", "rename", "exchange"])
        )
        p = self.dirs[data.draw(st.integers(0, 63)) % len(self.dirs)]
        n = data.draw(st.sampled_from(NAMES))
        p2 = self.dirs[data.draw(st.integers(0, 63)) % len(self.dirs)]
        n2 = data.draw(st.sampled_from(NAMES))
        return (kind, p, n) if kind not in ("rename", "exchange") else (kind, p, n, p2, n2)

    @rule(data=st.data())
    def two_at_once(self, data: st.DataObject) -> None:
        a, b = self._op(data), self._op(data)

        async def both() -> list[tuple[int, int]]:
            return await asyncio.gather(run_op(self.clients[0], a), run_op(self.clients[1], b))

        (ra, ia), (rb, ib) = self.loop.run_until_complete(both())
        # Both orders may explain the replies (two renames onto one name both succeed either
        # way) while leaving different states: keep each, and let the namespace decide.
        self.candidates = []
        for first, second in (((a, ra, ia), (b, rb, ib)), ((b, rb, ib), (a, ra, ia))):
            trial = copy.deepcopy(self.model)
            if trial.apply(first[0], first[2]) == first[1] and trial.apply(second[0], second[2]) == second[1]:
                self.candidates.append(trial)
        assert self.candidates, f"no serial order explains {a} -> {ra}, {b} -> {rb}"
        for op, res, new_id in ((a, ra, ia), (b, rb, ib)):
            if res == OK and op[0] == "mkdir":
                self.dirs.append(new_id)

    @precondition(lambda self: True)
    @invariant()
    def namespace_matches_model(self) -> None:
        async def walk() -> tuple[dict[tuple[int, bytes], int], dict[int, str]]:
            c = self.clients[1]
            entries: dict[tuple[int, bytes], int] = {}
            kinds: dict[int, str] = {}
            todo = [self.model.top]
            seen = {self.model.top}
            while todo:
                d = todo.pop()
                async for e in c.listdir(d, page=2):
                    assert e.inode_id not in seen, "an inode reachable twice: not a tree"
                    seen.add(e.inode_id)
                    entries[(d, e.name)] = e.inode_id
                    kinds[e.inode_id] = "d" if e.type == m.INODE_DIRECTORY else "f"
                    if e.type == m.INODE_DIRECTORY:
                        assert (await c.stat(e.inode_id)).parent == d
                        todo.append(e.inode_id)
            return entries, kinds

        entries, kinds = self.loop.run_until_complete(walk())
        matching = [
            c
            for c in self.candidates or [self.model]
            if entries == c.entries and kinds == {i: n.kind for i, n in c.nodes.items()}
        ]
        assert matching, f"namespace {entries} matches no serial order of the last step"
        self.model = matching[0]
        self.candidates = []


@pytest.mark.timeout(180)
def test_two_meta_processes_against_model(tmp_path: Path) -> None:
    procs = MetaProcesses(tmp_path)
    loop = asyncio.new_event_loop()
    clients: list[MetaClient] = []
    try:
        daemons = [procs.start(1), procs.start(2)]
        for d in daemons:
            procs.wait_ready(d)
        user = common_pb2.UserInfo(uid=0, gid=0)
        clients = [MetaClient([d.address], user=user, timeout_s=20) for d in daemons]
        TwoMetas.clients = clients
        TwoMetas.loop = loop
        run = settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )(TwoMetas).TestCase
        run().runTest()
    finally:
        for c in clients:
            loop.run_until_complete(c.close())
        loop.close()
        procs.cleanup()
