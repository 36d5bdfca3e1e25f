"""Token checks: results are cached (positive and negative), a token acts only for its own uid
unless its user is root, and mgmtd being unreachable is not mistaken for a bad token."""

from __future__ import annotations

import asyncio
import time

import pytest

from fs3.config import MetaConfig, load_config
from fs3.errors import FS3Error, StatusCode
from fs3.meta.auth import TokenAuthenticator, TrustingAuthenticator
from fs3.net.auth import TokenCache
from fs3.proto import common_pb2, mgmtd_pb2

pytestmark = pytest.mark.timeout(30)

USERS = {
    "alice-token": mgmtd_pb2.User(uid=1000, gid=1000, groups=[500, 501]),
    "root-token": mgmtd_pb2.User(uid=0, gid=0, root=True),
}


class Verifier:
    def __init__(self) -> None:
        self.calls = 0
        self.down = False
        self.hung: asyncio.Event | None = None  # set: mgmtd answers again
        self.cancelled = 0
        self.delay = 0.0

    async def __call__(self, token: str) -> mgmtd_pb2.User:
        self.calls += 1
        if self.hung is not None:
            try:
                await self.hung.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        await asyncio.sleep(self.delay)
        if self.down:
            raise FS3Error(StatusCode.UNAVAILABLE, "mgmtd down")
        if token not in USERS:
            raise FS3Error(StatusCode.UNAUTHENTICATED, "invalid or expired token")
        return USERS[token]


def info(uid: int, gid: int, token: str, groups: tuple[int, ...] = ()) -> common_pb2.UserInfo:
    return common_pb2.UserInfo(uid=uid, gid=gid, token=token, groups=groups)


async def test_token_rules_and_cache() -> None:
    v = Verifier()
    auth = TokenAuthenticator(v, ttl_s=60, negative_ttl_s=60)
    cred = await auth.credentials(info(1000, 0, "alice-token", (7,)))
    assert (cred.uid, cred.gid, cred.groups) == (1000, 1000, frozenset({500, 501}))  # from the store
    await auth.credentials(info(1000, 0, "alice-token"))
    assert v.calls == 1
    for bad in (
        info(0, 0, "alice-token"),
        info(1000, 1000, "nope"),
        info(1000, 1000, "nope"),
        info(1, 1, ""),
    ):
        with pytest.raises(FS3Error) as e:
            await auth.credentials(bad)
        assert e.value.code == StatusCode.UNAUTHENTICATED
        if not bad.token:  # says what the client lacks (a member trusted with the secret too)
            assert "token_file, or $FS3_TOKEN_FILE" in e.value.message, e.value.message
    assert v.calls == 2  # the unknown token was asked about once
    # tokens no mgmtd could have issued (nor gRPC carry to it) are refused without asking: each
    # such call failed inside gRPC and logged a traceback, unthrottled
    for garbage in ("caf\u00e9", "a\nb", "x" * 1025):
        with pytest.raises(FS3Error) as e:
            await auth.credentials(info(1000, 1000, garbage))
        assert (e.value.code, e.value.message) == (StatusCode.UNAUTHENTICATED, "malformed token")
    assert v.calls == 2
    as_bob = await auth.credentials(info(1001, 1001, "root-token", (9,)))
    assert (as_bob.uid, as_bob.gid, as_bob.groups) == (1001, 1001, frozenset({9}))


async def test_unreachable_mgmtd_is_not_cached() -> None:
    v = Verifier()
    v.down = True
    auth = TokenAuthenticator(v)
    with pytest.raises(FS3Error) as e:
        await auth.credentials(info(1000, 1000, "alice-token"))
    assert e.value.code == StatusCode.UNAVAILABLE
    v.down = False
    assert (await auth.credentials(info(1000, 1000, "alice-token"))).uid == 1000


async def test_a_verified_token_stands_while_mgmtd_cannot_answer() -> None:
    """mgmtd hung or down when a token's cache entry runs out: the last answer stands (after a
    short wait, then at once) instead of every request waiting for mgmtd's timeout and failing;
    the check goes on, one at a time, and mgmtd's next answer counts, a refusal included."""
    v = Verifier()
    cache = TokenCache(v, ttl_s=0.5, negative_ttl_s=60, recheck_wait_s=0.3, stale_s=60)
    assert (await cache.user_of("alice-token")).uid == 1000
    await asyncio.sleep(0.6)
    v.hung = asyncio.Event()
    start = time.monotonic()
    assert (await cache.user_of("alice-token")).uid == 1000  # after the short wait
    assert 0.25 < time.monotonic() - start < 5
    start = time.monotonic()
    for _ in range(20):
        assert (await cache.user_of("alice-token")).uid == 1000
    assert time.monotonic() - start < 0.25  # known to be away: no wait
    assert v.calls == 2  # one check in flight, not one per request
    v.down = True
    v.hung.set()  # the check ends: mgmtd unavailable, the last answer still stands
    await asyncio.sleep(0.05)
    assert (await cache.user_of("alice-token")).uid == 1000
    v.down, v.hung = False, None
    assert (await cache.user_of("alice-token")).uid == 1000  # at once; its check confirms it
    await asyncio.sleep(0.02)
    calls = v.calls
    assert (await cache.user_of("alice-token")).uid == 1000 and v.calls == calls  # fresh again
    # a revocation is taken as soon as mgmtd says so
    del USERS["alice-token"]
    try:
        await asyncio.sleep(0.6)
        with pytest.raises(FS3Error) as e:
            await cache.user_of("alice-token")
        assert e.value.code == StatusCode.UNAUTHENTICATED
    finally:
        USERS["alice-token"] = mgmtd_pb2.User(uid=1000, gid=1000, groups=[500, 501])


async def test_a_token_ends_when_it_expires_whether_mgmtd_answers_or_not() -> None:
    """mgmtd says how long the token it verifies has left: a server ends it then, also on an answer
    it keeps (meta's fast path asks cached() first) and while mgmtd cannot be asked (an expired
    20 s token kept working for as long as mgmtd was unreachable, up to token_stale_s). Counted
    on the server's own monotonic clock from the answer: a server whose wall clock runs ahead of
    mgmtd's does not end it early."""
    v = Verifier()
    cache = TokenCache(v, ttl_s=0.3, negative_ttl_s=60, recheck_wait_s=0.05, stale_s=3600)
    USERS["short-token"] = mgmtd_pb2.User(uid=1001, gid=1001, token_expires_in_s=0.8)
    USERS["long-token"] = mgmtd_pb2.User(uid=1002, gid=1002, token_expires_in_s=30)
    try:
        assert (await cache.user_of("short-token")).uid == 1001
        assert (await cache.user_of("long-token")).uid == 1002
        assert cache.cached("short-token") is not None
        v.down = True  # mgmtd away from here on
        await asyncio.sleep(0.4)
        assert (await cache.user_of("short-token")).uid == 1001  # stale, not expired: stands
        await asyncio.sleep(0.5)
        assert cache.cached("short-token") is None  # meta's fast path does not take it either
        with pytest.raises(FS3Error) as e:
            await cache.user_of("short-token")
        assert e.value.code == StatusCode.UNAUTHENTICATED and "expired" in e.value.message
        assert (await cache.user_of("long-token")).uid == 1002  # others: until their own time
    finally:
        del USERS["short-token"], USERS["long-token"]


async def test_a_check_of_a_new_token_ends_with_its_caller() -> None:
    """A token never verified is checked in its caller (a handshake): a peer that hangs up ends
    the check, so the server's bound on checks in flight at mgmtd holds."""
    v = Verifier()
    v.hung = asyncio.Event()
    cache = TokenCache(v, ttl_s=60, negative_ttl_s=60)
    callers = [asyncio.ensure_future(cache.user_of(f"made-up-{i}")) for i in range(20)]
    await asyncio.sleep(0.05)
    assert v.calls == 20
    for c in callers:
        c.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    assert v.cancelled == 20


async def test_a_token_confirmed_too_long_ago_needs_mgmtd() -> None:
    v = Verifier()
    cache = TokenCache(v, ttl_s=0.01, negative_ttl_s=60, recheck_wait_s=0.05, stale_s=0.1)
    assert (await cache.user_of("alice-token")).uid == 1000
    await asyncio.sleep(0.15)
    v.down = True
    with pytest.raises(FS3Error) as e:
        await cache.user_of("alice-token")
    assert e.value.code == StatusCode.UNAVAILABLE


async def test_a_token_stale_s_of_zero_takes_no_token_without_mgmtd(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """meta's token_stale_s reaches its token cache: with 0, a token whose cache entry ran out is
    refused while mgmtd cannot answer (with the default it would stand for an hour)."""
    cfg = tmp_path / "meta.toml"
    cfg.write_text("token_stale_s = 0\n")
    assert load_config(MetaConfig, cfg).token_stale_s == 0
    cfg.write_text("token_stale_s = -1\n")
    with pytest.raises(FS3Error) as e:
        load_config(MetaConfig, cfg)
    assert e.value.code == StatusCode.CONFIG_INVALID and "token_stale_s" in str(e.value)
    for stale_s, served in ((0.0, False), (3600.0, True)):
        v = Verifier()
        auth = TokenAuthenticator(v, ttl_s=0.01, stale_s=stale_s)
        assert (await auth.user_of("alice-token")).uid == 1000
        await asyncio.sleep(0.05)
        v.down = True
        if served:
            assert (await auth.user_of("alice-token")).uid == 1000
        else:
            with pytest.raises(FS3Error) as e:
                await auth.user_of("alice-token")
            assert e.value.code == StatusCode.UNAVAILABLE


async def test_a_token_is_kept_from_mgmtds_answer_not_from_the_question() -> None:
    v = Verifier()
    v.delay = 0.3  # a slow mgmtd
    cache = TokenCache(v, ttl_s=0.4, negative_ttl_s=60)
    assert (await cache.user_of("alice-token")).uid == 1000
    await asyncio.sleep(0.2)  # 0.5 s after the question, 0.2 s after the answer
    assert cache.cached("alice-token") is not None
    assert (await cache.user_of("alice-token")).uid == 1000 and v.calls == 1


async def test_trusting_authenticator_limits_groups() -> None:
    auth = TrustingAuthenticator()
    assert (await auth.credentials(info(5, 6, "", (1, 2)))).groups == frozenset({1, 2})
    with pytest.raises(FS3Error) as e:
        await auth.credentials(info(5, 6, "", tuple(range(100))))
    assert e.value.code == StatusCode.INVALID_ARGUMENT


async def test_made_up_tokens_never_push_out_the_users_own() -> None:
    # Anyone who reaches a meta or storage server may send tokens (a user connection's handshake):
    # refusals are kept apart, the oldest going first, and a user's token stays cached.
    v = Verifier()
    cache = TokenCache(v, ttl_s=60, negative_ttl_s=60, max_entries=8)
    assert (await cache.user_of("alice-token")).uid == 1000
    for i in range(100):
        with pytest.raises(FS3Error):
            await cache.user_of(f"made-up-{i}")
    assert v.calls == 101
    assert (await cache.user_of("alice-token")).uid == 1000 and v.calls == 101  # still cached
    with pytest.raises(FS3Error):
        await cache.user_of("made-up-99")  # among the newest refusals: not asked again
    assert v.calls == 101
    with pytest.raises(FS3Error):
        await cache.user_of("made-up-0")  # the oldest went: asked again
    assert v.calls == 102
    # the users' own entries, too, are bounded, the oldest going first
    for i in range(8):
        USERS[f"user-{i}"] = mgmtd_pb2.User(uid=2000 + i)
    try:
        for i in range(8):
            await cache.user_of(f"user-{i}")
        assert cache.cached("user-7") is not None and cache.cached("alice-token") is None
    finally:
        for i in range(8):
            del USERS[f"user-{i}"]
