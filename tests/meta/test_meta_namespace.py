"""What the namespace operations do when they succeed: attributes, link counts, times, permissions
that allow, paging, layouts, ids, sessions and garbage collection (mem and lmdb engines)."""

from __future__ import annotations

import asyncio
import collections
import errno

import pytest
from cycles import cycles_kept, frames
from meta_tree import ALICE, BOB, BOB_IN_500, Tree

from fs3.errors import FS3Error, StatusCode
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.meta.idalloc import InodeIdAllocator
from fs3.meta.layout import ChainAllocator, ChainTable, static_tables
from fs3.meta.permissions import ROOT, Credentials
from fs3.meta.schema import ROOT_ID
from fs3.meta.storage_io import NoStorage
from fs3.meta.store import MetaStore
from fs3.placement import shuffle
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)


async def test_create_sets_owner_mode_layout(tree: Tree) -> None:
    s = tree.store
    r = await s.create(ALICE, tree["/pub"], b"new", 0o666, umask=0o022, session=True, client_id=9)
    ino = r.inode
    assert r.created and r.session_id
    assert (ino.type, ino.mode, ino.uid, ino.gid, ino.nlink, ino.size) == (
        m.INODE_FILE,
        0o644,
        1000,
        1000,
        1,
        0,
    )
    lay = ino.layout
    assert lay.stripe_count == 2 and len(lay.chains) == 2 and lay.chunk_size == 1 << 20
    window = [101 + (lay.base_index + i) % 8 for i in range(2)]
    assert list(lay.chains) == shuffle(window, lay.shuffle_seed, lay.shuffle_algorithm)
    again = await s.create(ALICE, tree["/pub"], b"new", 0o600)
    assert not again.created and again.inode.id == ino.id


async def test_round_robin_spreads_chains(tree: Tree) -> None:
    s = tree.store
    used: dict[int, int] = {}
    for i in range(40):
        ino = (await s.create(ROOT, tree["/pub"], f"rr{i}".encode(), 0o644)).inode
        for c in ino.layout.chains:
            used[c] = used.get(c, 0) + 1
    assert sorted(used) == list(range(101, 109)) and max(used.values()) == min(used.values()) == 10


def _allocator(low: frozenset[int], stripe: int) -> ChainAllocator:
    return ChainAllocator(
        static_tables([ChainTable(1, 1, tuple(range(101, 109)), low)]), default_stripe=stripe
    )


def test_new_files_pass_over_chains_low_on_space() -> None:
    low = frozenset({102, 103, 107})
    for stripe in (1, 2, 5):
        alloc = _allocator(low, stripe)
        used: collections.Counter[int] = collections.Counter()
        for _ in range(5 * 20):
            lay = alloc.file_layout(None)
            assert len(set(lay.chains)) == stripe == lay.stripe_count
            used.update(lay.chains)
        # every chain with room, evenly; none of the low ones
        assert sorted(used) == [101, 104, 105, 106, 108], stripe
        assert max(used.values()) == min(used.values()) == 20 * stripe, (stripe, used)
    # a stripe wider than the chains with room: the file gets those chains only
    lay = _allocator(low, 8).file_layout(None)
    assert sorted(lay.chains) == [101, 104, 105, 106, 108] and lay.stripe_count == 5
    # a window of consecutive chains with room keeps the re-derivable form
    lay = _allocator(frozenset({108}), 2).file_layout(None)
    if lay.base_index <= 5:
        window = [101 + lay.base_index + i for i in range(2)]
        assert list(lay.chains) == shuffle(window, lay.shuffle_seed, lay.shuffle_algorithm)


def test_every_chain_low_on_space_still_places_files() -> None:
    alloc = _allocator(frozenset(range(101, 109)), 2)
    used: collections.Counter[int] = collections.Counter()
    for _ in range(40):
        lay = alloc.file_layout(None)
        assert len(set(lay.chains)) == 2
        used.update(lay.chains)
    assert sorted(used) == list(range(101, 109)) and set(used.values()) == {10}


async def test_directory_default_layout_inherited(tree: Tree) -> None:
    s = tree.store
    d = await s.mkdir(ROOT, ROOT_ID, b"lay", 0o755)
    await s.set_layout(ROOT, d.id, chunk_size=4 << 20, stripe=4)
    sub = await s.mkdir(ROOT, d.id, b"sub", 0o755)
    f = (await s.create(ROOT, sub.id, b"f", 0o644)).inode
    assert (f.layout.chunk_size, f.layout.stripe_count, len(set(f.layout.chains))) == (4 << 20, 4, 4)


async def test_directory_link_counts_and_times(tree: Tree) -> None:
    s = tree.store
    d = await s.mkdir(ROOT, ROOT_ID, b"d", 0o755)
    before = await s.stat(d.id)
    assert before.nlink == 2
    await s.mkdir(ROOT, d.id, b"a", 0o755)
    await s.mkdir(ROOT, d.id, b"b", 0o755)
    await s.create(ROOT, d.id, b"f", 0o644)
    after = await s.stat(d.id)
    assert after.nlink == 4 and after.mtime_ns > before.mtime_ns and after.ctime_ns == after.mtime_ns
    await s.rename(ROOT, d.id, b"a", ROOT_ID, b"a2")
    assert (await s.stat(d.id)).nlink == 3
    await s.rmdir(ROOT, d.id, b"b")
    assert (await s.stat(d.id)).nlink == 2
    assert (await s.lookup(ROOT, ROOT_ID, b"a2")).parent == ROOT_ID


async def test_a_directorys_times_never_go_back(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes that commit in another order than their clocks were read (two meta servers, one
    behind the other; or one server's group commit) leave a directory's latest times; a rename or
    an xattr change of it moves its ctime on and leaves its mtime."""
    s = tree.store
    d = await s.mkdir(ROOT, ROOT_ID, b"t", 0o755)
    sec = 10**9
    clock = [d.mtime_ns + 2 * sec]
    monkeypatch.setattr("fs3.meta.inode.now_ns", lambda: clock[0])
    await s.create(ROOT, d.id, b"late", 0o644)
    clock[0] -= sec  # read its clock before the first, committed after it
    await s.create(ROOT, d.id, b"early", 0o644)
    await s.mkdir(ROOT, d.id, b"sub", 0o755)
    st = await s.stat(d.id)
    assert (st.mtime_ns, st.ctime_ns) == (d.mtime_ns + 2 * sec,) * 2
    await s.rename(ROOT, ROOT_ID, b"t", ROOT_ID, b"t2")  # a rename with the clock behind
    st = await s.stat(d.id)
    assert (st.mtime_ns, st.ctime_ns) == (d.mtime_ns + 2 * sec,) * 2
    clock[0] = d.mtime_ns + 3 * sec
    await s.rename(ROOT, ROOT_ID, b"t2", ROOT_ID, b"t3")
    st = await s.stat(d.id)
    assert (st.mtime_ns, st.ctime_ns) == (d.mtime_ns + 2 * sec, d.mtime_ns + 3 * sec)
    clock[0] = d.mtime_ns + 4 * sec
    await s.setxattr(ROOT, d.id, b"user.k", b"v")
    st = await s.stat(d.id)
    assert (st.mtime_ns, st.ctime_ns) == (d.mtime_ns + 2 * sec, d.mtime_ns + 4 * sec)
    clock[0] = d.mtime_ns + 5 * sec
    await s.create(ROOT, d.id, b"f", 0o644)  # entries change both again
    assert (await s.stat(d.id)).mtime_ns == (await s.stat(d.id)).ctime_ns == d.mtime_ns + 5 * sec
    # a stamp the max would keep for good (negative, read as huge unsigned; or far ahead, from a
    # clock that jumped) is replaced at the next change
    for bad in (-1, clock[0] + 3600 * sec):
        await s.setattr(ROOT, d.id, m.SetattrReq(fields=m.SETATTR_CTIME, ctime_ns=bad))
        clock[0] += sec
        await s.create(ROOT, d.id, f"g{bad}".encode(), 0o644)
        st = await s.stat(d.id)
        assert (st.mtime_ns, st.ctime_ns) == (clock[0], clock[0])


async def test_hard_links(tree: Tree) -> None:
    s = tree.store
    f = tree["/full/f"]
    await s.link(ROOT, f, tree["/pub"], b"f2")
    assert (await s.stat(f)).nlink == 2
    await s.unlink(ROOT, tree["/full"], b"f")
    assert (await s.lookup(ROOT, tree["/pub"], b"f2")).nlink == 1
    # renaming one name of an inode onto another name of it changes nothing
    await s.link(ROOT, f, tree["/pub"], b"f3")
    await s.rename(ROOT, tree["/pub"], b"f2", tree["/pub"], b"f3")
    assert (await s.lookup(ROOT, tree["/pub"], b"f2")).id == f


async def test_rename_replaces_file_and_empty_dir(tree: Tree) -> None:
    s = tree.store
    a = (await s.create(ROOT, tree["/pub"], b"a", 0o644)).inode
    b = (await s.create(ROOT, tree["/pub"], b"b", 0o644)).inode
    await s.rename(ROOT, tree["/pub"], b"a", tree["/pub"], b"b")
    assert (await s.lookup(ROOT, tree["/pub"], b"b")).id == a.id
    with pytest.raises(FS3Error):
        await s.lookup(ROOT, tree["/pub"], b"a")
    assert (await s.stat(b.id)).nlink == 0  # kept for the collector
    d1 = await s.mkdir(ROOT, ROOT_ID, b"d1", 0o755)
    await s.create(ROOT, d1.id, b"inside", 0o644)
    d2 = await s.mkdir(ROOT, tree["/pub"], b"d2", 0o755)
    await s.rename(ROOT, ROOT_ID, b"d1", tree["/pub"], b"d2")
    moved = await s.lookup(ROOT, tree["/pub"], b"d2")
    assert moved.id == d1.id and moved.parent == tree["/pub"]
    with pytest.raises(FS3Error):
        await s.stat(d2.id)
    assert (await s.lookup_path(ROOT, b"/pub/d2/inside")).type == m.INODE_FILE


async def test_a_rename_that_says_what_it_replaces_is_refused_if_that_changed(tree: Tree) -> None:
    """A mount's kernel marks the directory it believes a rename replaces dead for good: the
    mount says which one it is, and meta refuses (ESTALE: the kernel looks the names up again and
    retries) when another client has put something else there, or nothing, since."""
    s = tree.store
    x = await s.mkdir(ROOT, tree["/pub"], b"T", 0o755)
    await s.create(ROOT, x.id, b"kept", 0o644)
    src = await s.mkdir(ROOT, tree["/pub"], b"S", 0o755)
    await s.rename(ROOT, tree["/pub"], b"T", tree["/pub"], b"T2")  # another client's moves
    z = await s.mkdir(ROOT, tree["/pub"], b"T", 0o755)
    with pytest.raises(FS3Error) as e:
        await s.rename(ROOT, tree["/pub"], b"S", tree["/pub"], b"T", replaces=x.id)
    assert e.value.code == StatusCode.META_STALE and e.value.errno == errno.ESTALE
    assert (await s.lookup(ROOT, tree["/pub"], b"T")).id == z.id  # nothing done
    assert (await s.lookup(ROOT, tree["/pub"], b"S")).id == src.id
    await s.rmdir(ROOT, tree["/pub"], b"T")
    with pytest.raises(FS3Error) as e:  # nothing there any more: refused as well
        await s.rename(ROOT, tree["/pub"], b"S", tree["/pub"], b"T", replaces=z.id)
    assert e.value.code == StatusCode.META_STALE
    z = await s.mkdir(ROOT, tree["/pub"], b"T", 0o755)
    await s.rename(ROOT, tree["/pub"], b"S", tree["/pub"], b"T", replaces=z.id)  # as it is: done
    assert (await s.lookup(ROOT, tree["/pub"], b"T")).id == src.id
    assert (await s.lookup_path(ROOT, b"/pub/T2/kept")).type == m.INODE_FILE


async def test_rename_exchange_swaps_two_entries(tree: Tree) -> None:
    """renameat2(RENAME_EXCHANGE): a file and a directory in two directories trade places; the
    parents' link counts follow the directory, its ".." the new parent, both ctimes move."""
    s = tree.store
    x = await s.mkdir(ROOT, ROOT_ID, b"x", 0o755)
    y = await s.mkdir(ROOT, ROOT_ID, b"y", 0o755)
    f = (await s.create(ROOT, x.id, b"f", 0o644)).inode
    d = await s.mkdir(ROOT, y.id, b"d", 0o755)
    await s.create(ROOT, d.id, b"inside", 0o644)
    before = {i: (await s.stat(i)).ctime_ns for i in (f.id, d.id)}
    await s.rename(ROOT, x.id, b"f", y.id, b"d", 2)
    assert (await s.lookup(ROOT, x.id, b"f")).id == d.id
    assert (await s.lookup(ROOT, y.id, b"d")).id == f.id
    assert (await s.lookup_path(ROOT, b"/x/f/inside")).type == m.INODE_FILE
    assert (await s.lookup(ROOT, d.id, b"..")).id == x.id
    assert (await s.stat(x.id)).nlink == 3 and (await s.stat(y.id)).nlink == 2
    assert [(await s.stat(i)).ctime_ns > before[i] for i in before] == [True, True]
    assert (await s.stat(f.id)).nlink == 1 and (await s.stat(d.id)).nlink == 2
    # two directories: counts stay; back again in one directory: ids swap, nothing else
    e = await s.mkdir(ROOT, y.id, b"e", 0o755)
    await s.rename(ROOT, x.id, b"f", y.id, b"e", 2)
    assert (await s.lookup(ROOT, e.id, b"..")).id == x.id and (await s.lookup(ROOT, d.id, b"..")).id == y.id
    assert (await s.stat(x.id)).nlink == 3 and (await s.stat(y.id)).nlink == 3
    await s.rename(ROOT, y.id, b"d", y.id, b"e", 2)
    assert [(await s.lookup(ROOT, y.id, n)).id for n in (b"d", b"e")] == [d.id, f.id]
    # two names of one inode: nothing happens
    await s.link(ROOT, f.id, y.id, b"f2")
    await s.rename(ROOT, y.id, b"e", y.id, b"f2", 2)
    assert (await s.stat(f.id)).nlink == 2


async def test_sticky_directory_allows_owners(tree: Tree) -> None:
    s = tree.store
    await s.rename(ALICE, tree["/sticky"], b"alice_f", tree["/sticky"], b"mine")
    await s.create(BOB, tree["/sticky"], b"bobs", 0o644)
    await s.unlink(BOB, tree["/sticky"], b"bobs")
    await s.unlink(ROOT, tree["/sticky"], b"mine")


async def test_supplementary_group_grants_access(tree: Tree) -> None:
    s = tree.store
    sid = (await s.open(BOB_IN_500, tree["/grp/f"], 2))[1]
    assert sid
    entries, _, _ = await s.readdir(BOB_IN_500, tree["/grp"])
    assert [e.name for e in entries] == [b"f"]


async def test_setgid_directory_inherits_group(tree: Tree) -> None:
    s = tree.store
    await s.setattr(ROOT, tree["/grp"], m.SetattrReq(fields=m.SETATTR_MODE, mode=0o2777))
    f = (await s.create(ALICE, tree["/grp"], b"x", 0o644)).inode
    d = await s.mkdir(ALICE, tree["/grp"], b"y", 0o755)
    assert f.gid == 500 and d.gid == 500 and d.mode & 0o2000


async def test_setattr_times_now_and_omit(tree: Tree) -> None:
    s = tree.store
    f = tree["/pub/alice_file"]
    old = await s.stat(f)
    # explicit mtime, atime omitted
    r = await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_MTIME, mtime_ns=1_000_000_123))
    assert r.mtime_ns == 1_000_000_123 and r.atime_ns == old.atime_ns and r.ctime_ns > old.ctime_ns
    # UTIME_NOW for both by someone with write permission only
    await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o666))
    r = await s.setattr(BOB, f, m.SetattrReq(fields=m.SETATTR_ATIME_NOW | m.SETATTR_MTIME_NOW))
    assert r.mtime_ns > 1_000_000_123 and r.atime_ns >= r.mtime_ns - 10**9
    # directories keep times too
    d = await s.setattr(ROOT, tree["/pub"], m.SetattrReq(fields=m.SETATTR_MTIME, mtime_ns=42))
    assert (await s.stat(tree["/pub"])).mtime_ns == 42 == d.mtime_ns


async def test_chown_and_chmod_rules(tree: Tree) -> None:
    s = tree.store
    f = tree["/pub/alice_file"]
    await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o6755))
    r = await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_UID | m.SETATTR_GID, uid=1001, gid=1001))
    assert (r.uid, r.gid, r.mode) == (1001, 1001, 0o755)  # even root's chown clears setuid and setgid
    alice_in = Credentials(1000, 1000, frozenset({77}))
    g = (await s.create(alice_in, tree["/pub"], b"g", 0o4755)).inode
    r = await s.setattr(alice_in, g.id, m.SetattrReq(fields=m.SETATTR_GID, gid=77))
    assert r.gid == 77 and not r.mode & 0o4000  # a non-root chown clears setuid


async def test_truncate_and_length_settlement(tree: Tree) -> None:
    s = tree.store
    r = await s.create(ALICE, tree["/pub"], b"len", 0o644, session=True, client_id=1)
    f = r.inode.id
    assert (await s.sync(f, r.session_id, 5000, True)).size == 5000
    assert (await s.close(f, r.session_id, 3000, True)).size == 5000  # length never shrinks on close
    t = await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=100))
    assert t.size == 100 and t.truncate_version == 1
    assert t.mtime_ns == t.ctime_ns  # one time for the request (its ctime came before its mtime)
    t = await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=1 << 30))
    assert t.size == 1 << 30 and t.mtime_ns == t.ctime_ns
    # ftruncate through a write session needs no write permission any more
    ino, sid = await s.open(ALICE, f, 1)
    await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o444))
    assert (await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=7, session_id=sid))).size == 7
    # O_TRUNC on open and on create
    await s.setattr(ALICE, f, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o644))
    assert (await s.open(ALICE, f, 1 | 0o1000))[0].size == 0
    await s.close(f, sid)


async def test_readdir_pages_and_batch_stat(tree: Tree) -> None:
    s = tree.store
    d = await s.mkdir(ROOT, ROOT_ID, b"many", 0o755)
    names = sorted(f"n{i:03d}".encode() for i in range(250))
    ids = [(await s.create(ROOT, d.id, n, 0o644)).inode.id for n in names]
    got, after = [], b""
    while True:
        entries, inos, more = await s.readdir(ROOT, d.id, after, 64, with_inodes=True)
        assert [i.id for i in inos] == [e.inode_id for e in entries]
        got += [e.name for e in entries]
        if not more:
            break
        after = entries[-1].name
    assert got == names
    res = await s.batch_stat([ids[0], 999_999, ids[-1]])
    assert res[0].id == ids[0] and isinstance(res[1], FS3Error) and res[2].id == ids[-1]


async def test_symlinks_resolve(tree: Tree) -> None:
    s = tree.store
    assert (await s.lookup_path(ROOT, b"/sym")).id == tree["/pub/alice_file"]
    assert (await s.lookup_path(ROOT, b"/sym", follow=False)).type == m.INODE_SYMLINK
    await s.symlink(ROOT, tree["/pub"], b"rel", b"alice_dir/../alice_file")
    assert (await s.lookup_path(ROOT, b"/pub/rel")).id == tree["/pub/alice_file"]
    assert await s.readlink(tree["/sym"]) == b"/pub/alice_file"


@pytest.mark.parametrize(
    ("path", "cred", "code", "message"),
    [
        (b"/full/f/x", ROOT, StatusCode.META_NOT_DIRECTORY, "'/full/f' is not a directory"),
        (b"/full/f/", ROOT, StatusCode.META_NOT_DIRECTORY, "'/full/f' is not a directory"),
        (b"/pub/nope/x", ROOT, StatusCode.NOT_FOUND, "'/pub/nope' does not exist"),
        (b"/sym/x", ROOT, StatusCode.META_NOT_DIRECTORY, "'/pub/alice_file' is not a directory"),
        (b"/noexec/x", BOB, StatusCode.PERMISSION_DENIED, "'/noexec/x': uid 1001 lacks"),
        (b"/loop1", ROOT, StatusCode.META_TOO_MANY_SYMLINKS, "'/loop1': too many levels of symlinks"),
    ],
)
async def test_a_path_lookup_error_names_the_path_where_it_failed(
    tree: Tree, path: bytes, cred: Credentials, code: StatusCode, message: str
) -> None:
    """What ``fs3 admin stat``, ``ls`` and native clients show: the path (symlinks resolved) at
    which resolving stopped, not an inode number."""
    with pytest.raises(FS3Error) as e:
        await tree.store.lookup_path(cred, path)
    assert e.value.code == code
    assert e.value.message.startswith(message), e.value.message


async def test_xattrs_fill_an_inode_only_as_far_as_it_still_grows(tree: Tree) -> None:
    """The cap counted names and values only: 8,000-odd small xattrs passed it and made the inode
    99,999 bytes, one short of the store's value limit (FoundationDB's 100,000), after which a
    chown or a length that needs a byte more failed for good (E2BIG). It counts what they take."""
    s = tree.store
    f = tree["/pub/alice_file"]

    async def fill(tr):  # type: ignore[no-untyped-def]
        ino = await inodes.load(tr, f)
        for i in range(4642):  # 14 bytes each as stored (9 of name): 64,988
            ino.xattrs.add(name=b"user.%04x" % i)
        inodes.store(tr, ino)

    await s.db.run(fill)
    with pytest.raises(FS3Error) as e:  # 41,778 + 609 bytes of names and values
        await s.setxattr(ALICE, f, b"user.more", b"v" * 600)
    assert e.value.code == StatusCode.RESOURCE_EXHAUSTED
    await s.setxattr(ALICE, f, b"user.more", b"v" * 100)  # what still fits
    raw = await s.db.run(lambda tr: tr.get(schema.inode_key(f)), read_only=True)
    assert len(raw) <= 66_000
    req = m.SetattrReq(inode_id=f, uid=1000, size=1 << 40, fields=m.SETATTR_UID | m.SETATTR_SIZE)
    ino = await s.setattr(ROOT, f, req)
    assert (ino.uid, ino.size) == (1000, 1 << 40)


async def test_xattrs(tree: Tree) -> None:
    s = tree.store
    f = tree["/pub/alice_file"]
    await s.setxattr(ALICE, f, b"user.a", b"1")
    await s.setxattr(ALICE, f, b"user.b", b"\0binary")
    await s.setxattr(ALICE, f, b"user.a", b"2", 2)
    assert await s.getxattr(BOB, f, b"user.a") == b"2"
    assert sorted(await s.listxattr(ALICE, f)) == [b"user.a", b"user.b"]
    await s.removexattr(ALICE, f, b"user.a")
    assert await s.listxattr(ALICE, f) == [b"user.b"]
    assert not (await s.stat(f)).xattrs  # never in stat replies
    # names are listed for anyone who reaches the file (as on Linux); values need read permission
    private = tree["/grp/f"]
    await s.setxattr(ROOT, private, b"user.k", b"v")
    assert await s.listxattr(BOB, private) == [b"user.k"]
    with pytest.raises(FS3Error) as e:
        await s.getxattr(BOB, private, b"user.k")
    assert e.value.code == StatusCode.PERMISSION_DENIED
    await s.setxattr(ROOT, tree["/pub"], b"user.dir", b"x")
    assert await s.getxattr(ROOT, tree["/pub"], b"user.dir") == b"x"
    assert (await s.stat(tree["/pub"])).nlink >= 2


async def test_special_files(tree: Tree) -> None:
    s = tree.store
    fifo = await s.mknod(ALICE, tree["/pub"], b"fifo", 0o010644)
    dev = await s.mknod(ROOT, tree["/pub"], b"dev", 0o020600, rdev=0x0103)
    reg = await s.mknod(ALICE, tree["/pub"], b"reg", 0o644)
    assert (fifo.type, dev.type, dev.rdev, reg.type) == (
        m.INODE_FIFO,
        m.INODE_CHAR_DEVICE,
        0x0103,
        m.INODE_FILE,
    )
    await s.unlink(ROOT, tree["/pub"], b"fifo")
    with pytest.raises(FS3Error):
        await s.stat(fifo.id)


async def test_root_bypasses_permissions_but_not_exec_bits(tree: Tree) -> None:
    s = tree.store
    await s.create(ROOT, tree["/ro"], b"by-root", 0o644)
    await s.readdir(ROOT, tree["/noexec"])
    await s.open(ROOT, tree["/grp/f"], 2)


async def test_ids_unique_across_allocators(store: MetaStore) -> None:
    a, b = InodeIdAllocator(store.db, block_bits=4), InodeIdAllocator(store.db, block_bits=4)
    ids = await asyncio.gather(*([a.allocate() for _ in range(200)] + [b.allocate() for _ in range(200)]))
    assert len(set(ids)) == 400 and min(ids) > ROOT_ID
    assert a.blocks_reserved + b.blocks_reserved >= 400 // 16


async def test_ids_taken_at_once_run_out_with_the_block_and_allocate_waits_for_the_next(
    store: MetaStore,
) -> None:
    a = InodeIdAllocator(store.db, block_bits=4)
    first = await a.allocate()  # the first block (16 ids); taking the 9th starts the next's refill
    taken = [first]
    while (i := a.take()) != 0:
        taken.append(i)
    assert len(taken) == 16  # the block's ids, and no more: the refill has not run yet
    taken += [await a.allocate() for _ in range(40)]
    assert len(set(taken)) == len(taken) and min(taken) > ROOT_ID and a.blocks_reserved >= 4


async def test_statfs_counts_inodes(tree: Tree) -> None:
    s = tree.store
    before = (await s.statfs(100, 40)).inodes
    await s.create(ROOT, ROOT_ID, b"one-more", 0o644)
    st = await s.statfs(100, 40)
    assert st.inodes == before + 1 and st.free == 60 and st.name_max == 255


async def test_idempotent_retries_return_first_result(tree: Tree) -> None:
    s = tree.store
    idem = (77, 1)
    first = await s.create(ALICE, tree["/pub"], b"once", 0o644, 0o200, idem=idem)
    again = await s.create(ALICE, tree["/pub"], b"once", 0o644, 0o200, idem=idem)
    assert again.inode.id == first.inode.id and again.created
    with pytest.raises(FS3Error):  # a new request id is a new request
        await s.create(ALICE, tree["/pub"], b"once", 0o644, 0o200, idem=(77, 2))
    await s.unlink(ALICE, tree["/pub"], b"once", idem=(77, 3))
    await s.unlink(ALICE, tree["/pub"], b"once", idem=(77, 3))
    await s.rename(ALICE, tree["/pub"], b"alice_file", tree["/pub"], b"moved", idem=(77, 4))
    await s.rename(ALICE, tree["/pub"], b"alice_file", tree["/pub"], b"moved", idem=(77, 4))
    await s.link(ALICE, tree["/pub/alice_file"], tree["/pub"], b"l", idem=(77, 5))
    assert (await s.link(ALICE, tree["/pub/alice_file"], tree["/pub"], b"l", idem=(77, 5))).nlink == 2
    # a retried open is the same session (a second one would never be closed, and would keep an
    # unlinked file's chunks for the client's lifetime)
    f = tree["/pub/alice_file"]
    _, sid = await s.open(ALICE, f, 1, client_id=77, idem=(77, 6))
    assert (await s.open(ALICE, f, 1, client_id=77, idem=(77, 6)))[1] == sid
    assert [x.session_id for x in await s.sessions_of(f)] == [sid]
    await s.close(f, sid)
    # a retried XATTR_CREATE or remove that took effect succeeds
    await s.setxattr(ALICE, f, b"user.k", b"v", 1, idem=(77, 7))
    await s.setxattr(ALICE, f, b"user.k", b"v", 1, idem=(77, 7))
    await s.removexattr(ALICE, f, b"user.k", idem=(77, 8))
    await s.removexattr(ALICE, f, b"user.k", idem=(77, 8))
    from fs3.meta.idempotency import expire_idem

    assert await expire_idem(s.db, ttl_s=0) >= 4
    assert await expire_idem(s.db, ttl_s=0) == 0


async def test_an_unlinked_file_opens_until_the_collector_claims_it(tree: Tree) -> None:
    """A client that looked a name up just before another unlinked it (or renamed a file over it)
    opens the inode it found: that order of the two is a valid one, and the open must not fail
    (it did: ENOENT for a name that existed all along). Once the collector has claimed the file
    (found no session on it) it takes no new session: its chunks are going."""
    s = tree.store
    r = await s.create(ALICE, tree["/pub"], b"gone", 0o644, session=True, client_id=3)
    f = r.inode.id
    await s.close(f, r.session_id)
    await s.unlink(ALICE, tree["/pub"], b"gone")
    _, late = await s.open(ALICE, f, 0, client_id=4)
    await s.collector.collect_once()
    assert (await s.stat(f)).nlink == 0  # the late session keeps it
    await s.close(f, late)
    removing, release = asyncio.Event(), asyncio.Event()

    class SlowRemoval(NoStorage):
        async def remove(self, layout: m.Layout, inode_id: int) -> None:
            removing.set()
            await release.wait()

    s.chunks = SlowRemoval()
    collecting = asyncio.create_task(s.collector.collect_once())
    await removing.wait()  # claimed, its chunks being removed
    with pytest.raises(FS3Error) as e:
        await s.open(ALICE, f, 0, client_id=4)
    assert e.value.code == StatusCode.NOT_FOUND
    release.set()
    await collecting
    with pytest.raises(FS3Error) as e:
        await s.stat(f)
    assert e.value.code == StatusCode.NOT_FOUND


async def test_an_unlinked_file_is_claimed_only_after_the_grace(tree: Tree) -> None:
    """meta's gc_grace_s: the collector leaves an unlinked file alone that long after its unlink,
    so an open whose lookup came just before still opens it (the lookup-then-open window of a
    client is milliseconds; a claim inside it made the open fail)."""
    s = tree.store
    s.collector.grace_s = 0.5
    r = await s.create(ALICE, tree["/pub"], b"young", 0o644, session=True, client_id=3)
    f = r.inode.id
    await s.close(f, r.session_id)
    await s.unlink(ALICE, tree["/pub"], b"young")
    assert await s.collector.collect_once() == 0
    _, late = await s.open(ALICE, f, 0, client_id=4)  # not claimed: opens
    await s.close(f, late)
    await asyncio.sleep(0.6)
    assert await s.collector.collect_once() == 1
    with pytest.raises(FS3Error) as e:
        await s.stat(f)
    assert e.value.code == StatusCode.NOT_FOUND
    # an entry another meta server stamped ahead of this one's clock: within the skew meta allows
    # for, it waits (rather than being claimed at once); far beyond it, it does not wait for ever
    for ahead_s, collected in ((10.0, 0), (3600.0, 1)):
        r = await s.create(ALICE, tree["/pub"], b"skewed", 0o644, session=True, client_id=3)
        await s.close(r.inode.id, r.session_id)
        await s.unlink(ALICE, tree["/pub"], b"skewed")
        key = schema.gc_key(r.inode.id)

        async def restamp(tr, key=key, ahead_s=ahead_s) -> None:  # type: ignore[no-untyped-def]
            entry = m.GcEntry.FromString(await tr.get(key))
            entry.queued_ns += int(ahead_s * 1e9)
            tr.set(key, entry.SerializeToString())

        await s.db.run(restamp)
        assert await s.collector.collect_once() == collected
        if not collected:

            async def drop(tr, key=key) -> None:  # type: ignore[no-untyped-def]
                tr.clear(key)  # (no later round here)

            await s.db.run(drop)


async def test_unlinked_open_file_survives_until_last_close(tree: Tree) -> None:
    s = tree.store
    r = await s.create(ALICE, tree["/pub"], b"open", 0o644, session=True, client_id=3)
    f = r.inode.id
    _, reader = await s.open(ALICE, f, 0, client_id=4)
    await s.unlink(ALICE, tree["/pub"], b"open")
    await s.collector.collect_once()
    assert (await s.stat(f)).nlink == 0
    assert (await s.sync(f, r.session_id, 10, True)).size == 10  # still writable
    await s.close(f, r.session_id, 20, True)
    await s.collector.collect_once()
    assert (await s.stat(f)).size == 20  # the reader still holds it
    await s.close(f, reader)
    await s.collector.collect_once()
    with pytest.raises(FS3Error):
        await s.stat(f)


async def test_recursive_rmdir_collects_tree(tree: Tree) -> None:
    s = tree.store
    before = (await s.statfs(0, 0)).inodes
    top = await s.mkdir(ROOT, ROOT_ID, b"top", 0o755)
    for i in range(3):
        d = await s.mkdir(ROOT, top.id, f"d{i}".encode(), 0o755)
        for j in range(150):
            await s.create(ROOT, d.id, f"f{j}".encode(), 0o644)
        await s.symlink(ROOT, d.id, b"s", b"x")
    await s.rmdir(ROOT, ROOT_ID, b"top", recursive=True)
    with pytest.raises(FS3Error):
        await s.lookup(ROOT, ROOT_ID, b"top")
    while await s.collector.collect_once():
        pass
    assert (await s.statfs(0, 0)).inodes == before

    async def leftovers(tr):
        return await tr.get_range(schema.GCQU, schema.IDEM)

    assert await s.db.run(leftovers, read_only=True) == []


async def test_nothing_moves_into_a_recursively_removed_tree(tree: Tree) -> None:
    """After rmdir -r, a subdirectory still looks alive by its id until the collector gets to it
    (a process's cwd, another client's cached dentry): a rename into it would have the collector
    remove what moved in. It fails with ENOENT, as on a local file system."""
    s = tree.store
    top = await s.mkdir(ROOT, ROOT_ID, b"doomed", 0o755)
    sub = await s.mkdir(ROOT, top.id, b"sub", 0o755)
    deep = await s.mkdir(ROOT, sub.id, b"deep", 0o755)
    await s.create(ROOT, ROOT_ID, b"keep-file", 0o644)
    await s.mkdir(ROOT, ROOT_ID, b"keep-dir", 0o755)
    await s.rmdir(ROOT, ROOT_ID, b"doomed", recursive=True)
    for name in (b"keep-file", b"keep-dir"):
        for into in (sub.id, deep.id):
            with pytest.raises(FS3Error) as e:
                await s.rename(ROOT, ROOT_ID, name, into, name)
            assert e.value.code == StatusCode.NOT_FOUND
    while await s.collector.collect_once():
        pass
    assert (await s.lookup(ROOT, ROOT_ID, b"keep-file")).type == m.INODE_FILE
    assert (await s.lookup(ROOT, ROOT_ID, b"keep-dir")).type == m.INODE_DIRECTORY


async def test_prune_sessions(tree: Tree) -> None:
    s = tree.store
    await s.open(ALICE, tree["/pub/alice_file"], 0, client_id=5)
    await s.open(ALICE, tree["/pub/alice_file"], 0, client_id=6)
    assert await s.prune_sessions(client_id=5) == 1
    assert [x.client_id for x in await s.sessions_of(tree["/pub/alice_file"])] == [6]


async def test_sessions_expire_unless_their_client_is_live(tree: Tree) -> None:
    s = tree.store
    f = tree["/pub/alice_file"]
    await s.open(ALICE, f, 0, client_id=5)
    await s.open(ALICE, f, 0, client_id=6)

    async def live() -> frozenset[int]:
        return frozenset({6})

    s.collector.session_timeout_s = 1e-9
    s.collector.live_clients = live
    assert await s.collector.expire_sessions() == 1
    assert [x.client_id for x in await s.sessions_of(f)] == [6]

    async def unknown() -> None:
        return None

    s.collector.live_clients = unknown
    assert await s.collector.expire_sessions() == 0


async def test_recursive_rmdir_needs_what_rm_r_needs(tree: Tree) -> None:
    s = tree.store
    top = await s.mkdir(ALICE, tree["/pub"], b"tree", 0o755)
    sub = await s.mkdir(ALICE, top.id, b"sub", 0o755)
    await s.create(ALICE, sub.id, b"f", 0o644)
    locked = await s.mkdir(ROOT, sub.id, b"roots", 0o755)
    await s.create(ROOT, locked.id, b"g", 0o644)
    with pytest.raises(FS3Error) as e:
        await s.rmdir(ALICE, tree["/pub"], b"tree", recursive=True)
    assert e.value.errno == 13  # EACCES: alice cannot empty root's directory
    await s.rmdir(ROOT, sub.id, b"roots", recursive=True)
    await s.rmdir(ALICE, tree["/pub"], b"tree", recursive=True)
    with pytest.raises(FS3Error):
        await s.lookup(ALICE, tree["/pub"], b"tree")


async def test_retried_close_returns_first_result(tree: Tree) -> None:
    s = tree.store
    r = await s.create(ALICE, tree["/pub"], b"c", 0o644, session=True)
    first = await s.close(r.inode.id, r.session_id, 42, True, idem=(8, 1))
    again = await s.close(r.inode.id, r.session_id, 42, True, idem=(8, 1))
    assert first.size == again.size == 42
    with pytest.raises(FS3Error):
        await s.close(r.inode.id, r.session_id, 42, True, idem=(8, 2))


async def test_reads_and_writes_leave_no_reference_cycles(tree: Tree) -> None:
    """Meta's operations, failing ones included, leave nothing for the cyclic collector, which a
    daemon runs seldom (fs3.daemon.settle_gc): a transaction that read through its snapshot view
    was a cycle (with its writes), and so was a BatchStat's error for a missing inode, kept in the
    list its catching frame held."""
    s = tree.store
    f = tree["/pub/alice_file"]
    await s.batch_stat([f, 999_999])  # every path warm
    with cycles_kept() as found:
        await s.stat(f)
        await s.lookup(ALICE, tree["/pub"], b"alice_file")
        res = await s.batch_stat([f, 999_999])
        assert isinstance(res[1], FS3Error)
        del res
        await s.readdir(ROOT, tree["/pub"], b"", 64, with_inodes=True)
        made = await s.create(ALICE, tree["/pub"], b"cyc", 0o644)
        await s.unlink(ALICE, tree["/pub"], b"cyc")
        del made
    assert frames(found) == []
    assert found == [], sorted({type(o).__name__ for o in found})


async def test_two_clients_using_one_request_id_each_get_their_own_outcome(tree: Tree) -> None:
    """Clients draw request ids from their clocks, so two may send the same one: records are kept
    per client, or one client's create would be answered with the other's inode and never done."""
    s = tree.store
    a = await s.create(ALICE, tree["/pub"], b"from-a", 0o644, 0o200, idem=(81, 5))
    b = await s.create(ALICE, tree["/pub"], b"from-b", 0o644, 0o200, idem=(82, 5))
    assert a.inode.id != b.inode.id
    assert (await s.lookup(ALICE, tree["/pub"], b"from-a")).id == a.inode.id
    assert (await s.lookup(ALICE, tree["/pub"], b"from-b")).id == b.inode.id
    await s.unlink(ALICE, tree["/pub"], b"from-a", idem=(81, 6))
    await s.unlink(ALICE, tree["/pub"], b"from-b", idem=(82, 6))
    for name in (b"from-a", b"from-b"):
        with pytest.raises(FS3Error) as e:
            await s.lookup(ALICE, tree["/pub"], name)
        assert e.value.code == StatusCode.NOT_FOUND


async def test_a_sticky_directorys_owner_may_remove_and_rename_others_entries(tree: Tree) -> None:
    """In a sticky directory the entry's owner, the directory's owner and root may remove or
    rename an entry; anyone else gets EPERM (only that last case was tested)."""
    s = tree.store
    carol = Credentials(1002, 1002)
    d = (await s.mkdir(ALICE, tree["/pub"], b"alices_tmp", 0o1777)).id
    for name in (b"b1", b"b2", b"b3"):
        await s.create(BOB, d, name, 0o644)
    for attempt in (s.unlink(carol, d, b"b1"), s.rename(carol, d, b"b2", d, b"carols")):
        with pytest.raises(FS3Error) as e:
            await attempt
        assert e.value.code == StatusCode.META_NOT_PERMITTED
    await s.unlink(ALICE, d, b"b1")  # the directory's owner
    await s.rename(ALICE, d, b"b2", d, b"alices")
    await s.unlink(BOB, d, b"b3")  # the entry's owner
    entries, _, _ = await s.readdir(ROOT, d)
    assert [e.name for e in entries] == [b"alices"]


async def test_names_of_exactly_255_bytes_are_names(tree: Tree) -> None:
    """NAME_MAX is 255: a name of 255 bytes is valid everywhere (only 256 was tested)."""
    s = tree.store
    name, other = b"n" * 255, b"m" * 255
    await s.create(ALICE, tree["/pub"], name, 0o644)
    assert (await s.lookup(ALICE, tree["/pub"], name)).type == m.INODE_FILE
    await s.rename(ALICE, tree["/pub"], name, tree["/pub"], other)
    d = await s.mkdir(ALICE, tree["/pub"], name, 0o755)
    assert (await s.lookup(ALICE, tree["/pub"], name)).id == d.id
    with pytest.raises(FS3Error) as e:
        await s.create(ALICE, tree["/pub"], name + b"x", 0o644)
    assert e.value.code == StatusCode.META_NAME_TOO_LONG


async def test_readdir_says_more_only_when_there_is_more(tree: Tree) -> None:
    """A page that ends at the directory's last entry says there is no more (an exact fit took an
    extra, empty round trip)."""
    s = tree.store
    d = (await s.mkdir(ROOT, ROOT_ID, b"exact", 0o755)).id
    for i in range(8):
        await s.create(ROOT, d, f"e{i}".encode(), 0o644)
    entries, _, more = await s.readdir(ROOT, d, b"", 8)
    assert len(entries) == 8 and more is False
    await s.create(ROOT, d, b"e8", 0o644)
    entries, _, more = await s.readdir(ROOT, d, b"", 8)
    assert len(entries) == 8 and more is True


def test_root_may_execute_only_a_file_someone_may_execute() -> None:
    from fs3.meta.permissions import X_OK, allowed

    for mode, ok in ((0o644, False), (0o744, True), (0o654, True), (0o645, True)):
        f = m.Inode(id=9, type=m.INODE_FILE, mode=mode, uid=1000, gid=1000)
        assert allowed(f, ROOT, X_OK) is ok, oct(mode)
    d = m.Inode(id=10, type=m.INODE_DIRECTORY, mode=0o600, uid=1000, gid=1000)
    assert allowed(d, ROOT, X_OK)  # a directory's search permission: root always has it
