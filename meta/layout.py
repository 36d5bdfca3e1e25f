"""File layouts: which chains hold a file's chunks (DESIGN §7, reference notes §2.2).

A new file takes its directory's default layout (chain table id, chunk size, stripe count) and gets
``stripe_count`` chains: a window of the chain table starting at a round-robin base (kept per table
and stripe in each meta process, starting at a random offset, so consecutive files spread evenly),
permuted by :func:`fs3.placement.shuffle` with a fresh random seed. The algorithm id and seed are
stored in the layout with the resulting list, so anyone can re-derive and check it.

Chains with a target low on space (storage reports it at 4% free, mgmtd publishes it in routing info)
are passed over: the window is then the first ``stripe_count`` other chains from the base on, in table
order, and a file gets fewer chains than its stripe count when fewer have room. Only when every chain
of the table is low on space do new files go to them anyway (their writes then fail with ENOSPC where
storage has no room left, as they would on any full file system).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fs3.errors import FS3Error, StatusCode
from fs3.placement import SHUFFLE_SPLITMIX64_FY, shuffle
from fs3.proto import meta_pb2

MIN_CHUNK_SIZE = 64 << 10
MAX_CHUNK_SIZE = 64 << 20
DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_STRIPE = 1
MAX_STRIPE = 1024


@dataclass(frozen=True, slots=True)
class ChainTable:
    """One version of a chain table: its ordered chain ids."""

    table_id: int
    version: int
    chains: tuple[int, ...]
    # Chains of the table with a target low on space: new files avoid them.
    low_space: frozenset[int] = frozenset()


# Returns the chain table with this id (newest version), or None when unknown.
ChainTableSource = Callable[[int], ChainTable | None]


def static_tables(tables: Sequence[ChainTable]) -> ChainTableSource:
    """A source over fixed tables (tests, and meta without mgmtd)."""
    by_id = {t.table_id: t for t in tables}
    return by_id.get


def check_layout_params(chunk_size: int, stripe: int) -> None:
    if chunk_size and (chunk_size & (chunk_size - 1) or not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE):
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"chunk size {chunk_size} must be a power of two in {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}",
        )
    if stripe and not 1 <= stripe <= MAX_STRIPE:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"stripe count {stripe} must be 1..{MAX_STRIPE}")


class ChainAllocator:
    """Chooses file layouts from chain tables (see the module docstring)."""

    def __init__(
        self,
        tables: ChainTableSource,
        *,
        default_table: int = 1,
        default_chunk_size: int = DEFAULT_CHUNK_SIZE,
        default_stripe: int = DEFAULT_STRIPE,
        rng: random.Random | None = None,
        refresh: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        check_layout_params(default_chunk_size, default_stripe)
        self._tables = tables
        self._refresh = refresh
        self._rng = rng or random.Random()
        self._counters: dict[tuple[int, int], int] = {}
        self.default = meta_pb2.Layout(
            chain_table_id=default_table, chunk_size=default_chunk_size, stripe_count=default_stripe
        )

    def has_table(self, table_id: int) -> bool:
        """Whether chain table ``table_id`` exists (with chains), as routing has it now."""
        table = self._tables(table_id)
        return table is not None and bool(table.chains)

    async def knows_table(self, table_id: int) -> bool:
        """:meth:`has_table`, asking mgmtd first where routing has no such table yet: one uploaded
        a moment ago was refused until the next routing refresh (2 s) reached this process."""
        if self.has_table(table_id):
            return True
        if self._refresh is not None:
            with contextlib.suppress(FS3Error, TimeoutError):
                await self._refresh()
        return self.has_table(table_id)

    def file_layout(
        self, template: meta_pb2.Layout | None, into: meta_pb2.Layout | None = None
    ) -> meta_pb2.Layout:
        """A new file's layout from its directory's default ``template`` (zero fields: defaults),
        made in ``into`` (an empty Layout, such as a new inode's: no copy) when given.

        Without a chain table the file gets no chains (it can hold no data: writes fail at the
        client), so the namespace still works before storage is set up."""
        d = self.default
        table_id = (template.chain_table_id if template is not None else 0) or d.chain_table_id
        chunk = (template.chunk_size if template is not None else 0) or d.chunk_size
        stripe = (template.stripe_count if template is not None else 0) or d.stripe_count
        layout = meta_pb2.Layout() if into is None else into
        layout.chain_table_id = table_id
        layout.chunk_size = chunk
        table = self._tables(table_id)
        if table is None or not table.chains:
            layout.stripe_count = stripe
            return layout
        chains = table.chains
        n = len(chains)
        low = table.low_space
        roomy = n - sum(1 for c in chains if c in low) if low else n
        avoid = low if roomy else frozenset()
        stripe = min(stripe, roomy or n)
        key = (table_id, stripe)
        base = self._counters.get(key)
        if base is None:
            base = self._rng.randrange(n)
        if avoid:
            while chains[base] in avoid:
                base = (base + 1) % n
            window, i = [], base
            while len(window) < stripe:
                if chains[i] not in avoid:
                    window.append(chains[i])
                i = (i + 1) % n
            self._counters[key] = i
        else:
            window = [chains[(base + i) % n] for i in range(stripe)]
            self._counters[key] = (base + stripe) % n
        seed = self._rng.getrandbits(64)
        layout.chain_table_version = table.version
        layout.stripe_count = stripe
        layout.base_index = base
        layout.shuffle_algorithm = SHUFFLE_SPLITMIX64_FY
        layout.shuffle_seed = seed
        layout.chains.extend(shuffle(window, seed, SHUFFLE_SPLITMIX64_FY))
        return layout


def max_file_size(layout: meta_pb2.Layout) -> int:
    """Chunk indexes are u32 on storage, so a file ends at ``chunk_size × 2**32``."""
    return (layout.chunk_size or DEFAULT_CHUNK_SIZE) << 32
