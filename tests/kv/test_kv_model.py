"""Hypothesis-generated operation sequences, checked against a plain dict model of the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_engines import ENGINES, open_engine

from fs3.errors import FS3Error, StatusCode
from fs3.kv import Database, KeyValue, Transaction

pytestmark = pytest.mark.timeout(240)

LONG = b"L" * 446  # around the lmdb engine's 448-byte bucket threshold
KEYS = [b"", b"a", b"a\x00", b"ab", b"b", b"b\x00", b"c", b"\xfe"] + [
    LONG + s for s in (b"", b"a", b"ab", b"ab\x00", b"ab" + b"z" * 60, b"ab" + b"z" * 300, b"ac", b"b")
]
BOUNDS = [*KEYS, b"\xff", b"a\xff", LONG + b"ab\xff"]

key = st.sampled_from([k for k in KEYS if k])  # the empty key is legal but FDB's "" is awkward
bound = st.sampled_from(BOUNDS)
value = st.binary(max_size=6)

write_op = st.one_of(
    st.tuples(st.just("set"), key, value),
    st.tuples(st.just("clear"), key),
    # a begin in the system keyspace is refused (tested elsewhere), so ranges start below it
    st.tuples(st.just("clear_range"), st.sampled_from(KEYS), bound),
    st.tuples(st.just("add"), key, st.binary(min_size=1, max_size=3)),
    st.tuples(st.just("max"), key, st.binary(min_size=1, max_size=3)),
)
read_op = st.one_of(
    st.tuples(st.just("get"), key, st.booleans()),
    st.tuples(st.just("range"), bound, bound, st.integers(0, 4), st.booleans(), st.booleans()),
)
op = st.one_of(write_op, read_op, st.tuples(st.sampled_from(["commit", "cancel"])))


def model_add(old: bytes | None, operand: bytes) -> bytes:
    width = len(operand)
    total = int.from_bytes((old or b"")[:width], "little") + int.from_bytes(operand, "little")
    return (total % (1 << (8 * width))).to_bytes(width, "little")


def model_max(old: bytes | None, operand: bytes) -> bytes:
    if old is None:
        return operand
    width = len(operand)
    old = old[:width] + bytes(max(0, width - len(old)))
    return operand if int.from_bytes(operand, "little") > int.from_bytes(old, "little") else old


def model_apply(state: dict[bytes, bytes], o: tuple) -> None:
    if o[0] == "set":
        state[o[1]] = o[2]
    elif o[0] == "clear":
        state.pop(o[1], None)
    elif o[0] == "clear_range":
        for k in [k for k in state if o[1] <= k < o[2]]:
            del state[k]
    elif o[0] == "add":
        state[o[1]] = model_add(state.get(o[1]), o[2])
    elif o[0] == "max":
        state[o[1]] = model_max(state.get(o[1]), o[2])


def model_read(state: dict[bytes, bytes], o: tuple):
    if o[0] == "get":
        return state.get(o[1])
    _, begin, end, limit, reverse, _ = o
    found = sorted((k, v) for k, v in state.items() if begin <= k < end)
    if reverse:
        found.reverse()
    return [KeyValue(k, v) for k, v in (found[:limit] if limit else found)]


async def engine_do(tr: Transaction, o: tuple):
    if o[0] == "set":
        tr.set(o[1], o[2])
    elif o[0] == "clear":
        tr.clear(o[1])
    elif o[0] == "clear_range":
        tr.clear_range(o[1], o[2])
    elif o[0] == "add":
        tr.add(o[1], o[2])
    elif o[0] == "max":
        tr.atomic_max(o[1], o[2])
    elif o[0] == "get":
        view = tr.snapshot if o[2] else tr
        return await view.get(o[1])
    elif o[0] == "range":
        _, begin, end, limit, reverse, snap = o
        view = tr.snapshot if snap else tr
        return await view.get_range(begin, end, limit, reverse)
    return None


async def wipe(db: Database) -> None:
    async def fn(tr: Transaction) -> None:
        tr.clear_range(b"", b"\xff")

    await db.run(fn)


async def everything(db: Database) -> list[KeyValue]:
    return await db.run(lambda tr: tr.get_range(b"", b"\xff"), read_only=True)


def run_with_engine(engine: str, request: pytest.FixtureRequest, tmp_path: Path, check) -> None:
    """Run a hypothesis check against one database, opened once for all examples."""
    with asyncio.Runner() as runner:
        db = runner.run(open_engine(engine, request, tmp_path))
        try:
            check(runner, db)
        finally:
            runner.run(db.close())


HYPOTHESIS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("engine", ENGINES)
def test_single_transaction_sequences_match_model(engine, request, tmp_path) -> None:
    async def play(db: Database, ops: list[tuple]) -> None:
        await wipe(db)
        committed: dict[bytes, bytes] = {}
        pending = dict(committed)
        tr = db.create_transaction()
        for o in ops:
            if o[0] == "commit":
                await tr.commit()
                committed = pending
                tr, pending = db.create_transaction(), dict(committed)
            elif o[0] == "cancel":
                tr.cancel()
                tr, pending = db.create_transaction(), dict(committed)
            elif o[0] in ("get", "range"):
                assert await engine_do(tr, o) == model_read(pending, o), o
            else:
                await engine_do(tr, o)
                model_apply(pending, o)
        await tr.commit()
        assert await everything(db) == model_read(pending, ("range", b"", b"\xff", 0, False, False))

    def check(runner: asyncio.Runner, db: Database) -> None:
        @HYPOTHESIS
        @given(st.lists(op, max_size=40))
        def sequences(ops: list[tuple]) -> None:
            runner.run(play(db, ops))

        sequences()

    run_with_engine(engine, request, tmp_path, check)


def conflict_keys(ops: list[tuple]) -> list[tuple[bytes, bytes]]:
    """A superset of the ranges a transaction's non-snapshot reads depend on."""
    out = []
    for o in ops:
        if o[0] == "get" and not o[2]:
            out.append((o[1], o[1] + b"\x00"))
        elif o[0] == "range" and not o[5]:
            out.append((o[1], o[2]))
    return out


def written(ops: list[tuple]) -> list[tuple[bytes, bytes]]:
    out = []
    for o in ops:
        if o[0] in ("set", "clear", "add", "max"):
            out.append((o[1], o[1] + b"\x00"))
        elif o[0] == "clear_range":
            out.append((o[1], o[2]))
    return out


def overlaps(a: list[tuple[bytes, bytes]], b: list[tuple[bytes, bytes]]) -> bool:
    return any(b1 < e2 and b2 < e1 for b1, e1 in a for b2, e2 in b)


txn_ops = st.lists(st.one_of(write_op, read_op), max_size=8)
writing_txn_ops = st.tuples(txn_ops, write_op).map(lambda t: [*t[0], t[1]])


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrent_transactions_are_serializable(engine, request, tmp_path) -> None:
    """t2 reads, t1 commits, t2 commits: t2 must either fail with a conflict that FoundationDB
    would also report, or produce exactly what running it after t1 would have."""

    async def play(db: Database, initial: list[tuple], ops1: list[tuple], ops2: list[tuple]) -> None:
        await wipe(db)
        state: dict[bytes, bytes] = {}
        t0 = db.create_transaction()
        for o in initial:
            await engine_do(t0, o)
            model_apply(state, o)
        await t0.commit()

        t2 = db.create_transaction()
        await t2.snapshot.get(b"a")  # fix t2's snapshot before t1 commits
        got2 = [await engine_do(t2, o) for o in ops2]
        t1 = db.create_transaction()
        for o in ops1:
            await engine_do(t1, o)
        await t1.commit()
        after1 = dict(state)
        for o in ops1:
            model_apply(after1, o)

        try:
            await t2.commit()
        except FS3Error as e:
            assert e.code == StatusCode.KV_CONFLICT
            assert overlaps(conflict_keys(ops2), written(ops1)), "a conflict FoundationDB would not report"
            assert await everything(db) == model_read(after1, ("range", b"", b"\xff", 0, False, False))
            return
        # Committed: every non-snapshot read must match a run of t2 after t1 (a read-only t2 is
        # serialised at its snapshot instead, before t1).
        writes2 = any(
            o[0] in ("set", "clear", "add", "max") or o[0] == "clear_range" and o[1] < o[2] for o in ops2
        )
        replay = dict(after1 if writes2 else state)
        for o, got in zip(ops2, got2, strict=True):
            if o[0] == "get" and not o[2] or o[0] == "range" and not o[5]:
                assert got == model_read(replay, o), ("serializability", o)
            model_apply(replay, o)
        final = replay if writes2 else after1
        assert await everything(db) == model_read(final, ("range", b"", b"\xff", 0, False, False))

    def check(runner: asyncio.Runner, db: Database) -> None:
        @HYPOTHESIS
        @given(
            st.lists(st.tuples(st.just("set"), key, value), max_size=6),
            writing_txn_ops,
            txn_ops,
        )
        def interleavings(initial: list[tuple], ops1: list[tuple], ops2: list[tuple]) -> None:
            runner.run(play(db, initial, ops1, ops2))

        interleavings()

    run_with_engine(engine, request, tmp_path, check)
