"""Who a meta request acts as: the UserInfo in its header, checked against mgmtd's user store.

:class:`TokenAuthenticator` verifies the token through mgmtd (``VerifyToken``) and caches the answer
(positive ``ttl_s``, negative ``negative_ttl_s``), so the hot path costs a dict lookup. The token must
belong to the request's uid, and groups come from the user store; a token of a *root* user (the
FUSE mount's, which acts for every local user of its host) may act as any uid/gid/groups the request
names. :class:`TrustingAuthenticator` takes the header at its word (``authenticate = false``: tests
and single-user local clusters).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from fs3.errors import FS3Error, StatusCode
from fs3.meta.permissions import Credentials
from fs3.net.auth import TOKEN_CACHE_S, TOKEN_STALE_S, TokenCache
from fs3.proto import common_pb2, mgmtd_pb2

MAX_GROUPS = 64
_MAX_KEY_BYTES = 1024


class Authenticator(Protocol):
    async def credentials(self, user: common_pb2.UserInfo) -> Credentials: ...

    def known(self, user: common_pb2.UserInfo) -> Credentials | None:
        """The credentials :meth:`credentials` would return, when they are at hand without waiting
        (nothing to verify); None when only :meth:`credentials` can tell (it may also raise)."""
        ...


class _HeaderCredentials:
    """The Credentials a header names, made once per distinct identity: every request carries one,
    and building (and validating) them anew cost several microseconds a request.

    Keyed by the UserInfo's encoding (0.3 us, against 0.8 us for a (uid, gid, groups) tuple out of
    the message); identities that encode alike are alike, and one that encodes differently only
    takes another entry. Identities longer than ``_MAX_KEY_BYTES`` (a long token) are not kept.
    """

    __slots__ = ("_cache", "max_entries")

    def __init__(self, max_entries: int = 10_000) -> None:
        self._cache: dict[bytes, Credentials] = {}
        self.max_entries = max_entries

    def get(self, user: common_pb2.UserInfo) -> Credentials | None:
        """The cached Credentials of ``user``'s identity, or None (not made yet)."""
        return self._cache.get(user.SerializeToString())

    def __call__(self, user: common_pb2.UserInfo) -> Credentials:
        key = user.SerializeToString()
        cred = self._cache.get(key)
        if cred is None:
            groups = tuple(user.groups)
            if len(groups) > MAX_GROUPS:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"more than {MAX_GROUPS} supplementary groups")
            cred = Credentials(user.uid, user.gid, frozenset(groups))
            if len(key) <= _MAX_KEY_BYTES:
                if len(self._cache) >= self.max_entries:
                    self._cache.clear()
                self._cache[key] = cred
        return cred


class TrustingAuthenticator:
    """Believes the request header."""

    def __init__(self) -> None:
        self._from_header = _HeaderCredentials()

    async def credentials(self, user: common_pb2.UserInfo) -> Credentials:
        return self._from_header(user)

    def known(self, user: common_pb2.UserInfo) -> Credentials | None:
        return self._from_header.get(user)


class TokenAuthenticator:
    """Checks tokens with ``verify`` (e.g. ``MgmtdClient.verify_token``), caching the results."""

    def __init__(
        self,
        verify: Callable[[str], Awaitable[mgmtd_pb2.User]],
        *,
        ttl_s: float = TOKEN_CACHE_S,
        negative_ttl_s: float = 5.0,
        max_entries: int = 10_000,
        stale_s: float = TOKEN_STALE_S,
    ) -> None:
        self.tokens = TokenCache(
            verify, ttl_s=ttl_s, negative_ttl_s=negative_ttl_s, max_entries=max_entries, stale_s=stale_s
        )
        self.max_entries = max_entries
        self._from_header = _HeaderCredentials(max_entries)
        # A non-root token's Credentials, by the User message the token cache holds (replaced, and
        # so looked up afresh, whenever the token is verified again).
        self._of_user: dict[int, tuple[mgmtd_pb2.User, Credentials]] = {}

    async def user_of(self, token: str) -> mgmtd_pb2.User:
        return await self.tokens.user_of(token)

    def known(self, user: common_pb2.UserInfo) -> Credentials | None:
        # Only a live positive cache entry whose Credentials are made already: anything else (an
        # unknown or expired token, a refusal, a first use) goes through credentials().
        owner = self.tokens.cached(user.token)
        if owner is None:
            return None
        if owner.root:
            return self._from_header.get(user)
        if user.uid != owner.uid:
            return None
        made = self._of_user.get(id(owner))
        return made[1] if made is not None and made[0] is owner else None

    async def credentials(self, user: common_pb2.UserInfo) -> Credentials:
        owner = await self.user_of(user.token)
        if owner.root:
            return self._from_header(user)
        if user.uid != owner.uid:
            raise FS3Error(StatusCode.UNAUTHENTICATED, f"the token does not belong to uid {user.uid}")
        hit = self._of_user.get(id(owner))
        if hit is not None and hit[0] is owner:
            return hit[1]
        cred = Credentials(owner.uid, owner.gid, frozenset(owner.groups))
        if len(self._of_user) >= self.max_entries:
            self._of_user.clear()
        self._of_user[id(owner)] = (owner, cred)
        return cred
