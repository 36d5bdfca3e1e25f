"""Credit accounting: never more SENDs than the peer has receive buffers, and no deadlock."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fs3.net.rdma.credits import CreditWindow

pytestmark = pytest.mark.timeout(60)


def test_sends_use_credits_down_to_the_reserve() -> None:
    w = CreditWindow(peer_buffers=4, local_buffers=8)
    sent = 0
    while w.can_send_data():
        w.take_send()
        sent += 1
    assert sent == 3 and w.credits == 1  # the last credit is kept for returning credits
    assert not w.should_send_credits()  # nothing owed
    w.on_reposted(2)
    assert w.should_send_credits()  # owed >= batch (2) and the reserve is there
    assert w.take_send() == 2 and w.credits == 0 and w.owed == 0
    with pytest.raises(RuntimeError, match="no send credit"):
        w.take_send()


def test_returned_credits_are_carried_and_checked() -> None:
    w = CreditWindow(peer_buffers=4, local_buffers=4)
    w.take_send()
    w.take_send()
    w.on_receive(2)
    assert w.credits == 4
    with pytest.raises(ValueError, match="returned 1 credits"):
        w.on_receive(1)  # more than it ever lent us
    with pytest.raises(ValueError):
        w.on_receive(-1)
    w.on_reposted(3)
    assert w.take_send() == 3 and w.owed == 0  # piggybacked on a data SEND
    with pytest.raises(ValueError, match="owing more"):
        w.on_reposted(5)


def test_window_limits() -> None:
    with pytest.raises(ValueError):
        CreditWindow(peer_buffers=2, local_buffers=8)
    with pytest.raises(ValueError):
        CreditWindow(peer_buffers=8, local_buffers=2)
    with pytest.raises(ValueError):
        CreditWindow(8, 8, batch=8)  # a peer stuck at its reserve would never be owed a batch
    assert CreditWindow(32, 32).batch == 8
    assert CreditWindow(32, 4).batch == 2  # never below 2: no credit-only ping-pong
    assert CreditWindow(32, 3).batch == 2


class _Side:
    def __init__(self, peer_buffers: int, local_buffers: int, to_send: int) -> None:
        self.w = CreditWindow(peer_buffers, local_buffers)
        self.to_send = to_send
        self.posted = local_buffers  # receive buffers currently posted here
        self.received_data = 0


def _simulate(n_a: int, n_b: int, msgs_a: int, msgs_b: int, seed: int) -> tuple[_Side, _Side]:
    """Two endpoints exchanging SENDs through a network that delivers in order per direction but
    interleaves the directions randomly; each step does one random enabled action."""
    rng = random.Random(seed)
    a, b = _Side(n_b, n_a, msgs_a), _Side(n_a, n_b, msgs_b)
    wire: dict[int, deque[tuple[int, bool]]] = {0: deque(), 1: deque()}  # (credits, has data)
    sides = (a, b)
    for _ in range(200_000):
        actions = []
        for i, s in enumerate(sides):
            if s.to_send and s.w.can_send_data():
                actions.append(("data", i))
            elif s.w.should_send_credits():
                actions.append(("credit", i))
            if wire[i]:
                actions.append(("deliver", i))
        if not actions:
            break
        kind, i = rng.choice(actions)
        s, peer = sides[i], sides[1 - i]
        if kind == "deliver":
            credits, data = wire[i].popleft()
            assert peer.posted > 0, "a SEND arrived with no receive buffer posted (RNR)"
            peer.posted -= 1
            peer.w.on_receive(credits)
            peer.received_data += data
            peer.posted += 1  # reposted at once
            peer.w.on_reposted()
        else:
            wire[i].append((s.w.take_send(), kind == "data"))
            if kind == "data":
                s.to_send -= 1
    return a, b


@settings(max_examples=60, deadline=None)
@given(
    st.integers(3, 12), st.integers(3, 12), st.integers(0, 300), st.integers(0, 300), st.integers(0, 1 << 30)
)
def test_two_peers_never_overrun_and_always_finish(n_a: int, n_b: int, ma: int, mb: int, seed: int) -> None:
    a, b = _simulate(n_a, n_b, ma, mb, seed)
    # everything was delivered (no deadlock), and no SEND ever found its receive queue empty
    assert a.to_send == 0 and b.to_send == 0
    assert b.received_data == ma and a.received_data == mb
