"""Request ids of the meta client: never reused for one client id, whatever the wall clock does."""

from __future__ import annotations

import pytest

from fs3.client import meta_client
from fs3.client.meta_client import MetaClient


async def test_clients_sharing_a_client_id_never_share_a_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # A mount makes one MetaClient per calling user, all with the mount's client id.
    clock = iter([5_000, 5_000, 4_000, 3_000, 6_000, 2_000, 6_000, 1_000])  # stalls and steps back
    monkeypatch.setattr(meta_client.time, "time_ns", lambda: next(clock))
    a = MetaClient(["127.0.0.1:1"], client_id=77)
    b = MetaClient(["127.0.0.1:1"], client_id=77)
    other = MetaClient(["127.0.0.1:1"], client_id=78)
    try:
        ids = [c._next_request_id() for c in (a, b, a, b, a, b)]  # noqa: SLF001
        assert ids == sorted(set(ids)), ids  # all different, and growing
        assert ids[0] == 5_000 and ids[4] == 6_000  # the clock, wherever it moves on
        assert other._next_request_id() == 6_000  # another client id has ids of its own  # noqa: SLF001
    finally:
        for c in (a, b, other):
            await c.close()
