"""Chain-table generation (balanced recovery load) and the portable layout shuffle."""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fs3.placement import SplitMix64, generate_chains, shuffle


def test_splitmix64_matches_the_reference_outputs():
    # First outputs of the reference C implementation (Vigna's splitmix64.c) for seed 0.
    rng = SplitMix64(0)
    assert [rng.next() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_shuffle_is_pinned_forever():
    # A layout stored today must map chunks to the same chains in every future release.
    assert shuffle(range(10), 42) == [0, 9, 5, 8, 6, 4, 7, 2, 1, 3]
    with pytest.raises(ValueError, match="unknown shuffle algorithm"):
        shuffle(range(3), 1, algorithm=99)


@given(st.lists(st.integers(), max_size=50), st.integers(min_value=0, max_value=2**64 - 1))
def test_shuffle_is_a_permutation(items, seed):
    assert sorted(shuffle(items, seed)) == sorted(items)


def test_shuffle_is_close_to_uniform():
    firsts = collections.Counter(shuffle(range(5), seed)[0] for seed in range(5000))
    assert all(800 < firsts[i] < 1200 for i in range(5)), firsts


# (nodes, targets per disk, replicas): shapes with and without an exact balanced design
SHAPES = [
    (3, 1, 3),
    (5, 6, 3),
    (7, 3, 3),
    (6, 4, 2),
    (10, 6, 3),
    (12, 10, 3),
    (20, 12, 3),
    (9, 4, 3),
    (8, 7, 4),
]


@pytest.mark.parametrize("nodes, per_disk, replicas", SHAPES)
def test_every_pair_of_nodes_shares_nearly_the_same_number_of_chains(nodes, per_disk, replicas):
    disks = 2
    p = generate_chains(nodes, disks, per_disk, replicas)
    lo, hi = p.pair_spread
    ideal = per_disk * (replicas - 1) / (nodes - 1) * disks
    assert hi - lo <= disks, (lo, hi)  # off by at most one chain per disk slot
    assert lo <= ideal <= hi
    # recount from the chains themselves rather than trusting pair_counts
    node_of = {t.target_id: t.node_id for t in p.targets}
    shared = collections.Counter()
    for c in p.chains:
        for a, b in itertools.combinations(sorted(node_of[t] for t in c.target_ids), 2):
            shared[(a, b)] += 1
    assert dict(shared) == {k: v for k, v in p.pair_counts.items() if v}


@pytest.mark.parametrize("nodes, per_disk, replicas", [(7, 3, 3), (5, 6, 3), (4, 3, 4)])
def test_exact_designs_are_found_where_they_exist(nodes, per_disk, replicas):
    p = generate_chains(nodes, 1, per_disk, replicas)
    assert p.pair_spread[0] == p.pair_spread[1] == per_disk * (replicas - 1) // (nodes - 1)


@pytest.mark.parametrize("nodes, disks, per_disk, replicas", [(5, 3, 6, 3), (3, 2, 2, 3), (6, 1, 4, 2)])
def test_structure(nodes, disks, per_disk, replicas):
    p = generate_chains(nodes, disks, per_disk, replicas)
    assert len(p.chains) == nodes * disks * per_disk // replicas
    assert len(p.targets) == nodes * disks * per_disk
    ids = [t.target_id for t in p.targets]
    assert len(set(ids)) == len(ids)
    in_chains = [t for c in p.chains for t in c.target_ids]
    assert sorted(in_chains) == sorted(ids), "every target in exactly one chain"
    by_id = {t.target_id: t for t in p.targets}
    for c in p.chains:
        members = [by_id[t] for t in c.target_ids]
        assert len({m.node_id for m in members}) == replicas, "replicas on distinct nodes"
        assert len({m.disk_index for m in members}) == 1, "a chain stays on one disk slot"
    per_node_disk = collections.Counter((t.node_id, t.disk_index) for t in p.targets)
    assert set(per_node_disk.values()) == {per_disk}
    assert p.chain_table == [c.chain_id for c in p.chains]
    assert len(set(p.chain_table)) == len(p.chain_table)


@pytest.mark.parametrize(
    "args, needle",
    [
        ((2, 1, 1, 3), "at least 3 nodes"),
        ((4, 1, 1, 3), "multiple of replicas"),
        ((0, 1, 1, 1), "at least 1"),
    ],
)
def test_impossible_shapes_are_refused(args, needle):
    with pytest.raises(ValueError, match=needle):
        generate_chains(*args)


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 12), st.integers(1, 8), st.integers(2, 3))
def test_balance_holds_for_random_shapes(nodes, per_disk, replicas):
    if (nodes * per_disk) % replicas:
        return
    p = generate_chains(nodes, 1, per_disk, replicas)
    lo, hi = p.pair_spread
    assert hi - lo <= 1
