"""Acknowledged data survives random SIGKILLs of storage, meta and mgmtd daemons.

Opt-in, since a meaningful run takes minutes: ``FS3_CHAOS_CYCLES=N`` runs N kill/restart cycles
(about 5 s each), ``FS3_CHAOS_SEED`` picks the random choices (the default is fixed), and
``FS3_CHAOS_RETRY_S=S`` cuts the clients' retry budget (30 s for meta, 60 s for storage, longer than
any daemon stays down) to S seconds, so that operations fail and what they leave is checked. For
example::

    FS3_CHAOS_CYCLES=50 FS3_CHAOS_SEED=7 python -m pytest -q tests/chaos
    FS3_CHAOS_CYCLES=15 FS3_CHAOS_RETRY_S=1.5 python -m pytest -q tests/chaos

What is checked, and why, is in chaos_workload.py's docstring. A failure message names the seed and
the kills, so that a run can be repeated (thread scheduling makes a repeat likely, not certain, to
take the same path).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chaos_workload import WorkloadConfig, run_workload

CYCLES = int(os.environ.get("FS3_CHAOS_CYCLES") or 0)
SEED = int(os.environ.get("FS3_CHAOS_SEED") or 20261201)
RETRY_S = float(os.environ.get("FS3_CHAOS_RETRY_S") or 0) or None


@pytest.mark.skipif(
    CYCLES <= 0,
    reason="set FS3_CHAOS_CYCLES=N to run N kill/restart cycles (about 5 s each); see tests/chaos/test_chaos.py",
)
@pytest.mark.timeout(600 + 20 * CYCLES)  # cycles, the final settling (up to 6 min), and slack
async def test_acknowledged_data_survives_random_daemon_kills(tmp_path: Path) -> None:
    findings = await run_workload(tmp_path, WorkloadConfig(seed=SEED, cycles=CYCLES, client_retry_s=RETRY_S))

    assert findings.ops["seqwrite"] > 0 and findings.ops["reader"] > 0, f"no work was done: {findings.ops}"
    if findings.problems:
        pytest.fail(
            f"{len(findings.problems)} problem(s) with FS3_CHAOS_SEED={SEED} FS3_CHAOS_CYCLES={CYCLES}"
            f" FS3_CHAOS_RETRY_S={RETRY_S or ''}:\n"
            + "\n".join(findings.problems[:30])
            + f"\noperations: {dict(findings.ops)}\nfailures: {dict(findings.errors)}"
            + "\nkills:\n"
            + "\n".join(findings.events),
            pytrace=False,
        )
