"""The retry loop behind :meth:`fs3.kv.base.Database.run`, modelled on FoundationDB's ``@transactional``."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from fs3.errors import FS3Error, StatusCode

if TYPE_CHECKING:
    from fs3.kv.base import Database, Transaction

log = logging.getLogger(__name__)

T = TypeVar("T")

# Backoff doubles from the first delay up to the cap; jitter keeps colliding writers from retrying
# in lockstep. The cap is FoundationDB's; the first delay is shorter than its 10 ms because our
# embedded engine resolves conflicts locally in well under a millisecond.
FIRST_BACKOFF_S = 0.002
MAX_BACKOFF_S = 1.0


async def run_transaction(
    db: Database,
    fn: Callable[[Transaction], Awaitable[T]],
    *,
    max_attempts: int = 20,
    read_only: bool = False,
) -> T:
    """Run ``fn`` in fresh transactions until one commits; see :meth:`Database.run`.

    Only KV_CONFLICT is retried: any other error (including one raised by ``fn``) cancels the
    transaction and propagates. After ``max_attempts`` conflicts the last one is chained to a
    KV_RETRY_LIMIT error.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be positive, got {max_attempts}")
    backoff = FIRST_BACKOFF_S
    for attempt in range(1, max_attempts + 1):
        tr = db.create_transaction()
        try:
            result = await fn(tr)
            if read_only:
                tr.cancel()
            else:
                await tr.commit()
            return result
        except FS3Error as e:
            tr.cancel()
            if e.code != StatusCode.KV_CONFLICT:
                raise
            if attempt == max_attempts:
                raise FS3Error(
                    StatusCode.KV_RETRY_LIMIT, f"gave up after {max_attempts} conflicting attempts"
                ) from e
            log.debug("kv transaction conflict attempt=%d backoff_s=%.4f", attempt, backoff)
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        except BaseException:
            tr.cancel()
            raise
    raise AssertionError("unreachable")
