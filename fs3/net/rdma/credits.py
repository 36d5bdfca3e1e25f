"""Credit-based flow control for SEND/RECV on one RC queue pair.

A SEND that finds no posted receive buffer at the peer is an RNR error: the peer's HCA NAKs it and,
once retries run out, the queue pair dies. So a sender never posts more SENDs than the peer has
buffers for. The peer posts ``n`` buffers and says so in the handshake; each SEND uses one credit;
the peer returns credits as it reposts buffers, piggybacked on its own SENDs or, when it has nothing
to say, in a SEND that carries only credits.

Deadlock freedom: data may use credits only down to :data:`RESERVE` (1), so the last credit is kept
for a credit-only SEND, and one is sent only when at least ``batch`` credits are owed (``batch`` ≥ 2,
so credit-only SENDs cannot ping-pong forever: each costs the peer one buffer and returns ≥ 2). A
side stuck at its reserve with nothing in flight is owed ``n - 1`` ≥ ``batch`` credits (hence
``batch`` ≤ ``n - 1`` and ``n`` ≥ 3), and its peer still holds its own reserve, so a credit-only
SEND is always possible. (Both sides stuck at zero would need each one's
last, credit-only SEND to have landed before the other's was sent — a cycle.)
"""

from __future__ import annotations

RESERVE = 1
MIN_BUFFERS = 3


class CreditWindow:
    """Both directions of credit accounting for one connection; pure bookkeeping, no I/O.

    ``peer_buffers`` is how many receive buffers the peer posted for us (our initial credits);
    ``local_buffers`` how many we posted for it (the most we can ever owe).
    """

    __slots__ = ("credits", "owed", "batch", "peer_buffers", "local_buffers", "sent", "received")

    def __init__(self, peer_buffers: int, local_buffers: int, batch: int | None = None) -> None:
        if peer_buffers < MIN_BUFFERS or local_buffers < MIN_BUFFERS:
            raise ValueError(f"each side must post at least {MIN_BUFFERS} receive buffers")
        self.peer_buffers = peer_buffers
        self.local_buffers = local_buffers
        # Return credits once a quarter of our buffers is waiting, but at least 2 (see module doc),
        # and at most n - 1, so a peer stuck at its reserve is always owed a batch.
        self.batch = batch if batch is not None else max(2, min(local_buffers // 4, local_buffers - 1))
        if not 2 <= self.batch <= local_buffers - 1:
            raise ValueError(f"credit batch must be 2..{local_buffers - 1}")
        self.credits = peer_buffers  # SENDs we may still post
        self.owed = 0  # buffers we reposted and have not told the peer about
        self.sent = 0
        self.received = 0

    # ---- sending --------------------------------------------------------------------------------

    def can_send_data(self) -> bool:
        """May a SEND carrying stream bytes (or released tokens) be posted now?"""
        return self.credits > RESERVE

    def should_send_credits(self) -> bool:
        """Should a credit-only SEND go out now (nothing else to carry the owed credits)?"""
        return self.credits >= 1 and self.owed >= self.batch

    def take_send(self) -> int:
        """Account for one SEND about to be posted; return the credits it carries back to the peer."""
        if self.credits < 1:
            raise RuntimeError("no send credit left: posting would overrun the peer's receive queue")
        self.credits -= 1
        self.sent += 1
        owed, self.owed = self.owed, 0
        return owed

    # ---- receiving ------------------------------------------------------------------------------

    def on_receive(self, returned: int) -> None:
        """A SEND from the peer arrived carrying ``returned`` credits."""
        if returned < 0 or self.credits + returned > self.peer_buffers:
            raise ValueError(
                f"peer returned {returned} credits with {self.credits} of {self.peer_buffers} held"
            )
        self.credits += returned
        self.received += 1

    def on_reposted(self, n: int = 1) -> None:
        """We reposted ``n`` receive buffers: the peer may use them again once told."""
        if self.owed + n > self.local_buffers:
            raise ValueError("owing more credits than there are receive buffers")
        self.owed += n
