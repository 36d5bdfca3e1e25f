"""Capabilities: what lets a client that does not hold the cluster secret read or write a file's chunks.

A *user connection* (a client that authenticated with its user token, not the cluster secret; see
:mod:`fs3.net.auth`) may only read and write chunks of files meta allowed it to open. Meta checks
the open as usual and hands the client a capability: the file's inode id, the rights the open
checked (:data:`READ`, :data:`WRITE`), an expiry, all sealed with an HMAC under a key derived from
the cluster secret, which meta and storage hold and the client does not. Storage verifies the seal,
the inode id of the chunk and the right of the call, and answers STORAGE_CAPABILITY otherwise.

Layout (34 bytes)::

    version (1) | rights (1) | inode id (8, little-endian) | expires (8, unix seconds) | mac (16)

with ``mac`` the first 16 bytes of HMAC-SHA256(key, the 18 bytes before it). A capability is a
bearer credential for one file: whoever holds it may use it until it expires
(``capability_ttl_s``, 10 minutes by default), which also bounds how long a client keeps access it
lost (a chmod, an unlink): the client then asks meta for a new one (:class:`CapabilityCache`), and
meta checks the caller's permission again. Clocks of meta and storage must agree to within
:data:`CLOCK_SKEW_S`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
import time
from collections.abc import Awaitable, Callable

from fs3.errors import FS3Error, StatusCode

VERSION = 1
READ = 1
WRITE = 2
RIGHTS = READ | WRITE
DEFAULT_TTL_S = 600.0
# storage accepts a capability this long past its expiry (meta's and storage's clocks may differ)
CLOCK_SKEW_S = 60.0
# a client asks for a new one when less than this is left by its own clock
RENEW_BEFORE_S = 60.0

_HEAD = struct.Struct("<BBQQ")
_MAC_BYTES = 16
SIZE = _HEAD.size + _MAC_BYTES
_LABEL = b"fs3-capability-v1\x00"


def capability_key(secret: bytes) -> bytes:
    """The key that seals capabilities, derived from the cluster secret."""
    return hmac.new(secret, _LABEL, hashlib.sha256).digest()


def parse(cap: bytes) -> tuple[int, int, int]:
    """(inode id, rights, expires) of ``cap``, unverified (what a client reads of its own)."""
    if len(cap) != SIZE or cap[0] != VERSION:
        raise FS3Error(StatusCode.STORAGE_CAPABILITY, "malformed capability")
    _version, rights, inode_id, expires = _HEAD.unpack_from(cap)
    return inode_id, rights, expires


def rights_name(rights: int) -> str:
    return {READ: "read", WRITE: "write", RIGHTS: "read and write"}.get(rights, f"rights {rights}")


class CapabilityIssuer:
    """Meta's side: seals capabilities."""

    def __init__(
        self, secret: bytes, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("capability ttl must be positive")
        self._key = capability_key(secret)
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, inode_id: int, rights: int) -> bytes:
        if not rights or rights & ~RIGHTS:
            raise ValueError(f"bad capability rights {rights}")
        head = _HEAD.pack(VERSION, rights, inode_id, int(self._clock() + self.ttl_s))
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
        self._valid: dict[bytes, tuple[int, int, int]] = {}

    def check(self, cap: bytes, inode_id: int, right: int) -> None:
        """Raise STORAGE_CAPABILITY unless ``cap`` is meta's, for ``inode_id``, grants ``right``
        and has not expired."""
        known = self._valid.get(cap)
        if known is None:
            if not cap:
                raise FS3Error(StatusCode.STORAGE_CAPABILITY, "this call needs a capability (open the file)")
            if len(cap) != SIZE or cap[0] != VERSION:
                raise FS3Error(StatusCode.STORAGE_CAPABILITY, "malformed capability")
            mac = hmac.new(self._key, cap[: _HEAD.size], hashlib.sha256).digest()[:_MAC_BYTES]
            if not hmac.compare_digest(mac, cap[_HEAD.size :]):
                raise FS3Error(StatusCode.STORAGE_CAPABILITY, "capability not issued by this cluster")
            known = parse(cap)
            if len(self._valid) >= self.max_entries:
                self._valid.clear()
            self._valid[bytes(cap)] = known
        cap_inode, rights, expires = known
        if cap_inode != inode_id:
            raise FS3Error(
                StatusCode.STORAGE_CAPABILITY, f"capability is for inode {cap_inode:#x}, not {inode_id:#x}"
            )
        if not rights & right:
            raise FS3Error(StatusCode.STORAGE_CAPABILITY, f"capability does not grant {rights_name(right)}")
        if expires + CLOCK_SKEW_S < self._clock():
            self._valid.pop(cap, None)
            raise FS3Error(StatusCode.STORAGE_CAPABILITY, "capability expired")


class CapabilityCache:
    """A client's capabilities, by file and right: those its opens brought (:meth:`put`), and new
    ones from ``renew(inode_id, rights)`` (meta's Capability call) when none is at hand, one is
    about to expire, or storage refused one (:meth:`drop`)."""

    def __init__(
        self,
        renew: Callable[[int, int], Awaitable[bytes]],
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = 100_000,
    ) -> None:
        self._renew = renew
        self._clock = clock
        self.max_entries = max_entries
        self._caps: dict[tuple[int, int], tuple[bytes, int]] = {}
        self._renewing: dict[tuple[int, int], asyncio.Future[bytes]] = {}

    def put(self, inode_id: int, cap: bytes) -> None:
        """Keep ``cap`` (as meta sent it) for the file and rights it names."""
        cap_inode, rights, expires = parse(cap)
        if cap_inode != inode_id:
            raise FS3Error(
                StatusCode.INTERNAL, f"meta sent a capability for {cap_inode:#x}, not {inode_id:#x}"
            )
        if len(self._caps) >= self.max_entries:
            self._caps.clear()
        self._caps[(inode_id, rights)] = (bytes(cap), expires)

    def now(self, inode_id: int, right: int) -> bytes | None:
        """A capability granting ``right`` that is not about to expire, if one is at hand."""
        fresh = self._clock() + RENEW_BEFORE_S
        for key in ((inode_id, right), (inode_id, RIGHTS)):
            hit = self._caps.get(key)
            if hit is not None and hit[1] > fresh:
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
