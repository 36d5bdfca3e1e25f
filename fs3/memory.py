"""glibc malloc settings for processes that allocate a fresh buffer of ~1 MiB per I/O.

A read through the native client returns its data as a new ``bytes`` object. glibc serves an
allocation of 1 MiB from a fresh ``mmap`` until the first such block is freed, then raises its
mmap threshold to that size and its trim threshold to twice that (its "dynamic threshold"): from
then on these blocks come from the heap, and whenever frees leave more than ~2 MiB free at its top
the heap is cut back (``munmap``/``brk``), so the next allocations fault every page back in, each
one zeroed by the kernel. Which of the two a process lands in depends on what else it has
allocated: the storage benchmark's 1 MiB reads ran at 589 to 941 MiB/s across runs (0.63 to 1.25
ms of client CPU a read, ~23% of it in page faults); with the thresholds fixed at 4 MiB (mmap) and
64 MiB (trim) at 993 to 1,007 MiB/s (0.48 to 0.52 ms).

The settings are process-wide, so fs3 changes them only when asked: ``ClientConfig.tune_malloc``,
:func:`tune_malloc`, or glibc's own variables before the process starts
(``MALLOC_MMAP_THRESHOLD_=4194304 MALLOC_TRIM_THRESHOLD_=67108864``). The cost: up to the trim
threshold of freed memory per arena stays mapped (a mount gives it back when idle, see
``memory_trim_interval_s``), and blocks below the mmap threshold may fragment the heap.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MMAP_THRESHOLD", "DEFAULT_TRIM_THRESHOLD", "glibc_function", "tune_malloc"]

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit, 512 KiB on 32-bit)
_MAX_MMAP_THRESHOLD = 32 << 20 if ctypes.sizeof(ctypes.c_void_p) == 8 else 512 << 10

DEFAULT_MMAP_THRESHOLD = 4 << 20
DEFAULT_TRIM_THRESHOLD = 64 << 20


def glibc_function(name: str, argtypes: list[type], restype: type | None = None) -> Any:
    """The C function ``name`` of glibc, typed; None where the C library is not glibc or has no
    such function."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


def tune_malloc(
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD, trim_threshold: int = DEFAULT_TRIM_THRESHOLD
) -> bool:
    """Fix glibc's mmap and trim thresholds (bytes) for this process (see the module's doc).
    True once set; False where the C library is not glibc (nothing is changed). A threshold out of
    glibc's range is a ValueError, one not an int a TypeError: nothing is changed then either."""
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int (bytes), not {value!r}")
    if not 0 < mmap_threshold <= _MAX_MMAP_THRESHOLD:
        raise ValueError(f"mmap_threshold must be 1 .. {_MAX_MMAP_THRESHOLD} bytes, not {mmap_threshold}")
    if trim_threshold <= 0:
        raise ValueError(f"trim_threshold must be > 0 bytes, not {trim_threshold}")
    mallopt = glibc_function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    if mallopt is None:
        log.info("malloc not tuned: the C library is not glibc")
        return False
    # the trim threshold first: setting either one turns glibc's dynamic thresholds off
    if not mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)):
        raise ValueError(f"glibc refused trim_threshold={trim_threshold}")
    if not mallopt(_M_MMAP_THRESHOLD, mmap_threshold):
        raise ValueError(f"glibc refused mmap_threshold={mmap_threshold}")
    log.debug("malloc tuned mmap_threshold=%d trim_threshold=%d", mmap_threshold, trim_threshold)
    return True
