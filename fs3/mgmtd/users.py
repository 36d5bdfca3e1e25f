"""Users and their tokens.

A token is ``fs3u.<uid>.<secret>`` where the secret is 32 random bytes in URL-safe base64. mgmtd
stores only the SHA-256 of the secret (a stolen copy of the store reveals no usable token), so any
process that can read the ``USER`` records (meta, sharing the store) can verify a token without a
round trip, and so can mgmtd. The uid is readable from the token so that verification is one lookup.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import ReadView, Transaction
from fs3.mgmtd import schema
from fs3.proto import mgmtd_pb2

TOKEN_PREFIX = "fs3u"
MAX_TOKENS_PER_USER = 16
MAX_NAME_BYTES = 255
MAX_GROUPS = 256
_SECRET_BYTES = 32


def new_token(uid: int) -> tuple[str, bytes]:
    """A fresh token for ``uid`` and the digest to store for it."""
    secret = secrets.token_bytes(_SECRET_BYTES)
    text = base64.urlsafe_b64encode(secret).decode().rstrip("=")
    return f"{TOKEN_PREFIX}.{uid}.{text}", hashlib.sha256(secret).digest()


def parse_token(token: str) -> tuple[int, bytes]:
    """The uid a token names and the digest of its secret; UNAUTHENTICATED when malformed."""
    parts = token.split(".")
    uid_text = parts[1] if len(parts) == 3 else ""
    # ASCII digits only: str.isdigit() takes "²" (which int() refuses) and "٣" (which it reads as 3)
    if (
        len(parts) != 3
        or parts[0] != TOKEN_PREFIX
        or not (uid_text.isascii() and uid_text.isdigit())
        or len(uid_text) > 10
    ):
        raise FS3Error(StatusCode.UNAUTHENTICATED, "malformed token")
    try:
        secret = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
    except ValueError:
        raise FS3Error(StatusCode.UNAUTHENTICATED, "malformed token") from None
    if len(secret) != _SECRET_BYTES:
        raise FS3Error(StatusCode.UNAUTHENTICATED, "malformed token")
    uid = int(uid_text)
    if uid >= 1 << 32:
        raise FS3Error(StatusCode.UNAUTHENTICATED, "malformed token")
    return uid, hashlib.sha256(secret).digest()


def token_matches(stored: mgmtd_pb2.StoredUser, digest: bytes, now: float) -> bool:
    """Whether ``digest`` is one of the user's live tokens (constant time per comparison)."""
    return _live_token(stored, digest, now) is not None


def _live_token(stored: mgmtd_pb2.StoredUser, digest: bytes, now: float) -> mgmtd_pb2.StoredToken | None:
    found = None
    for t in stored.tokens:
        live = t.expires_at == 0 or t.expires_at > now
        if hmac.compare_digest(t.digest, digest) and live:
            found = t
    return found


def public_user(stored: mgmtd_pb2.StoredUser, now: float, *, tokens: bool = True) -> mgmtd_pb2.User:
    """The user as the admin API shows it: its live tokens counted and, with ``tokens``, listed
    (when made, when they expire; never their digests)."""
    u = mgmtd_pb2.User()
    u.CopyFrom(stored.user)
    live = sorted(
        (t for t in stored.tokens if t.expires_at == 0 or t.expires_at > now), key=lambda t: t.created_at
    )
    u.token_count = len(live)
    if tokens:
        u.tokens.extend(mgmtd_pb2.TokenInfo(created_at=t.created_at, expires_at=t.expires_at) for t in live)
    return u


async def load_user(rv: ReadView, uid: int) -> mgmtd_pb2.StoredUser | None:
    raw = await rv.get(schema.user_key(uid))
    if raw is None:
        return None
    return mgmtd_pb2.StoredUser.FromString(raw)


async def verify_token(rv: ReadView, token: str, now: float) -> mgmtd_pb2.User:
    """The user a token belongs to; UNAUTHENTICATED when it is malformed, unknown or expired."""
    uid, digest = parse_token(token)
    stored = await load_user(rv, uid)
    live = None if stored is None else _live_token(stored, digest, now)
    if stored is None or live is None:
        raise FS3Error(StatusCode.UNAUTHENTICATED, "invalid or expired token")
    user = public_user(stored, now, tokens=False)
    if live.expires_at:
        user.token_expires_in_s = max(live.expires_at - now, 1e-6)  # live: something is left
    return user


def check_user_fields(name: str, groups: Sequence[int]) -> None:
    if not name or len(name.encode()) > MAX_NAME_BYTES or "\0" in name or "/" in name:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"user name {name!r} must be 1..{MAX_NAME_BYTES} bytes without '/' or NUL",
        )
    if len(groups) > MAX_GROUPS:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"at most {MAX_GROUPS} supplementary groups")


#: the longest a token may be issued for: its expiry must be a date (one past what the system's
#: time_t holds was stored, then failed every user-list, and the command that issued it before it
#: showed the token)
MAX_TOKEN_TTL_S = 100 * 365.25 * 86400


def add_token(
    stored: mgmtd_pb2.StoredUser, now: float, ttl_s: float = 0.0, *, invalidate_existing: bool = False
) -> str:
    """Issue a token into ``stored`` (expired ones are dropped, the oldest beyond the limit too)."""
    if not 0 <= ttl_s <= MAX_TOKEN_TTL_S:  # (NaN included)
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"token ttl must be from 0 (never expires) to {MAX_TOKEN_TTL_S:.0f} s (100 years), not {ttl_s:g}",
        )
    token, digest = new_token(stored.user.uid)
    keep = (
        [] if invalidate_existing else [t for t in stored.tokens if t.expires_at == 0 or t.expires_at > now]
    )
    keep = keep[-(MAX_TOKENS_PER_USER - 1) :]
    del stored.tokens[:]
    stored.tokens.extend(keep)
    stored.tokens.add(digest=digest, created_at=now, expires_at=now + ttl_s if ttl_s else 0.0)
    return token


def save_user(tr: Transaction, stored: mgmtd_pb2.StoredUser) -> None:
    tr.set(schema.user_key(stored.user.uid), stored.SerializeToString())
