"""fs3.memory.tune_malloc: fixed glibc thresholds stop 1 MiB buffers from faulting their pages in
afresh each time (what made the storage benchmark's "read 1MiB" swing between runs). Each case
runs in a Python process of its own: the settings are process-wide."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from fs3.memory import tune_malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")

#: per fresh 1 MiB ``bytes``, page faults of a process that allocates three, frees them, again and
#: again (as a reader of 1 MiB blocks with a few in flight does); argv[1]: how it is tuned first
_FAULTS = r"""
import json, resource, sys

how = sys.argv[1]
if how == "tune_malloc":
    from fs3.memory import tune_malloc
    assert tune_malloc()
src = bytearray(1 << 20)


def cycle():
    blocks = [bytes(src) for _ in range(3)]
    del blocks


for _ in range(5):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    cycle()
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 300))
"""


def _faults_per_mib(how: str) -> float:
    proc = subprocess.run([sys.executable, "-c", _FAULTS, how], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_tuned_process_reuses_its_1mib_buffers_without_faulting() -> None:
    """A 1 MiB block is 256 pages; untuned, glibc cut the heap back after each round and every
    block faulted ~160 of them in again (each zeroed by the kernel). Tuned, the freed blocks are
    reused as they are."""
    tuned = _faults_per_mib("tune_malloc")
    assert tuned < 8, f"{tuned} page faults per 1 MiB allocation after tune_malloc()"


def test_out_of_range_thresholds_are_refused_and_change_nothing() -> None:
    with pytest.raises(ValueError, match="mmap_threshold must be 1 .. 33554432 bytes, not 67108864"):
        tune_malloc(mmap_threshold=64 << 20)
    with pytest.raises(ValueError, match="mmap_threshold"):
        tune_malloc(mmap_threshold=0)
    with pytest.raises(ValueError, match="trim_threshold must be > 0 bytes, not -1"):
        tune_malloc(trim_threshold=-1)
    # a float or a bool failed only at the second mallopt (or passed as 1 byte), after the first
    # had changed glibc's settings (review); refused before either now
    with pytest.raises(TypeError, match="mmap_threshold must be an int"):
        tune_malloc(mmap_threshold=4194304.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trim_threshold must be an int"):
        tune_malloc(trim_threshold=True)
