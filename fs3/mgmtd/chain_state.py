"""The chain state machine: how a chain's targets change public state as their local states change.

This module is pure (no I/O, no clock) so that every rule can be tested exhaustively. mgmtd calls
:func:`next_chain` for every chain each ``chain_update_interval_s`` (and right after a heartbeat that
changes a local state); when the result differs from the input, the chain version is bumped and the
new chain is written to the store.

The rules are those of reference notes §4.3 (3FS's ``generateNewChain``). Targets are bucketed by
their current public state and the buckets processed in the order SERVING, LASTSRV, SYNCING,
WAITING/OFFLINE, each in chain order; "has SERVING" means some target has already been placed in
SERVING during this round:

==================  =====================  ==========================================  ===========
current public      local                  condition                                   next public
==================  =====================  ==========================================  ===========
SERVING             online or up-to-date   --                                          SERVING
SERVING             offline                first offline SERVING, none SERVING yet     LASTSRV
SERVING             offline                otherwise                                   OFFLINE
LASTSRV             online or up-to-date   no SERVING yet                              SERVING
LASTSRV             offline                no SERVING yet                              LASTSRV
LASTSRV             any                    has SERVING                                 OFFLINE
SYNCING             up-to-date             --                                          SERVING
SYNCING             online                 has SERVING                                 SYNCING
SYNCING             online                 no SERVING                                  WAITING
SYNCING             offline                --                                          OFFLINE
WAITING or OFFLINE  online                 has SERVING and no other SYNCING            SYNCING
WAITING or OFFLINE  online or up-to-date   otherwise                                   WAITING
WAITING or OFFLINE  offline                --                                          OFFLINE
==================  =====================  ==========================================  ===========

Afterwards any LASTSRV left while a SERVING target exists becomes OFFLINE, and the chain is
reordered SERVING, LASTSRV, SYNCING, WAITING, OFFLINE, keeping the processing order inside each
state. That is how a failed target moves to the end of its chain while the head stays the first
surviving SERVING target.

The manual operations of the admin API (offline a target, rotate LASTSRV, add or remove a target,
rotate to the preferred order) are here too, as functions from a chain to a new chain that raise
:class:`fs3.errors.FS3Error` when the operation is not allowed.

A chain always keeps its *last server*: a SERVING target, or else the LASTSRV one, the only target
known to hold everything acknowledged. Without one nothing may ever serve again (a WAITING target
never serves on its own), so no manual operation takes it away silently: offlining it needs
``force`` and removing it is refused. A forced offline hands the role to the next target as LASTSRV,
as :func:`rotate_lastsrv` does, accepting that writes only the old one held may be lost.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from fs3.errors import FS3Error, StatusCode


class PublicState(enum.IntEnum):
    """A target's state in its chain; values are those of ``fs3.PublicTargetState`` on the wire."""

    SERVING = 1
    SYNCING = 2
    WAITING = 3
    LASTSRV = 4
    OFFLINE = 5


class LocalState(enum.IntEnum):
    """A target's state as its storage daemon reports it; values of ``fs3.LocalTargetState``."""

    UPTODATE = 1
    ONLINE = 2
    OFFLINE = 3


class ChainTarget(NamedTuple):
    target_id: int
    state: PublicState


# Order of the chain after a round, and the order in which buckets are processed.
_STATE_ORDER = {
    PublicState.SERVING: 0,
    PublicState.LASTSRV: 1,
    PublicState.SYNCING: 2,
    PublicState.WAITING: 3,
    PublicState.OFFLINE: 4,
}


def _bucket(state: PublicState) -> int:
    # WAITING and OFFLINE targets are one bucket: both are "not in the data path, not last server".
    return min(_STATE_ORDER[state], 3)


def next_chain(targets: Sequence[ChainTarget], local_states: Mapping[int, LocalState]) -> list[ChainTarget]:
    """One round of the state machine: the chain that ``targets`` becomes given ``local_states``.

    ``targets`` is the chain in order. A target missing from ``local_states`` counts as OFFLINE
    (nothing heard from it). The result holds exactly the same targets."""
    ordered = sorted(enumerate(targets), key=lambda it: (_bucket(it[1].state), it[0]))
    has_serving = False
    syncing = 0
    first_offline_serving_seen = False
    placed: list[ChainTarget] = []
    for _, t in ordered:
        local = local_states.get(t.target_id, LocalState.OFFLINE)
        offline = local == LocalState.OFFLINE
        if t.state == PublicState.SERVING:
            if not offline:
                new = PublicState.SERVING
            elif not first_offline_serving_seen and not has_serving:
                new = PublicState.LASTSRV
            else:
                new = PublicState.OFFLINE
            if offline:
                first_offline_serving_seen = True
        elif t.state == PublicState.LASTSRV:
            if has_serving:
                new = PublicState.OFFLINE
            elif offline:
                new = PublicState.LASTSRV
            else:
                new = PublicState.SERVING
        elif t.state == PublicState.SYNCING:
            if local == LocalState.UPTODATE:
                new = PublicState.SERVING
            elif offline:
                new = PublicState.OFFLINE
            elif has_serving:
                new = PublicState.SYNCING
            else:
                new = PublicState.WAITING
        else:  # WAITING or OFFLINE
            if offline:
                new = PublicState.OFFLINE
            elif local == LocalState.ONLINE and has_serving and syncing == 0:
                new = PublicState.SYNCING
            else:
                new = PublicState.WAITING
        if new == PublicState.SERVING:
            has_serving = True
        elif new == PublicState.SYNCING:
            syncing += 1
        placed.append(ChainTarget(t.target_id, new))
    if has_serving:
        placed = [
            ChainTarget(t.target_id, PublicState.OFFLINE) if t.state == PublicState.LASTSRV else t
            for t in placed
        ]
    # sorted() is stable, so processing order is kept inside each state.
    return sorted(placed, key=lambda t: _STATE_ORDER[t.state])


def check_chain(target_ids: Sequence[int]) -> None:
    """Refuse a chain definition that names no target or one target twice."""
    if not target_ids:
        raise FS3Error(StatusCode.MGMTD_INVALID_CHAIN, "a chain needs at least one target")
    seen: set[int] = set()
    for tid in target_ids:
        if tid <= 0:
            raise FS3Error(StatusCode.MGMTD_INVALID_CHAIN, f"target id {tid} is not valid (must be > 0)")
        if tid in seen:
            raise FS3Error(StatusCode.MGMTD_INVALID_CHAIN, f"target {tid} appears twice in one chain")
        seen.add(tid)


def _index(targets: Sequence[ChainTarget], target_id: int) -> int:
    for i, t in enumerate(targets):
        if t.target_id == target_id:
            return i
    raise FS3Error(StatusCode.MGMTD_UNKNOWN_TARGET, f"target {target_id} is not in this chain")


def _role(target: ChainTarget) -> str:
    return "last SERVING" if target.state == PublicState.SERVING else target.state.name


def _is_last_server(targets: Sequence[ChainTarget], i: int) -> bool:
    """Whether ``targets[i]`` is the chain's last server: its only SERVING target, or its LASTSRV
    target when none is SERVING."""
    serving = sum(1 for t in targets if t.state == PublicState.SERVING)
    state = targets[i].state
    return (state == PublicState.SERVING and serving == 1) or (state == PublicState.LASTSRV and serving == 0)


def is_last_server(targets: Sequence[ChainTarget], target_id: int) -> bool:
    """Whether the target is the chain's last server (see :func:`_is_last_server`)."""
    return _is_last_server(targets, _index(targets, target_id))


def _keep_a_last_server(rest: list[ChainTarget]) -> list[ChainTarget]:
    """``rest`` with its first target made LASTSRV when nothing in it may serve."""
    if rest and not any(t.state in (PublicState.SERVING, PublicState.LASTSRV) for t in rest):
        rest = [ChainTarget(rest[0].target_id, PublicState.LASTSRV), *rest[1:]]
    return rest


def offline_target(
    targets: Sequence[ChainTarget], target_id: int, *, force: bool = False
) -> list[ChainTarget]:
    """Take one target out of the data path: it becomes OFFLINE at the end of the chain.

    Refused for the chain's last server (its last SERVING target, or its LASTSRV target) unless
    ``force``; forced, the next target becomes LASTSRV, so that the chain serves again once that
    target reports (data only the offlined target held may be lost). The only target of a chain
    has no successor and is never offlined."""
    i = _index(targets, target_id)
    rest = [t for j, t in enumerate(targets) if j != i]
    if _is_last_server(targets, i):
        if len(targets) == 1:
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION,
                f"target {target_id} is the only target of its chain; no other target could serve",
            )
        if not force:
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION,
                f"target {target_id} is the {_role(targets[i])} target of its chain, the last one "
                "known to hold all its data (use force to offline it anyway: the next target becomes "
                "LASTSRV, and data only this one holds may be lost)",
            )
        rest = _keep_a_last_server(rest)
    return rest + [ChainTarget(target_id, PublicState.OFFLINE)]


def rotate_lastsrv(targets: Sequence[ChainTarget]) -> list[ChainTarget]:
    """When the LASTSRV head cannot come back, make the next target the last server.

    The old head goes to the end as OFFLINE; writes only it held may be lost, which is why this is
    a manual operation. A chain left with no SERVING and no LASTSRV target at all (which nothing
    here produces any more, but older versions did) gets its head as LASTSRV."""
    if not any(t.state in (PublicState.SERVING, PublicState.LASTSRV) for t in targets):
        return _keep_a_last_server(list(targets))
    if len(targets) < 2:
        raise FS3Error(StatusCode.FAILED_PRECONDITION, "rotate-lastsrv needs a chain of at least two targets")
    if targets[0].state != PublicState.LASTSRV:
        raise FS3Error(
            StatusCode.FAILED_PRECONDITION,
            f"the head of the chain is {targets[0].state.name}, not LASTSRV; nothing to rotate",
        )
    head, nxt, *rest = targets
    return [
        ChainTarget(nxt.target_id, PublicState.LASTSRV),
        *rest,
        ChainTarget(head.target_id, PublicState.OFFLINE),
    ]


def add_target(targets: Sequence[ChainTarget], target_id: int) -> list[ChainTarget]:
    """Append a target; it starts OFFLINE and the state machine syncs it once it is online."""
    if any(t.target_id == target_id for t in targets):
        raise FS3Error(StatusCode.ALREADY_EXISTS, f"target {target_id} is already in this chain")
    return [*targets, ChainTarget(target_id, PublicState.OFFLINE)]


def remove_target(targets: Sequence[ChainTarget], target_id: int) -> list[ChainTarget]:
    """Drop a target from the chain. Refused for the last target and for the chain's last server
    (its last SERVING target, or its LASTSRV target): offline that one with force, or rotate
    LASTSRV, first."""
    i = _index(targets, target_id)
    if len(targets) == 1:
        raise FS3Error(StatusCode.MGMTD_INVALID_CHAIN, "cannot remove the only target of a chain")
    if _is_last_server(targets, i):
        raise FS3Error(
            StatusCode.FAILED_PRECONDITION,
            f"target {target_id} is the {_role(targets[i])} target of its chain, the last one known "
            "to hold all its data (to give up on it, offline it with force or rotate LASTSRV first)",
        )
    return [t for j, t in enumerate(targets) if j != i]


def rotate_to_preferred(targets: Sequence[ChainTarget], preferred: Sequence[int]) -> list[ChainTarget]:
    """One step towards ``preferred`` order: the first SERVING target out of place goes to the end
    as OFFLINE, to resync there. Repeated calls (after each resync) converge on the preferred order.

    Returns the chain unchanged when the SERVING targets already follow the preferred order. A
    SERVING target can only be out of place when at least two are SERVING, so the move never leaves
    the chain unreadable."""
    if not preferred:
        raise FS3Error(StatusCode.FAILED_PRECONDITION, "this chain has no preferred order")
    rank = {tid: i for i, tid in enumerate(preferred)}
    serving = [t for t in targets if t.state == PublicState.SERVING]
    want = sorted(serving, key=lambda t: rank.get(t.target_id, len(rank)))
    for have, wanted in zip(serving, want, strict=True):
        if have.target_id != wanted.target_id:
            return offline_target(targets, have.target_id)
    return list(targets)


def check_preferred_order(targets: Sequence[ChainTarget], preferred: Sequence[int]) -> None:
    """A preferred order must name each target of the chain exactly once."""
    if sorted(preferred) != sorted(t.target_id for t in targets):
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"preferred order {list(preferred)} must name exactly the chain's targets "
            f"{[t.target_id for t in targets]}",
        )
