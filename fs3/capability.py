"""Capabilities: what lets a client that does not hold the cluster secret read or write a file's chunks.

A *user connection* (a client that authenticated with its user token, not the cluster secret; see
:mod:`fs3.net.auth`) may only read and write chunks of files meta allowed it to open. Meta checks
the open as usual and hands the client a capability: the file's inode id, the rights the open
checked (:data:`READ`, :data:`WRITE`), the file's chunk size and chains (its layout), an expiry,
all sealed with an HMAC under a key derived from the cluster secret, which meta and storage hold
and the client does not. Storage verifies the seal, the inode id of the chunk, that its chain is
one of the file's (and, for a write, the chunk size is the file's), and the right of the call, and
answers STORAGE_CAPABILITY otherwise. (Binding the layout keeps a client from writing chunks of its
file where meta's truncates and removals never look: space nobody could reclaim.)

Layout (42 + 4 × chains bytes)::

    version (1) | rights (1) | log2 chunk size (1) | 0 (1) | lifetime (4, seconds)
    | inode id (8) | expires (8, unix seconds) | chain count (2) | chain ids (4 each)
    | mac (16)

all little-endian, with ``mac`` the first 16 bytes of HMAC-SHA256(key, everything before it). A
capability is a bearer credential for one file: whoever holds it may use it until it expires
(``capability_ttl_s``, 10 minutes by default), which also bounds how long a client keeps access it
lost (a chmod, an unlink): the client then asks meta for a new one (:class:`CapabilityCache`, which
times the lifetime by its own clock from when it got one), and meta checks the caller's permission
again. Storage accepts one up to :data:`CLOCK_SKEW_S` past its expiry (meta's and storage's clocks
may differ by that much).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from fs3.errors import FS3Error, StatusCode

VERSION = 2
READ = 1
WRITE = 2
RIGHTS = READ | WRITE
DEFAULT_TTL_S = 600.0
# storage accepts a capability this long past its expiry (meta's and storage's clocks may differ)
CLOCK_SKEW_S = 60.0
# a client asks for a new one when less than this (or half its lifetime) is left
RENEW_BEFORE_S = 60.0
MAX_CHAINS = 1024  # meta.layout.MAX_STRIPE

_HEAD = struct.Struct("<BBBxIQQH")
_CHAIN = struct.Struct("<I")
_MAC_BYTES = 16
_LABEL = b"fs3-capability-v2\x00"


class Layout(Protocol):
    """What a capability takes of a file's layout (a ``meta_pb2.Layout``)."""

    chunk_size: int
    chains: Sequence[int]


class Grant(NamedTuple):
    """What a capability says (:func:`parse`)."""

    inode_id: int
    rights: int
    expires: int  # unix seconds, by meta's clock
    ttl_s: int  # its lifetime when issued
    chunk_size: int
    chains: frozenset[int]


def capability_key(secret: bytes) -> bytes:
    """The key that seals capabilities, derived from the cluster secret."""
    return hmac.new(secret, _LABEL, hashlib.sha256).digest()


def parse(cap: bytes) -> Grant:
    """What ``cap`` says, unverified (what a client reads of its own)."""
    if len(cap) < _HEAD.size + _MAC_BYTES or cap[0] != VERSION:
        raise FS3Error(StatusCode.STORAGE_CAPABILITY, "malformed capability")
    _version, rights, shift, ttl_s, inode_id, expires, count = _HEAD.unpack_from(cap)
    if len(cap) != _HEAD.size + count * _CHAIN.size + _MAC_BYTES or shift > 63:
        raise FS3Error(StatusCode.STORAGE_CAPABILITY, "malformed capability")
    chains = frozenset(c for (c,) in _CHAIN.iter_unpack(cap[_HEAD.size : len(cap) - _MAC_BYTES]))
    return Grant(inode_id, rights, expires, ttl_s, 1 << shift, chains)


def rights_name(rights: int) -> str:
    return {READ: "read", WRITE: "write", RIGHTS: "read and write"}.get(rights, f"rights {rights}")


class CapabilityIssuer:
    """Meta's side: seals capabilities."""

    def __init__(
        self, secret: bytes, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        if not 1 <= ttl_s < 1 << 32:
            raise ValueError("capability ttl must be at least a second")
        self._key = capability_key(secret)
        self.ttl_s = int(ttl_s)
        self._clock = clock

    def issue(self, inode_id: int, rights: int, layout: Layout) -> bytes:
        """A capability of ``rights`` on the file ``inode_id`` whose layout is ``layout``."""
        if not rights or rights & ~RIGHTS:
            raise ValueError(f"bad capability rights {rights}")
        chunk_size, chains = layout.chunk_size, layout.chains
        if chunk_size <= 0 or chunk_size & (chunk_size - 1) or len(chains) > MAX_CHAINS:
            raise ValueError(f"bad layout for a capability: chunk size {chunk_size}, {len(chains)} chains")
        head = _HEAD.pack(
            VERSION,
            rights,
            chunk_size.bit_length() - 1,
            self.ttl_s,
            inode_id,
            int(self._clock()) + self.ttl_s,
            len(chains),
        ) + b"".join(_CHAIN.pack(c) for c in chains)
        return head + hmac.new(self._key, head, hashlib.sha256).digest()[:_MAC_BYTES]


class CapabilityVerifier:
    """Storage's side: checks a call's capability, caching the ones it verified (one dict lookup
    per call after the first)."""

    def __init__(
        self, secret: bytes, *, clock: Callable[[], float] = time.time, max_entries: int = 100_000
    ) -> None:
        self._key = capability_key(secret)
        self._clock = clock
        self.max_entries = max_entries
        self._valid: dict[bytes, Grant] = {}

    def check(self, cap: bytes, inode_id: int, right: int, chain_id: int, chunk_size: int = 0) -> None:
        """Raise STORAGE_CAPABILITY unless ``cap`` is meta's, for ``inode_id``, grants ``right`` on
        chain ``chain_id`` (one of the file's) and has not expired; a write also names the file's
        ``chunk_size`` (0: not checked, as for a read)."""
        grant = self._valid.get(cap)
        if grant is None:
            if not cap:
                raise FS3Error(StatusCode.STORAGE_CAPABILITY, "this call needs a capability (open the file)")
            grant = parse(cap)
            mac = hmac.new(self._key, cap[:-_MAC_BYTES], hashlib.sha256).digest()[:_MAC_BYTES]
            if not hmac.compare_digest(mac, cap[-_MAC_BYTES:]):
                raise FS3Error(StatusCode.STORAGE_CAPABILITY, "capability not issued by this cluster")
            if len(self._valid) >= self.max_entries:
                self._valid.clear()
            self._valid[bytes(cap)] = grant
        if grant.inode_id != inode_id:
            raise FS3Error(
                StatusCode.STORAGE_CAPABILITY,
                f"capability is for inode {grant.inode_id:#x}, not {inode_id:#x}",
            )
        if not grant.rights & right:
            raise FS3Error(StatusCode.STORAGE_CAPABILITY, f"capability does not grant {rights_name(right)}")
        if chain_id not in grant.chains:
            raise FS3Error(
                StatusCode.STORAGE_CAPABILITY, f"chain {chain_id} holds no chunk of inode {inode_id:#x}"
            )
        if chunk_size and chunk_size != grant.chunk_size:
            raise FS3Error(
                StatusCode.STORAGE_CAPABILITY,
                f"inode {inode_id:#x} has chunks of {grant.chunk_size} bytes, not {chunk_size}",
            )
        if grant.expires + CLOCK_SKEW_S < self._clock():
            self._valid.pop(cap, None)
            raise FS3Error(StatusCode.STORAGE_CAPABILITY, "capability expired")


class CapabilityCache:
    """A client's capabilities, by file and right: those its opens brought (:meth:`put`), and new
    ones from ``renew(inode_id, rights)`` (meta's Capability call) when none is at hand, one is
    about to expire, or storage refused one (:meth:`drop`). A capability's lifetime is timed by
    this client's clock from when it came, so clocks that differ from meta's do not matter here."""

    def __init__(
        self,
        renew: Callable[[int, int], Awaitable[bytes]],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        self._renew = renew
        self._clock = clock
        self.max_entries = max_entries
        # (inode id, rights) -> (capability, when to ask for a new one by our clock)
        self._caps: dict[tuple[int, int], tuple[bytes, float]] = {}
        self._renewing: dict[tuple[int, int], asyncio.Future[bytes]] = {}

    def put(self, inode_id: int, cap: bytes) -> None:
        """Keep ``cap`` (as meta sent it, just now) for the file and rights it names."""
        grant = parse(cap)
        if grant.inode_id != inode_id:
            raise FS3Error(
                StatusCode.INTERNAL, f"meta sent a capability for {grant.inode_id:#x}, not {inode_id:#x}"
            )
        if len(self._caps) >= self.max_entries:
            self._caps.clear()
        renew_at = self._clock() + grant.ttl_s - min(RENEW_BEFORE_S, grant.ttl_s / 2)
        self._caps[(inode_id, grant.rights)] = (bytes(cap), renew_at)

    def now(self, inode_id: int, right: int) -> bytes | None:
        """A capability granting ``right`` that is not about to expire, if one is at hand."""
        now = self._clock()
        for key in ((inode_id, right), (inode_id, RIGHTS)):
            hit = self._caps.get(key)
            if hit is not None and hit[1] > now:
                return hit[0]
        return None

    async def get(self, inode_id: int, right: int) -> bytes:
        """A capability granting ``right`` on ``inode_id``, from meta if none is at hand."""
        cap = self.now(inode_id, right)
        if cap is not None:
            return cap
        key = (inode_id, right)
        waiting = self._renewing.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._renewing[key] = fut
        try:
            cap = await self._renew(inode_id, right)
            self.put(inode_id, cap)
            fut.set_result(cap)
            return cap
        except BaseException as e:
            fut.set_exception(e if isinstance(e, Exception) else FS3Error(StatusCode.CANCELLED, "cancelled"))
            fut.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            self._renewing.pop(key, None)

    def drop(self, inode_id: int, cap: bytes) -> None:
        """Forget ``cap`` (storage refused it), so that the next :meth:`get` asks meta."""
        for rights in (READ, WRITE, RIGHTS):
            hit = self._caps.get((inode_id, rights))
            if hit is not None and hit[0] == cap:
                del self._caps[(inode_id, rights)]
