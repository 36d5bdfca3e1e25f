"""The shared-secret handshake that opens every fs3 RPC connection.

Every process of a cluster holds the cluster secret. On connect::

    client -> server  ClientHello{nonce_c, identity}
    server -> client  ServerHello{nonce_s, proof_s = HMAC(secret, "…server" | nonce_c | nonce_s | identity)}
    client -> server  ClientProof{proof_c = HMAC(secret, "…client" | nonce_s | nonce_c | identity)}
    server -> client  AuthOk                      (or an error frame RPC_AUTH_FAILED, then close)

Both sides prove the secret over the other side's fresh nonce, so neither a recorded handshake nor
a reflected proof (the role label differs) is accepted, and the secret never crosses the wire. The
identity the client claims is bound into both proofs; it is what handlers see as the caller.

A client that is not trusted with the secret (a user's program on a shared machine) opens a *user
connection* instead: its ClientHello carries its user token, which the server verifies with mgmtd
(:class:`TokenCache`; a server without a verifier refuses it) and answers AUTH_OK at once. Such a
client cannot tell the server from an impostor, and its token crosses the wire in clear, as user
tokens do towards mgmtd and meta; its calls act only as the token's user (meta), and storage serves
it only the files meta gave it a capability for (:mod:`fs3.capability`).

mgmtd speaks gRPC, without TLS, where a call carries what proves it in its metadata: services send
:func:`mgmtd_credential`, a key derived from the secret, not the secret itself. Whoever can read
mgmtd's traffic can present that credential to mgmtd (so run mgmtd on a network you trust, as
fs3's user tokens also travel in clear), but not derive the secret that opens fs3 RPC connections
to storage and meta.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fs3.errors import FS3Error, StatusCode

log = logging.getLogger(__name__)

HANDSHAKE_VERSION = 1
NONCE_BYTES = 32
MAX_IDENTITY_BYTES = 255
MAX_TOKEN_CHARS = 1024

# Method ids of handshake frames (service id 0, Flag.HANDSHAKE).
CLIENT_HELLO = 1
SERVER_HELLO = 2
CLIENT_PROOF = 3
AUTH_OK = 4

_LABEL_SERVER = b"fs3-rpc-auth-v1 server\x00"
_LABEL_MGMTD = b"fs3-mgmtd-credential-v1\x00"
_LABEL_CLIENT = b"fs3-rpc-auth-v1 client\x00"


def read_secret(path: str) -> bytes | None:
    """The cluster secret from ``path`` (surrounding whitespace removed); None when ``path`` is ''."""
    if not path:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise FS3Error(
            StatusCode.CONFIG_INVALID, f"cannot read cluster secret file {path}: {e.strerror}"
        ) from None
    if len(secret) < 16:
        raise FS3Error(StatusCode.CONFIG_INVALID, f"cluster secret in {path} is shorter than 16 bytes")
    if not (secret.isascii() and all(32 < b < 127 for b in secret)):
        # it travels in gRPC metadata (to mgmtd), which takes printable ASCII only
        raise FS3Error(
            StatusCode.CONFIG_INVALID,
            f"cluster secret in {path} must be printable ASCII without spaces (make one with "
            "'head -c 32 /dev/urandom | xxd -p -c 64')",
        )
    return secret


def check_secret(secret: bytes) -> bytes:
    """Validate a cluster secret (at least 16 bytes) and return it."""
    if not isinstance(secret, bytes | bytearray) or len(secret) < 16:
        raise ValueError("the cluster secret must be at least 16 bytes")
    return bytes(secret)


def new_nonce() -> bytes:
    """A fresh random nonce."""
    return os.urandom(NONCE_BYTES)


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes, identity: str) -> bytes:
    return hmac.new(secret, label + first + second + identity.encode(), hashlib.sha256).digest()


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes, identity: str) -> bytes:
    """What the server sends to prove it holds ``secret``."""
    return _mac(secret, _LABEL_SERVER, client_nonce, server_nonce, identity)


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, identity: str) -> bytes:
    """What the client sends to prove it holds ``secret``."""
    return _mac(secret, _LABEL_CLIENT, server_nonce, client_nonce, identity)


def verify(expected: bytes, received: bytes) -> bool:
    """Constant-time comparison of proofs."""
    return hmac.compare_digest(expected, received)


def mgmtd_credential(secret: bytes) -> str:
    """What a service presents to mgmtd for the cluster secret (see the module docstring)."""
    return hmac.new(secret, _LABEL_MGMTD, hashlib.sha256).hexdigest()


#: How long a server keeps a token check: a removed user's or revoked token still works this long
#: at a server that checked it just before, and up to TOKEN_STALE_S at one that cannot reach mgmtd
#: (fs3 admin says so when it removes or revokes).
TOKEN_CACHE_S = 60.0
#: How long a check that ran out waits for mgmtd before the last answer stands (see TokenCache).
TOKEN_RECHECK_WAIT_S = 2.0
#: How long after its last confirmation a token is still taken while mgmtd cannot answer.
TOKEN_STALE_S = 3600.0


def token_well_formed(token: str) -> bool:
    """Whether ``token`` could be a user token: up to MAX_TOKEN_CHARS printable ASCII characters
    (what mgmtd issues, ``fs3u.<uid>.<secret>``, is that; gRPC metadata carries nothing else)."""
    return len(token) <= MAX_TOKEN_CHARS and token.isascii() and token.isprintable()


class TokenCache:
    """Who a user token belongs to, asked of ``verify`` (``MgmtdClient.verify_token``) and kept
    for ``ttl_s`` (a refusal for ``negative_ttl_s``), so that a token costs a dict lookup after its
    first use. Refusals are kept apart from accepted tokens, each up to ``max_entries`` with the
    oldest going first, so that made-up tokens (which anyone who reaches a server may send) never
    push out the users' own.

    When an accepted token's ``ttl_s`` has run out, it is checked again; a revocation takes effect
    then. But a server that is alive keeps serving the users it has verified while mgmtd is away:
    if mgmtd does not answer within ``recheck_wait_s`` (hung, restarting, unreachable), the last
    answer stands, for up to ``stale_s`` after it was given, while the check goes on in the
    background (one per token at a time). Otherwise every request of every user would wait for, and
    then fail with, mgmtd's timeout once a minute's cache ran out. A token never verified, or last
    confirmed longer ago than ``stale_s``, needs mgmtd's answer."""

    def __init__(
        self,
        verify: Callable[[str], Awaitable[Any]],
        *,
        ttl_s: float = TOKEN_CACHE_S,
        negative_ttl_s: float = 5.0,
        max_entries: int = 10_000,
        recheck_wait_s: float = TOKEN_RECHECK_WAIT_S,
        stale_s: float = TOKEN_STALE_S,
    ) -> None:
        self._verify = verify
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.max_entries = max_entries
        self.recheck_wait_s = recheck_wait_s
        self.stale_s = stale_s
        self._users: dict[str, tuple[float, Any]] = {}  # token -> (when mgmtd confirmed it, its User)
        self._refused: dict[str, tuple[float, FS3Error]] = {}
        self._checks: dict[str, asyncio.Task[Any]] = {}  # checks with mgmtd in flight, by token
        self._unconfirmed: set[str] = set()  # tokens taken on their last answer, mgmtd away

    def cached(self, token: str) -> Any:
        """The user of ``token`` if known and fresh, else None (refusals included)."""
        hit = self._users.get(token)
        now = time.monotonic()
        if hit is None or now - hit[0] > self.ttl_s or _expired(hit, now):
            return None
        return hit[1]

    async def user_of(self, token: str) -> Any:
        """The ``mgmtd_pb2.User`` ``token`` belongs to; FS3Error UNAUTHENTICATED if none."""
        if not token:
            raise FS3Error(
                StatusCode.UNAUTHENTICATED,
                "the request carries no user token (a client names its token file in token_file, or $FS3_TOKEN_FILE)",
            )
        if not token_well_formed(token):
            # refused here, as mgmtd would: such a token cannot even be sent to it (gRPC takes
            # printable ASCII only), and each failed call logged a traceback
            raise FS3Error(StatusCode.UNAUTHENTICATED, "malformed token")
        now = time.monotonic()
        hit = self._users.get(token)
        if hit is not None and _expired(hit, now):
            # its expiry is known: it ends then, whether mgmtd can be asked or not (a cached answer,
            # or mgmtd's last one while it is away, kept an expired token working for up to
            # token_stale_s)
            self._users.pop(token, None)
            self._unconfirmed.discard(token)
            raise FS3Error(StatusCode.UNAUTHENTICATED, "invalid or expired token (it expired)")
        if hit is not None and now - hit[0] <= self.ttl_s:
            return hit[1]
        refused = self._refused.get(token)
        if refused is not None and refused[0] >= now:
            raise FS3Error(refused[1].code, refused[1].message)
        if hit is None or now - hit[0] > self.stale_s:
            # Never verified, or too long ago: mgmtd's answer is needed, waited for here, and
            # given up with the caller (a connection that closes mid-handshake ends its check, so
            # the server's bound on checks in flight holds).
            return await self._check(token)
        check = self._checks.get(token)
        if check is None:
            # shared by the token's requests meanwhile, one per token (at most one per entry)
            check = self._checks[token] = asyncio.ensure_future(self._background_check(token))
            check.add_done_callback(_retrieved)
        if token not in self._unconfirmed:  # known to be away: no wait
            await asyncio.wait((check,), timeout=self.recheck_wait_s)
        error: BaseException | None = None
        if check.done():
            error = _outcome(check)
            if error is None:
                return check.result()
            if isinstance(error, FS3Error) and error.code == StatusCode.UNAUTHENTICATED:
                # a copy: the check's own error is shared by every request that waited for it
                raise FS3Error(error.code, error.message)
        if token not in self._unconfirmed:
            self._unconfirmed.add(token)
            log.warning(
                "mgmtd did not confirm a token of uid %d (%s): it stands on mgmtd's answer of %.0f s"
                " ago until mgmtd answers again",
                getattr(hit[1], "uid", -1),
                error or f"no answer in {self.recheck_wait_s:g} s",
                now - hit[0],
            )
        return hit[1]

    async def _background_check(self, token: str) -> Any:
        try:
            return await self._check(token)
        finally:
            self._checks.pop(token, None)

    async def _check(self, token: str) -> Any:
        """Ask mgmtd about ``token`` and keep the answer; raises as ``verify`` does."""
        try:
            user = await self._verify(token)
        except FS3Error as e:
            if e.code == StatusCode.UNAUTHENTICATED:
                self._users.pop(token, None)
                self._unconfirmed.discard(token)
                _keep(self._refused, token, (time.monotonic() + self.negative_ttl_s, e), self.max_entries)
            raise  # anything else: mgmtd unreachable; not cached
        self._refused.pop(token, None)
        # confirmed when the answer came, not when the check began (a slow check would shorten the
        # time it is kept)
        _keep(self._users, token, (time.monotonic(), user), self.max_entries)
        if token in self._unconfirmed:
            self._unconfirmed.discard(token)
            log.info("mgmtd confirmed a token of uid %d again", getattr(user, "uid", -1))
        return user


def _expired(hit: tuple[float, Any], now: float) -> bool:
    """Whether a kept answer's token has expired: the seconds mgmtd said it had left, counted
    from when the answer came (monotonic, this host's: mgmtd's clock need not agree)."""
    left = getattr(hit[1], "token_expires_in_s", 0)
    return 0 < left and now - hit[0] >= left


def _outcome(task: asyncio.Task[Any]) -> BaseException | None:
    """The error a finished task ended with (None if it returned)."""
    if task.cancelled():
        return FS3Error(StatusCode.UNAVAILABLE, "the token check with mgmtd was cancelled")
    return task.exception()


def _retrieved(task: asyncio.Task[Any]) -> None:
    _outcome(task)  # a check nobody waited for to its end must not log "never retrieved"


def _keep(cache: dict[str, Any], key: str, value: Any, max_entries: int) -> None:
    """``cache[key] = value`` as its newest entry, the oldest going when it holds ``max_entries``."""
    cache.pop(key, None)
    while len(cache) >= max_entries:
        del cache[next(iter(cache))]
    cache[key] = value


def user_scoped_id(uid: int, value: int) -> int:
    """An id a user connection sent (a client id, a request id), made its user's: derived from the
    uid, and apart from the ids cluster members draw (below 2**63). Retries are recognized by such
    ids; were a user's taken as sent, whoever learnt another client's could have that client's
    next requests answered from a cache of results instead of served (storage's update tags), or
    read the results recorded for it (meta's idempotency records)."""
    digest = hashlib.blake2b(struct.pack("<IQ", uid, value), digest_size=8, person=b"fs3-user-id").digest()
    return int.from_bytes(digest, "little") | 1 << 63
