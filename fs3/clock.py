"""The steady clock that fs3's leases and sessions are timed on."""

from __future__ import annotations

import time

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def boottime() -> float:
    """Seconds on a clock that never steps and goes on while the machine is suspended
    (CLOCK_BOOTTIME; monotonic where there is none): a lease or a session timed on it runs out
    during a suspend, as it does for the other machines."""
    return time.clock_gettime(_BOOTTIME)
