"""Looking for reference cycles: a daemon or a mount runs the cyclic collector seldom
(``fs3.daemon.settle_gc``), so whatever a cycle holds (an error's traceback holding the frames
that hold a payload, say) stays in memory until a full collection."""

from __future__ import annotations

import asyncio
import gc
import time
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cycles_kept() -> Iterator[list[object]]:
    """Within: the cyclic collector is off. After: the list holds what a collection found only it
    could free (the objects of unreachable cycles)."""
    gc.collect()
    found: list[object] = []
    gc.disable()
    try:
        yield found
    finally:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found.extend(gc.garbage)
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
            gc.enable()


async def released(watch: weakref.ref[object], timeout_s: float = 2.0) -> bool:
    """Whether what ``watch`` refers to is freed within ``timeout_s``, with the cyclic collector
    off: an object a cycle holds never is, while a reference a thread drops just after handing back
    its result (an executor's worker deletes its work item only then) goes once that thread runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        if watch() is None:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)


def buffers(objects: list[object]) -> list[str]:
    """The buffers of 4 KiB or more among ``objects``, and among what the frames among them hold
    (bytes are not tracked by the collector: a cycle of frames shows only its frames)."""
    found = []
    seen: set[int] = set()

    def look(o: object) -> None:
        if id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, (bytes, bytearray)) and len(o) >= 4096:
            found.append(f"{type(o).__name__} of {len(o)} bytes")
        elif isinstance(o, memoryview):
            try:
                if o.nbytes >= 4096:
                    found.append(f"memoryview of {o.nbytes} bytes")
            except ValueError:  # released
                pass

    for o in objects:
        look(o)
        if isinstance(o, types.FrameType):
            for v in o.f_locals.values():
                look(v)
                if isinstance(v, (list, tuple)):
                    for item in v[:1000]:
                        look(item)
    return found


def frames(objects: list[object]) -> list[str]:
    """The functions whose frames are among ``objects``."""
    return sorted({o.f_code.co_qualname for o in objects if isinstance(o, types.FrameType)})
