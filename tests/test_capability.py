"""Capabilities (fs3.capability): meta seals them, storage verifies them, clients cache and renew them."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
import time

import pytest

from fs3 import capability
from fs3.capability import (
    CLOCK_SKEW_S,
    MAX_CHAINS,
    READ,
    RENEW_BEFORE_S,
    RIGHTS,
    WRITE,
    CapabilityCache,
    CapabilityIssuer,
    CapabilityVerifier,
    Grant,
)
from fs3.errors import FS3Error, StatusCode
from fs3.proto import meta_pb2

pytestmark = pytest.mark.timeout(30)

SECRET = b"0123456789abcdef0123456789abcdef"
T0 = 1_700_000_000.0
CHUNK = 1 << 20
LAYOUT = meta_pb2.Layout(chunk_size=CHUNK, chains=[11, 12, 13])
CHAIN = 12  # one of LAYOUT's
# what the format's fields take (see the module docstring): the head, 4 bytes a chain, the MAC
HEAD_BYTES, MAC_BYTES = 26, 16


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def refused(
    verifier: CapabilityVerifier,
    cap: bytes,
    inode_id: int,
    right: int,
    chain_id: int = CHAIN,
    chunk_size: int = 0,
) -> str:
    with pytest.raises(FS3Error) as e:
        verifier.check(cap, inode_id, right, chain_id, chunk_size)
    assert e.value.code == StatusCode.STORAGE_CAPABILITY
    return e.value.message


def malformed(cap: bytes) -> None:
    with pytest.raises(FS3Error) as e:
        capability.parse(cap)
    assert e.value.code == StatusCode.STORAGE_CAPABILITY and "malformed" in e.value.message


def resealed(cap: bytes, secret: bytes = SECRET) -> bytes:
    """``cap`` with its MAC made again, as meta would have (to build well-sealed odd ones)."""
    body = cap[:-MAC_BYTES]
    return body + hmac.new(capability.capability_key(secret), body, hashlib.sha256).digest()[:MAC_BYTES]


def test_round_trip_grants_only_the_rights_and_inode_issued():
    issuer = CapabilityIssuer(SECRET)
    verifier = CapabilityVerifier(SECRET)
    read, write, both = (issuer.issue(7, r, LAYOUT) for r in (READ, WRITE, RIGHTS))
    assert len(read) == HEAD_BYTES + 4 * len(LAYOUT.chains) + MAC_BYTES
    verifier.check(read, 7, READ, CHAIN)
    verifier.check(write, 7, WRITE, CHAIN, CHUNK)
    verifier.check(both, 7, READ, CHAIN)
    verifier.check(both, 7, WRITE, CHAIN, CHUNK)
    assert "does not grant write" in refused(verifier, read, 7, WRITE)
    assert "does not grant read" in refused(verifier, write, 7, READ)
    assert "not 0x8" in refused(verifier, both, 8, READ)
    # the same refusals once the capability is cached as verified
    assert "does not grant write" in refused(verifier, read, 7, WRITE)
    grant = capability.parse(both)
    assert isinstance(grant, Grant)
    assert (grant.inode_id, grant.rights, grant.ttl_s) == (7, RIGHTS, int(capability.DEFAULT_TTL_S))
    assert grant.chunk_size == CHUNK and grant.chains == {11, 12, 13}


def test_a_capability_holds_only_for_its_files_chains_and_chunk_size():
    issuer = CapabilityIssuer(SECRET)
    verifier = CapabilityVerifier(SECRET)
    cap = issuer.issue(7, RIGHTS, LAYOUT)
    for chain_id in LAYOUT.chains:
        verifier.check(cap, 7, READ, chain_id)
        verifier.check(cap, 7, WRITE, chain_id, CHUNK)
    for chain_id in (0, 10, 14, 1 << 31):
        assert "chain" in refused(verifier, cap, 7, READ, chain_id)
        assert "chain" in refused(verifier, cap, 7, WRITE, chain_id, CHUNK)
    for chunk_size in (CHUNK // 2, CHUNK * 2, 64 << 10):
        assert f"not {chunk_size}" in refused(verifier, cap, 7, WRITE, CHAIN, chunk_size)
    # a read names no chunk size (0): not checked
    verifier.check(cap, 7, READ, CHAIN, 0)
    # the same, by a verifier that sees the capability first with a wrong chain (nothing cached yet)
    fresh = CapabilityVerifier(SECRET)
    assert "chain" in refused(fresh, cap, 7, WRITE, 14, CHUNK)
    assert "not 65536" in refused(fresh, cap, 7, WRITE, CHAIN, 64 << 10)
    # a file without chains (no chain table yet) has nothing storage may serve
    empty = issuer.issue(7, RIGHTS, meta_pb2.Layout(chunk_size=CHUNK))
    assert capability.parse(empty).chains == frozenset()
    assert "chain" in refused(verifier, empty, 7, READ, CHAIN)


def test_tampered_or_foreign_capabilities_are_refused():
    issuer = CapabilityIssuer(SECRET)
    cap = issuer.issue(0x1234, READ, LAYOUT)
    verifier = CapabilityVerifier(SECRET)
    for i in range(len(cap)):
        forged = bytearray(cap)
        forged[i] ^= 0x01
        refused(verifier, bytes(forged), 0x1234, READ)
    # more rights or another inode under the original MAC
    forged = bytearray(cap)
    forged[1] = RIGHTS
    assert "not issued" in refused(verifier, bytes(forged), 0x1234, WRITE)
    assert "not issued" in refused(CapabilityVerifier(b"another secret, 32 bytes long..."), cap, 0x1234, READ)
    assert "needs a capability" in refused(verifier, b"", 0x1234, READ)
    assert "malformed" in refused(verifier, cap[:-1], 0x1234, READ)
    assert "malformed" in refused(verifier, bytes([9]) + cap[1:], 0x1234, READ)
    verifier.check(cap, 0x1234, READ, CHAIN)  # the genuine one still passes


def test_a_tampered_layout_is_refused_even_after_the_genuine_one_was_verified():
    """The verifier caches what it verified by the capability's bytes: another chain list, or
    another chunk size, under the genuine MAC is another capability, checked (and refused) anew."""
    issuer = CapabilityIssuer(SECRET)
    verifier = CapabilityVerifier(SECRET)
    cap = issuer.issue(5, WRITE, LAYOUT)
    verifier.check(cap, 5, WRITE, CHAIN, CHUNK)  # cached as verified
    head, chains, mac = cap[:HEAD_BYTES], cap[HEAD_BYTES:-MAC_BYTES], cap[-MAC_BYTES:]
    # one of its chains swapped for another
    swapped = head + struct.pack("<I", 99) + chains[4:] + mac
    assert capability.parse(swapped).chains == {99, 12, 13}
    assert "not issued" in refused(verifier, swapped, 5, WRITE, 99, CHUNK)
    # a chain added (the count says so too)
    longer = head[:-2] + struct.pack("<H", 4) + chains + struct.pack("<I", 99) + mac
    assert capability.parse(longer).chains == {11, 12, 13, 99}
    assert "not issued" in refused(verifier, longer, 5, WRITE, 99, CHUNK)
    # another chunk size (log2 in byte 2)
    bigger = cap[:2] + bytes([cap[2] + 1]) + cap[3:]
    assert capability.parse(bigger).chunk_size == 2 * CHUNK
    assert "not issued" in refused(verifier, bigger, 5, WRITE, CHAIN, 2 * CHUNK)
    verifier.check(cap, 5, WRITE, CHAIN, CHUNK)  # the genuine one still passes


def test_parse_refuses_malformed_lengths_and_chain_counts():
    cap = CapabilityIssuer(SECRET).issue(3, READ, LAYOUT)
    assert capability.parse(cap).chains == {11, 12, 13}
    for n in range(HEAD_BYTES + MAC_BYTES):
        malformed(cap[:n])  # shorter than a capability without chains
    malformed(cap[:-1])
    malformed(cap + b"\0")
    malformed(cap[: -MAC_BYTES - 4] + cap[-MAC_BYTES:])  # a chain fewer than the count says
    malformed(cap[:-MAC_BYTES] + b"\0\0\0\0" + cap[-MAC_BYTES:])  # a chain more
    count_at = HEAD_BYTES - 2
    for count in (0, 2, 4, 0xFFFF):
        malformed(cap[:count_at] + struct.pack("<H", count) + cap[count_at + 2 :])
    malformed(bytes([1]) + cap[1:])  # version 1 (no layout)
    malformed(cap[:2] + bytes([64]) + cap[3:])  # a chunk size of 2**64
    # well-formed with none or many chains
    none = CapabilityIssuer(SECRET).issue(3, READ, meta_pb2.Layout(chunk_size=CHUNK))
    assert len(none) == HEAD_BYTES + MAC_BYTES and capability.parse(none).chains == frozenset()
    many = CapabilityIssuer(SECRET).issue(
        3, READ, meta_pb2.Layout(chunk_size=CHUNK, chains=range(MAX_CHAINS))
    )
    assert capability.parse(many).chains == frozenset(range(MAX_CHAINS))
    # malformed ones are refused before their MAC is looked at, sealed or not
    verifier = CapabilityVerifier(SECRET)
    short_count = resealed(cap[:count_at] + struct.pack("<H", 2) + cap[count_at + 2 :])
    assert "malformed" in refused(verifier, short_count, 3, READ, 11)


def test_expiry_allows_the_clock_skew_and_no_more():
    meta_clock, storage_clock = Clock(), Clock()
    cap = CapabilityIssuer(SECRET, ttl_s=100, clock=meta_clock).issue(5, WRITE, LAYOUT)
    verifier = CapabilityVerifier(SECRET, clock=storage_clock)
    storage_clock.now = T0 + 100 + CLOCK_SKEW_S - 1  # storage's clock a little ahead of meta's
    verifier.check(cap, 5, WRITE, CHAIN, CHUNK)
    storage_clock.now = T0 + 100 + CLOCK_SKEW_S + 1
    assert "expired" in refused(verifier, cap, 5, WRITE)  # cached as valid before: still checked
    fresh = CapabilityVerifier(SECRET, clock=storage_clock)
    assert "expired" in refused(fresh, cap, 5, WRITE)


def test_issuer_rejects_bad_rights_layouts_and_ttls():
    for ttl_s in (0, 0.5, -1, 1 << 32):
        with pytest.raises(ValueError):
            CapabilityIssuer(SECRET, ttl_s=ttl_s)
    assert capability.parse(CapabilityIssuer(SECRET, ttl_s=1).issue(1, READ, LAYOUT)).ttl_s == 1
    issuer = CapabilityIssuer(SECRET)
    for rights in (0, 4, RIGHTS | 8):
        with pytest.raises(ValueError):
            issuer.issue(1, rights, LAYOUT)
    for layout in (
        meta_pb2.Layout(chunk_size=0, chains=[1]),
        meta_pb2.Layout(chunk_size=3 << 16, chains=[1]),
        meta_pb2.Layout(chunk_size=CHUNK, chains=range(MAX_CHAINS + 1)),
    ):
        with pytest.raises(ValueError):
            issuer.issue(1, READ, layout)


def test_verifier_cache_is_bounded():
    issuer = CapabilityIssuer(SECRET)
    verifier = CapabilityVerifier(SECRET, max_entries=4)
    caps = [issuer.issue(i, READ, LAYOUT) for i in range(10)]
    for i, cap in enumerate(caps):
        verifier.check(cap, i, READ, CHAIN)
        assert len(verifier._valid) <= 4
    for i, cap in enumerate(caps):
        verifier.check(cap, i, READ, CHAIN)


async def test_cache_serves_fresh_capabilities_and_renews_the_rest():
    clock = Clock()
    issuer = CapabilityIssuer(SECRET, ttl_s=600, clock=clock)
    asked: list[tuple[int, int]] = []

    async def renew(inode_id: int, rights: int) -> bytes:
        asked.append((inode_id, rights))
        return issuer.issue(inode_id, rights, LAYOUT)

    cache = CapabilityCache(renew, clock=clock)
    assert cache.now(3, READ) is None
    both = issuer.issue(3, RIGHTS, LAYOUT)
    cache.put(3, both)
    assert cache.now(3, READ) == both and cache.now(3, WRITE) == both
    assert await cache.get(3, WRITE) == both and asked == []
    clock.now = T0 + 600 - RENEW_BEFORE_S + 1  # about to expire: not used any more
    assert cache.now(3, READ) is None
    read = await cache.get(3, READ)
    grant = capability.parse(read)
    assert asked == [(3, READ)] and (grant.inode_id, grant.rights) == (3, READ)
    assert cache.now(3, READ) == read
    with pytest.raises(FS3Error) as e:
        cache.put(4, read)  # meta's capability for another file
    assert e.value.code == StatusCode.INTERNAL


async def test_cache_renews_short_lived_capabilities_at_half_their_lifetime():
    clock = Clock(5.0)  # the client's clock, unrelated to meta's

    async def renew(inode_id: int, rights: int) -> bytes:
        raise AssertionError("not asked in this test")

    for ttl_s in (1, 10, 2 * int(RENEW_BEFORE_S) - 2):
        cache = CapabilityCache(renew, clock=clock)
        cap = CapabilityIssuer(SECRET, ttl_s=ttl_s).issue(3, READ, LAYOUT)
        put_at = clock.now
        cache.put(3, cap)
        clock.now = put_at + ttl_s / 2 - 0.01
        assert cache.now(3, READ) == cap, ttl_s
        clock.now = put_at + ttl_s / 2 + 0.01
        assert cache.now(3, READ) is None, ttl_s
    # a long-lived one is used until RENEW_BEFORE_S before its end
    cache = CapabilityCache(renew, clock=clock)
    cap = CapabilityIssuer(SECRET, ttl_s=600).issue(3, READ, LAYOUT)
    put_at = clock.now
    cache.put(3, cap)
    clock.now = put_at + 600 - RENEW_BEFORE_S - 0.01
    assert cache.now(3, READ) == cap
    clock.now = put_at + 600 - RENEW_BEFORE_S + 0.01
    assert cache.now(3, READ) is None


async def test_cache_times_a_capability_by_its_own_clock_not_metas():
    """A capability whose ``expires`` is past by this client's wall clock (meta's clock runs
    behind) is used for its lifetime from when it came: only storage judges expiry by the wall."""
    renewed: list[int] = []

    async def renew(inode_id: int, rights: int) -> bytes:
        renewed.append(inode_id)
        return b""

    behind = CapabilityIssuer(SECRET, ttl_s=600, clock=lambda: time.time() - 3600)
    cap = behind.issue(3, RIGHTS, LAYOUT)
    assert capability.parse(cap).expires < time.time()
    cache = CapabilityCache(renew)  # the default clock
    cache.put(3, cap)
    assert cache.now(3, WRITE) == cap
    assert await cache.get(3, READ) == cap and renewed == []
    # and one that meta's clock ahead dates far in the future still ends after its lifetime
    clock = Clock(0.0)
    ahead = CapabilityIssuer(SECRET, ttl_s=100, clock=lambda: time.time() + 86400)
    cache = CapabilityCache(renew, clock=clock)
    cap = ahead.issue(3, READ, LAYOUT)
    cache.put(3, cap)
    clock.now = 51.0
    assert cache.now(3, READ) is None


async def test_cache_renews_once_for_concurrent_callers_and_forgets_failures():
    issuer = CapabilityIssuer(SECRET)
    gate = asyncio.Event()
    calls = 0
    fail = True

    async def renew(inode_id: int, rights: int) -> bytes:
        nonlocal calls
        calls += 1
        await gate.wait()
        if fail:
            raise FS3Error(StatusCode.PERMISSION_DENIED, "no longer yours")
        return issuer.issue(inode_id, rights, LAYOUT)

    cache = CapabilityCache(renew)
    waiters = [asyncio.create_task(cache.get(9, WRITE)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert calls == 1
    assert all(isinstance(o, FS3Error) and o.code == StatusCode.PERMISSION_DENIED for o in outcomes)
    fail = False
    waiters = [asyncio.create_task(cache.get(9, WRITE)) for _ in range(5)]
    caps = await asyncio.gather(*waiters)
    assert calls == 2 and len(set(caps)) == 1  # a refusal is not cached: asked again, once


async def test_drop_forgets_only_the_refused_capability():
    clock = Clock()
    issuer = CapabilityIssuer(SECRET, clock=clock)
    renewed: list[bytes] = []

    async def renew(inode_id: int, rights: int) -> bytes:
        renewed.append(issuer.issue(inode_id, rights, LAYOUT))
        return renewed[-1]

    cache = CapabilityCache(renew, clock=clock)
    old = issuer.issue(2, WRITE, LAYOUT)
    cache.put(2, old)
    cache.drop(2, b"some other capability")
    assert cache.now(2, WRITE) == old
    cache.drop(2, old)
    assert cache.now(2, WRITE) is None
    clock.now += 10
    new = await cache.get(2, WRITE)
    assert renewed == [new]
    cache.drop(2, old)  # a late refusal of the old one leaves the new one alone
    assert cache.now(2, WRITE) == new
