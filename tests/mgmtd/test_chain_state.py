"""The chain state machine: every row of the transition table, the manual operations, and
hypothesis-checked invariants over random event sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fs3.errors import FS3Error, StatusCode
from fs3.mgmtd.chain_state import (
    ChainTarget,
    LocalState,
    PublicState,
    add_target,
    check_chain,
    check_preferred_order,
    next_chain,
    offline_target,
    remove_target,
    rotate_lastsrv,
    rotate_to_preferred,
)

pytestmark = pytest.mark.timeout(60)

S, Y, W, L, O = (  # noqa: E741 - one letter per state keeps the table readable
    PublicState.SERVING,
    PublicState.SYNCING,
    PublicState.WAITING,
    PublicState.LASTSRV,
    PublicState.OFFLINE,
)
UP, ON, OFF = LocalState.UPTODATE, LocalState.ONLINE, LocalState.OFFLINE

_PUB = {"S": S, "Y": Y, "W": W, "L": L, "O": O}
_LOC = {"u": UP, "o": ON, "x": OFF}


def chain(spec: str) -> tuple[list[ChainTarget], dict[int, LocalState]]:
    """'S/u Y/o O/x' → targets 1, 2, 3 with public states S, Y, O and local states u, o, x."""
    targets, local = [], {}
    for i, item in enumerate(spec.split(), start=1):
        pub, loc = item.split("/")
        targets.append(ChainTarget(i, _PUB[pub]))
        local[i] = _LOC[loc]
    return targets, local


def render(targets: list[ChainTarget]) -> str:
    inv = {v: k for k, v in _PUB.items()}
    return " ".join(f"{t.target_id}{inv[t.state]}" for t in targets)


# One or more cases per row of the table in fs3.mgmtd.chain_state (reference notes §4.3).
# Each case: (row, chain before with local states, chain after as "<id><state>" in order).
TABLE = [
    ("SERVING+online -> SERVING", "S/o S/o", "1S 2S"),
    ("SERVING+uptodate -> SERVING", "S/u S/u", "1S 2S"),
    ("SERVING+offline, first, none serving yet -> LASTSRV", "S/x", "1L"),
    ("SERVING+offline, first of two all down -> LASTSRV, rest OFFLINE", "S/x S/x S/x", "1L 2O 3O"),
    ("SERVING+offline, otherwise -> OFFLINE (tail fails)", "S/u S/u S/x", "1S 2S 3O"),
    ("SERVING+offline, otherwise -> OFFLINE (middle fails, moves to end)", "S/u S/x S/u", "1S 3S 2O"),
    ("SERVING+offline, head fails: LASTSRV in the pass, OFFLINE afterwards", "S/x S/u", "2S 1O"),
    ("LASTSRV+online, no SERVING -> SERVING", "L/o O/x", "1S 2O"),
    ("LASTSRV+uptodate, no SERVING -> SERVING", "L/u O/x", "1S 2O"),
    ("LASTSRV+offline, no SERVING -> LASTSRV", "L/x O/x", "1L 2O"),
    ("LASTSRV+online, has SERVING -> OFFLINE", "S/u L/o", "1S 2O"),
    ("LASTSRV+offline, has SERVING -> OFFLINE", "S/u L/x", "1S 2O"),
    ("SYNCING+uptodate -> SERVING", "S/u Y/u", "1S 2S"),
    ("SYNCING+uptodate, no SERVING -> SERVING", "O/x Y/u", "2S 1O"),
    ("SYNCING+online, has SERVING -> SYNCING", "S/u Y/o", "1S 2Y"),
    ("SYNCING+online, no SERVING -> WAITING", "S/x Y/o", "1L 2W"),
    ("SYNCING+offline -> OFFLINE", "S/u Y/x", "1S 2O"),
    ("WAITING+online, has SERVING, no other SYNCING -> SYNCING", "S/u W/o", "1S 2Y"),
    ("OFFLINE+online, has SERVING, no other SYNCING -> SYNCING", "S/u O/o", "1S 2Y"),
    ("WAITING+online, other SYNCING -> WAITING", "S/u Y/o W/o", "1S 2Y 3W"),
    ("OFFLINE+online, other SYNCING -> WAITING", "S/u Y/o O/o", "1S 2Y 3W"),
    ("OFFLINE+online, two return at once: only the first syncs", "S/u O/o O/o", "1S 2Y 3W"),
    ("WAITING+online, no SERVING -> WAITING", "L/x W/o", "1L 2W"),
    ("OFFLINE+online, no SERVING -> WAITING", "L/x O/o", "1L 2W"),
    ("WAITING+uptodate, has SERVING -> WAITING", "S/u W/u", "1S 2W"),
    ("OFFLINE+uptodate, has SERVING -> WAITING", "S/u O/u", "1S 2W"),
    ("WAITING+offline -> OFFLINE", "S/u W/x", "1S 2O"),
    ("OFFLINE+offline -> OFFLINE", "S/u O/x", "1S 2O"),
]


@pytest.mark.parametrize(("row", "before", "after"), TABLE, ids=[r[0] for r in TABLE])
def test_transition_table(row: str, before: str, after: str) -> None:
    targets, local = chain(before)
    assert render(next_chain(targets, local)) == after


def test_every_row_of_the_table_is_covered() -> None:
    # The table has 13 rows; each row's arrow text appears in at least one case above.
    rows = {
        "SERVING+online",
        "SERVING+uptodate",
        "SERVING+offline, first",
        "SERVING+offline, otherwise",
        "LASTSRV+online, no SERVING",
        "LASTSRV+offline, no SERVING",
        "has SERVING -> OFFLINE",
        "SYNCING+uptodate",
        "SYNCING+online, has SERVING",
        "SYNCING+online, no SERVING",
        "SYNCING+offline",
        "has SERVING, no other SYNCING -> SYNCING",
        "-> WAITING",
        "WAITING+offline",
        "OFFLINE+offline",
    }
    for r in rows:
        assert any(r in case[0] for case in TABLE), r


def test_missing_local_state_counts_as_offline() -> None:
    targets, _ = chain("S/u S/u")
    assert render(next_chain(targets, {1: UP})) == "1S 2O"


def test_return_of_a_failed_target_goes_through_syncing() -> None:
    targets, local = chain("S/u S/u S/u")
    local[1] = OFF
    targets = next_chain(targets, local)
    assert render(targets) == "2S 3S 1O"
    local[1] = ON
    targets = next_chain(targets, local)
    assert render(targets) == "2S 3S 1Y"
    local[1] = UP
    targets = next_chain(targets, local)
    assert render(targets) == "2S 3S 1S"


def test_whole_chain_down_then_last_server_returns() -> None:
    targets, local = chain("S/u S/u")
    local[2] = OFF
    targets = next_chain(targets, local)
    local[1] = OFF
    targets = next_chain(targets, local)
    assert render(targets) == "1L 2O"
    local[2] = ON  # not the last server: it must wait
    targets = next_chain(targets, local)
    assert render(targets) == "1L 2W"
    local[1] = UP  # the last server is back: it serves, and the other syncs from it at once
    targets = next_chain(targets, local)
    assert render(targets) == "1S 2Y"


# ---- manual operations -------------------------------------------------------------------------


def test_offline_target_moves_it_to_the_end() -> None:
    targets, _ = chain("S/u S/u S/u")
    assert render(offline_target(targets, 1)) == "2S 3S 1O"


def serve_again(targets: list[ChainTarget], local: dict[int, LocalState]) -> list[ChainTarget]:
    """Rounds with every target reporting ``local`` and syncs completing, until nothing changes."""
    local = dict(local)
    for _ in range(4 * len(targets) + 2):
        new = next_chain(targets, local)
        for t in new:
            if t.state == Y:
                local[t.target_id] = UP
        if new == targets:
            break
        targets = new
    return targets


def test_offline_target_refuses_the_last_serving_target_unless_forced() -> None:
    targets, _ = chain("S/u O/x O/x")
    with pytest.raises(FS3Error) as e:
        offline_target(targets, 1)
    assert e.value.code == StatusCode.FAILED_PRECONDITION and "force" in e.value.message
    # forced, the next target is the last server: the chain serves again once it reports
    targets = offline_target(targets, 1, force=True)
    assert render(targets) == "2L 3O 1O"
    assert render(next_chain(targets, {1: ON, 2: OFF, 3: ON})) == "2L 3W 1W"
    assert render(serve_again(targets, {1: ON, 2: UP, 3: ON})) == "2S 3S 1S"


def test_offline_target_refuses_the_lastsrv_target_unless_forced() -> None:
    targets, local = chain("S/u S/u S/u")
    local.update({1: OFF, 2: OFF, 3: OFF})
    targets = next_chain(targets, local)
    assert render(targets) == "1L 2O 3O"
    with pytest.raises(FS3Error) as e:
        offline_target(targets, 1)
    assert e.value.code == StatusCode.FAILED_PRECONDITION and "LASTSRV" in e.value.message
    assert render(offline_target(targets, 2)) == "1L 3O 2O"  # any other target is fine
    # forced, as rotate-lastsrv: the next target is the last server, and serves once it reports
    targets = offline_target(targets, 1, force=True)
    assert targets == rotate_lastsrv(chain("L/x O/x O/x")[0])
    assert render(targets) == "2L 3O 1O"
    assert render(serve_again(targets, {1: ON, 2: UP, 3: ON})) == "2S 3S 1S"


def test_the_only_target_of_a_chain_is_never_offlined() -> None:
    for spec in ("S/u", "L/x"):
        for force in (False, True):
            with pytest.raises(FS3Error) as e:
                offline_target(chain(spec)[0], 1, force=force)
            assert e.value.code == StatusCode.FAILED_PRECONDITION


def test_offline_target_not_in_chain() -> None:
    targets, _ = chain("S/u")
    with pytest.raises(FS3Error) as e:
        offline_target(targets, 9)
    assert e.value.code == StatusCode.MGMTD_UNKNOWN_TARGET


def test_rotate_lastsrv() -> None:
    targets, _ = chain("L/x O/x O/x")
    assert render(rotate_lastsrv(targets)) == "2L 3O 1O"
    for bad in ("S/u O/x", "L/x"):
        with pytest.raises(FS3Error) as e:
            rotate_lastsrv(chain(bad)[0])
        assert e.value.code == StatusCode.FAILED_PRECONDITION


def test_rotate_lastsrv_revives_a_chain_with_no_last_server() -> None:
    # what older versions left behind: every target WAITING or OFFLINE, none allowed to serve
    targets, local = chain("O/x O/x O/x")
    local.update({1: ON, 2: ON, 3: ON})
    assert render(next_chain(targets, local)) == "1W 2W 3W"
    targets = rotate_lastsrv(targets)
    assert render(targets) == "1L 2O 3O"
    assert render(serve_again(targets, local)) == "1S 2S 3S"
    assert render(rotate_lastsrv(chain("W/o")[0])) == "1L"


def test_add_and_remove_target() -> None:
    targets, _ = chain("S/u S/u")
    assert render(add_target(targets, 7)) == "1S 2S 7O"
    with pytest.raises(FS3Error):
        add_target(targets, 2)
    assert render(remove_target(targets, 1)) == "2S"
    with pytest.raises(FS3Error):
        remove_target(chain("S/u")[0], 1)
    with pytest.raises(FS3Error):
        remove_target(chain("S/u O/x")[0], 1)


def test_remove_target_refuses_the_lastsrv_target() -> None:
    targets, _ = chain("L/x O/x O/x")
    with pytest.raises(FS3Error) as e:
        remove_target(targets, 1)
    assert e.value.code == StatusCode.FAILED_PRECONDITION and "LASTSRV" in e.value.message
    assert render(remove_target(targets, 3)) == "1L 2O"
    # the way to give up on it: rotate, then remove
    assert render(remove_target(rotate_lastsrv(targets), 1)) == "2L 3O"


def test_rotate_to_preferred_converges() -> None:
    targets, local = chain("S/u S/u S/u")
    targets = [ChainTarget(2, S), ChainTarget(3, S), ChainTarget(1, S)]
    preferred = [1, 2, 3]
    check_preferred_order(targets, preferred)
    for _ in range(10):
        new = rotate_to_preferred(targets, preferred)
        if new == targets:
            break
        targets = new
        # the rotated target resyncs at the end: OFFLINE -> SYNCING -> SERVING
        targets = next_chain(targets, {1: ON, 2: ON, 3: ON})
        targets = next_chain(targets, {1: UP, 2: UP, 3: UP})
    assert render(targets) == "1S 2S 3S"


def test_bad_chain_definitions() -> None:
    for ids in ([], [1, 1], [0]):
        with pytest.raises(FS3Error) as e:
            check_chain(ids)
        assert e.value.code == StatusCode.MGMTD_INVALID_CHAIN
    with pytest.raises(FS3Error):
        check_preferred_order(chain("S/u S/u")[0], [1, 3])


# ---- invariants over random event sequences ------------------------------------------------------


def check_invariants(before: list[ChainTarget], after: list[ChainTarget]) -> None:
    states = [t.state for t in after]
    assert states.count(Y) <= 1, render(after)
    if S in states:
        assert after[0].state == S, render(after)
    assert sorted(t.target_id for t in after) == sorted(t.target_id for t in before), render(after)
    # the chain is always sorted SERVING, LASTSRV, SYNCING, WAITING, OFFLINE
    order = [S, L, Y, W, O]
    ranks = [order.index(s) for s in states]
    assert ranks == sorted(ranks), render(after)


valid_public = st.sampled_from([S, Y, W, L, O])
local_state = st.sampled_from([UP, ON, OFF])


@st.composite
def arbitrary_chains(draw):
    n = draw(st.integers(1, 5))
    states = draw(st.lists(valid_public, min_size=n, max_size=n))
    # a chain the state machine can be handed: at most one SYNCING (it never makes a second one)
    seen_syncing = False
    for i, s in enumerate(states):
        if s == Y:
            if seen_syncing:
                states[i] = W
            seen_syncing = True
    targets = [ChainTarget(i + 1, s) for i, s in enumerate(states)]
    local = {t.target_id: draw(local_state) for t in targets}
    return targets, local


@settings(max_examples=500, deadline=None)
@given(arbitrary_chains())
def test_one_round_keeps_invariants(case) -> None:
    targets, local = case
    after = next_chain(targets, local)
    assert [t.state for t in after].count(Y) <= 1
    assert sorted(t.target_id for t in after) == sorted(t.target_id for t in targets)
    if S in [t.state for t in after]:
        assert after[0].state == S
    # a round is a fixpoint once applied twice with unchanged local states, except for the single
    # step a returning target takes (WAITING -> SYNCING after another target became SERVING)
    again = next_chain(after, local)
    assert sorted(t.target_id for t in again) == sorted(t.target_id for t in targets)


class ChainModel(RuleBasedStateMachine):
    """Random local-state changes, rounds and manual operations on one chain, as mgmtd drives it:
    every change bumps the version, and only a change does."""

    @initialize(n=st.integers(1, 5))
    def start(self, n: int) -> None:
        self.targets = [ChainTarget(i, S) for i in range(1, n + 1)]
        self.local = {i: UP for i in range(1, n + 1)}
        self.version = 1
        self.members = {t.target_id for t in self.targets}

    def _apply(self, new: list[ChainTarget]) -> None:
        before = self.targets
        check_invariants(before, new)
        old_version = self.version
        if new != before:
            self.version += 1
        self.targets = new
        assert (self.version > old_version) == (new != before)

    @rule(i=st.integers(0, 4), state=local_state)
    def local_change(self, i: int, state: LocalState) -> None:
        tid = self.targets[i % len(self.targets)].target_id
        self.local[tid] = state

    @rule()
    def sync_finishes(self) -> None:
        # the storage side: a SYNCING target whose predecessor copied everything reports UPTODATE
        for t in self.targets:
            if t.state == Y and self.local[t.target_id] == ON:
                self.local[t.target_id] = UP

    @rule()
    def storage_reacts_to_routing(self) -> None:
        # the storage side: an UPTODATE target that routing shows out of the data path drops its
        # data view and comes back ONLINE, so that it resyncs
        for t in self.targets:
            if t.state in (W, O) and self.local[t.target_id] == UP:
                self.local[t.target_id] = ON

    @rule()
    def round(self) -> None:
        self._apply(next_chain(self.targets, self.local))

    @rule(i=st.integers(0, 4), force=st.booleans())
    def admin_offline(self, i: int, force: bool) -> None:
        tid = self.targets[i % len(self.targets)].target_id
        try:
            new = offline_target(self.targets, tid, force=force)
        except FS3Error:
            return
        # forced on the last server, the next target takes over as LASTSRV: the chain stays well
        # formed, and keeps a target that may serve
        self._apply(new)
        self._apply(next_chain(self.targets, self.local))

    @rule()
    def admin_rotate_lastsrv(self) -> None:
        try:
            new = rotate_lastsrv(self.targets)
        except FS3Error:
            return
        self._apply(new)

    @rule(perm=st.permutations(range(5)))
    def admin_rotate_preferred(self, perm: list[int]) -> None:
        preferred = sorted(self.members, key=lambda tid: perm[(tid - 1) % 5])
        self._apply(rotate_to_preferred(self.targets, preferred))

    @invariant()
    def always_a_last_server(self) -> None:
        """Some target may serve (SERVING, or the LASTSRV that serves once back): neither rounds
        nor manual operations leave a chain that waits forever."""
        if hasattr(self, "targets"):
            assert any(t.state in (S, L) for t in self.targets), render(self.targets)

    @invariant()
    def membership_is_fixed(self) -> None:
        if hasattr(self, "targets"):
            assert {t.target_id for t in self.targets} == self.members

    @invariant()
    def all_online_converges_to_all_serving(self) -> None:
        """With every target back and syncs completing, a few rounds make every target SERVING
        whenever some target can still serve (a SERVING target, or the LASTSRV head online)."""
        if not hasattr(self, "targets"):
            return
        targets, local = list(self.targets), dict(self.local)
        for tid in local:
            local[tid] = UP if local[tid] == UP else ON
        for _ in range(4 * len(targets) + 2):
            targets = next_chain(targets, local)
            for t in targets:
                if t.state == Y:
                    local[t.target_id] = UP
                elif t.state in (W, O) and local[t.target_id] == UP:
                    local[t.target_id] = ON
        assert all(t.state == S for t in targets), render(targets)


TestChainModel = ChainModel.TestCase
TestChainModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
