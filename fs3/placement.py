"""Data placement: the chain-table generator and the portable shuffle of file layouts.

**Chains.** A cluster of ``nodes`` storage nodes, each with ``disks`` disks carrying
``targets_per_disk`` targets, is cut into chains of ``replicas`` targets on distinct nodes. When a node
fails, each chain it belonged to is read back from its surviving members; recovery traffic is balanced
when every pair of nodes shares as nearly the same number of chains as possible (a balanced incomplete
block design where one exists, reference notes §2.4). :func:`generate_chains` finds such a grouping by
seeded local search on the sum of squared pair counts, which is smallest exactly when pair counts are
as equal as the sizes allow; as in 3FS the grouping found for disk slot 0 is repeated for every slot,
so a chain's targets sit on the same disk slot of different nodes.

**Layouts.** A file's chunk → chain list is a window of the chain table permuted by a seeded
shuffle. The shuffle must give the same permutation on every client, in every language and version,
forever (3FS was bitten by a libstdc++ change, reference notes §2.2), so it is defined here from
scratch: SplitMix64 as the generator, Fisher–Yates with rejection sampling as the shuffle, and the
algorithm id stored in the layout.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

MASK64 = (1 << 64) - 1
SHUFFLE_SPLITMIX64_FY = 1  # algorithm id stored in Layout.shuffle_algorithm


class SplitMix64:
    """Steele, Lea and Flood's SplitMix64: 64-bit state, 64-bit outputs, trivially portable."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """Uniform in [0, n) without modulo bias (rejection sampling)."""
        if n <= 0:
            raise ValueError("n must be positive")
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            x = self.next()
            if x < limit:
                return x % n


def shuffle(items: Sequence[int], seed: int, algorithm: int = SHUFFLE_SPLITMIX64_FY) -> list[int]:
    """The permutation of ``items`` a layout with this seed and algorithm id denotes."""
    if algorithm != SHUFFLE_SPLITMIX64_FY:
        raise ValueError(f"unknown shuffle algorithm {algorithm}")
    out = list(items)
    rng = SplitMix64(seed)
    for i in range(len(out) - 1, 0, -1):
        j = rng.below(i + 1)
        out[i], out[j] = out[j], out[i]
    return out


@dataclass(frozen=True, slots=True)
class Target:
    target_id: int
    node_id: int
    disk_index: int


@dataclass(frozen=True, slots=True)
class Chain:
    chain_id: int
    target_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    targets: list[Target]
    chains: list[Chain]
    chain_table: list[int]  # chain ids, in table order
    pair_counts: dict[tuple[int, int], int]  # (node a, node b), a < b → chains they share

    @property
    def pair_spread(self) -> tuple[int, int]:
        values = self.pair_counts.values()
        return (min(values), max(values)) if self.pair_counts else (0, 0)


def target_id(node_id: int, disk_index: int, target_index: int) -> int:
    """Readable target ids: node, disk slot (1-based) and target (1-based) as decimal digits."""
    return (node_id * 1000 + disk_index + 1) * 100 + target_index + 1


def chain_id(disk_index: int, group_index: int) -> int:
    return (disk_index + 1) * 100_000 + group_index + 1


def _pair_cost(groups: list[list[int]], nodes: int) -> tuple[list[list[int]], int]:
    counts = [[0] * nodes for _ in range(nodes)]
    for g in groups:
        for a, b in itertools.combinations(g, 2):
            counts[a][b] += 1
            counts[b][a] += 1
    cost = sum(counts[a][b] ** 2 for a in range(nodes) for b in range(a + 1, nodes))
    return counts, cost


def _delta(counts: list[list[int]], group: list[int], old: int, new: int) -> int:
    """Change of the squared-pair-count sum when ``old`` in ``group`` is replaced by ``new``."""
    d = 0
    for m in group:
        if m == old:
            continue
        c_old = counts[old][m]
        c_new = counts[new][m]
        d += (c_old - 1) ** 2 - c_old**2 + (c_new + 1) ** 2 - c_new**2
    return d


def _apply(counts: list[list[int]], group: list[int], old: int, new: int) -> None:
    for m in group:
        if m == old:
            continue
        counts[old][m] -= 1
        counts[m][old] -= 1
        counts[new][m] += 1
        counts[m][new] += 1
    group[group.index(old)] = new


def _spread(counts: list[list[int]]) -> int:
    values = [counts[a][b] for a in range(len(counts)) for b in range(a + 1, len(counts))]
    return max(values) - min(values)


def _improve_pair(counts: list[list[int]], g1: list[int], g2: list[int]) -> bool:
    """Swap one member of g1 with one of g2 if that lowers the squared-pair-count sum."""
    for a in list(g1):
        if a in g2:
            continue
        best: tuple[int, int] | None = None
        for b in g2:
            if b in g1:
                continue
            d = _delta(counts, g1, a, b)
            _apply(counts, g1, a, b)
            d += _delta(counts, g2, b, a)
            _apply(counts, g1, b, a)
            if d < 0 and (best is None or d < best[0]):
                best = (d, b)
        if best is not None:
            _apply(counts, g1, a, best[1])
            _apply(counts, g2, best[1], a)
            return True
    return False


def _random_swap(rng: random.Random, counts: list[list[int]], groups: list[list[int]]) -> None:
    for _ in range(20):
        g1, g2 = rng.sample(groups, 2)
        a, b = rng.choice(g1), rng.choice(g2)
        if a not in g2 and b not in g1:
            _apply(counts, g1, a, b)
            _apply(counts, g2, b, a)
            return


def balanced_groups(
    nodes: int, per_node: int, replicas: int, *, seed: int = 0, rounds: int = 200
) -> list[list[int]]:
    """``nodes * per_node / replicas`` groups of ``replicas`` distinct nodes, each node in exactly
    ``per_node`` groups, with pair counts as even as local search finds."""
    if replicas < 1 or nodes < replicas:
        raise ValueError(f"need at least {replicas} nodes for {replicas} replicas, got {nodes}")
    if (nodes * per_node) % replicas:
        raise ValueError(
            f"nodes × targets per disk ({nodes} × {per_node}) must be a multiple of replicas ({replicas})"
        )
    n_groups = nodes * per_node // replicas
    # Start from consecutive windows of a round-robin sequence: each node appears per_node times,
    # and a window of `replicas` consecutive slots always holds distinct nodes since replicas <= nodes.
    seq = [i % nodes for i in range(nodes * per_node)]
    groups = [seq[g * replicas : (g + 1) * replicas] for g in range(n_groups)]
    if replicas == 1 or n_groups == 1:
        return groups
    rng = random.Random(seed)
    counts, cost = _pair_cost(groups, nodes)
    best_cost, best = cost, [list(g) for g in groups]
    for _ in range(rounds):
        improved = False
        for g1 in range(n_groups):
            g2 = rng.randrange(n_groups)
            if g1 != g2 and _improve_pair(counts, groups[g1], groups[g2]):
                improved = True
        if _spread(counts) <= 1:
            return groups
        cost = _pair_cost(groups, nodes)[1]
        if cost < best_cost:
            best_cost, best = cost, [list(g) for g in groups]
        elif not improved:
            # A local minimum that is not balanced: kick it with a few random swaps and search on.
            for _ in range(max(1, replicas)):
                _random_swap(rng, counts, groups)
    return best


def generate_chains(
    nodes: int,
    disks: int,
    targets_per_disk: int,
    replicas: int,
    *,
    node_ids: Sequence[int] | None = None,
    seed: int = 0,
) -> Placement:
    """Targets, chains and one chain table for the cluster shape (see the module docstring)."""
    if min(nodes, disks, targets_per_disk, replicas) < 1:
        raise ValueError("nodes, disks, targets per disk and replicas must all be at least 1")
    ids = list(node_ids) if node_ids is not None else [10001 + i for i in range(nodes)]
    if len(ids) != nodes or len(set(ids)) != nodes:
        raise ValueError("node ids must be distinct, one per node")
    groups = balanced_groups(nodes, targets_per_disk, replicas, seed=seed)
    targets: list[Target] = []
    chains: list[Chain] = []
    for disk in range(disks):
        used = [0] * nodes
        for g, group in enumerate(groups):
            tids = []
            for n in group:
                tid = target_id(ids[n], disk, used[n])
                used[n] += 1
                targets.append(Target(tid, ids[n], disk))
                tids.append(tid)
            chains.append(Chain(chain_id(disk, g), tuple(tids)))
    pair_counts = {}
    for a, b in itertools.combinations(range(nodes), 2):
        pair_counts[(ids[a], ids[b])] = 0
    for group in groups:
        for a, b in itertools.combinations(sorted(group), 2):
            pair_counts[(ids[a], ids[b])] += disks
    targets.sort(key=lambda t: t.target_id)
    return Placement(targets, chains, [c.chain_id for c in chains], pair_counts)
