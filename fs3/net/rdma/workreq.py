"""Work-request ids and what to do when their completions arrive.

A completion names its work request only by the 64-bit ``wr_id`` given when it was posted, so the id
carries everything needed to route it without a lookup for the common cases::

    bits 60..63  kind     SEND, RECV, READ, WRITE
    bits  0..59  index    SEND/RECV: the buffer slot; READ/WRITE: a sequence number (60 bits never wrap)

SEND and RECV completions go straight to the slot they name. One-sided operations have a callback
each, kept in :class:`OneSidedTable` until their completion (success or error) arrives. Error
completions are reported to the callback with the verbs status. An error completion puts the queue
pair in the error state (IBTA), after which every work request is flushed: the connection ends
with it (a flushed work request is an error like any other).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

_KIND_SHIFT = 60
_INDEX_MASK = (1 << _KIND_SHIFT) - 1

# ibv_wc_status values this module names (pyverbs.enums has them all; these are fixed by the ABI).
WC_SUCCESS = 0
WC_WR_FLUSH_ERR = 5

_STATUS_NAMES = {
    0: "success",
    1: "local length error",
    2: "local QP operation error",
    3: "local EE context operation error",
    4: "local protection error",
    5: "work request flushed",
    6: "memory window bind error",
    7: "bad response",
    8: "local access error",
    9: "remote invalid request",
    10: "remote access error",
    11: "remote operation error",
    12: "transport retry counter exceeded",
    13: "RNR retry counter exceeded",
    14: "local RDD violation",
    15: "remote invalid RD request",
    16: "remote aborted",
    17: "invalid EE context number",
    18: "invalid EE context state",
    19: "fatal error",
    20: "response timeout",
    21: "general error",
}


def status_name(status: int) -> str:
    """A readable name of an ``ibv_wc_status``."""
    return _STATUS_NAMES.get(status, f"status {status}")


class WrKind(enum.IntEnum):
    """What a work request was."""

    SEND = 1
    RECV = 2
    READ = 3
    WRITE = 4


def encode_wr_id(kind: WrKind, index: int) -> int:
    """The wr_id of a work request of ``kind`` for slot or sequence number ``index``."""
    if not 0 <= index <= _INDEX_MASK:
        raise ValueError(f"work request index {index} out of range")
    return (int(kind) << _KIND_SHIFT) | index


def decode_wr_id(wr_id: int) -> tuple[WrKind, int]:
    """Inverse of :func:`encode_wr_id`; raises ValueError for an id this module did not make."""
    kind = wr_id >> _KIND_SHIFT
    try:
        return WrKind(kind), wr_id & _INDEX_MASK
    except ValueError:
        raise ValueError(f"work request id 0x{wr_id:016x} has no known kind") from None


@dataclass(slots=True, frozen=True)
class Completion:
    """One work completion, as the verbs layer reports it (pyverbs ``WC`` fields we use)."""

    wr_id: int
    status: int
    byte_len: int = 0

    @property
    def ok(self) -> bool:
        return self.status == WC_SUCCESS


# a one-sided operation's callback: (status, description of the error or "")
OneSidedCallback = Callable[[int, str], None]


class OneSidedTable:
    """Outstanding RDMA READ/WRITE operations of one queue pair, by sequence number."""

    __slots__ = ("_ops", "_next")

    def __init__(self) -> None:
        self._ops: dict[int, OneSidedCallback] = {}
        self._next = 1

    def add(self, kind: WrKind, callback: OneSidedCallback) -> int:
        """Register an operation about to be posted; return its wr_id."""
        if kind not in (WrKind.READ, WrKind.WRITE):
            raise ValueError(f"{kind.name} is not a one-sided operation")
        seq = self._next
        self._next = seq + 1
        self._ops[seq] = callback
        return encode_wr_id(kind, seq)

    def discard(self, wr_id: int) -> None:
        """Forget an operation whose post failed (no completion will come)."""
        self._ops.pop(wr_id & _INDEX_MASK, None)

    def complete(self, wc: Completion) -> bool:
        """Run the callback of ``wc``'s operation; False when the wr_id is unknown (a bug or a replay)."""
        cb = self._ops.pop(wc.wr_id & _INDEX_MASK, None)
        if cb is None:
            return False
        cb(wc.status, "" if wc.ok else status_name(wc.status))
        return True

    def fail_all(self, reason: str) -> None:
        """The queue pair is gone: every outstanding operation fails (its completion will never come)."""
        ops, self._ops = self._ops, {}
        for cb in ops.values():
            cb(WC_WR_FLUSH_ERR, reason)

    def __len__(self) -> int:
        return len(self._ops)


class SendSignaling:
    """Which SENDs ask for a completion, and which send slots a completion gives back.

    On an RC queue pair, work requests complete in the order they were posted, so a completion also
    vouches for every unsignaled SEND posted before it. Asking for a completion on fewer SENDs saves
    a completion to poll and handle per SEND. A SEND is signaled when it is the last one of a burst
    (so no slot is ever left waiting for a completion that will not come) and after ``every - 1``
    unsignaled ones (so a long burst gets its slots back in groups while it goes on). Unsignaled
    work requests keep their place in the send queue until a later completion, so ``every`` must
    not exceed the number of SENDs the queue pair can hold.
    """

    __slots__ = ("every", "_pending", "_covers")

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.every = every
        self._pending: list[int] = []  # unsignaled slots posted since the last signaled SEND
        self._covers: dict[int, list[int]] = {}  # signaled slot -> the unsignaled slots before it

    def post(self, slot: int, last: bool) -> bool:
        """Note a SEND from ``slot`` about to be posted; True when it must be signaled."""
        if last or len(self._pending) + 1 >= self.every:
            self._covers[slot] = self._pending
            self._pending = []
            return True
        self._pending.append(slot)
        return False

    def completed(self, slot: int) -> list[int]:
        """The slots a signaled SEND's completion frees, in posting order (``slot`` last)."""
        covered = self._covers.pop(slot, [])
        covered.append(slot)
        return covered

    @property
    def unsignaled(self) -> int:
        """Unsignaled SENDs not yet followed by a signaled one (0 between bursts)."""
        return len(self._pending)
