"""Chaos tests run over a real cluster: tests/cluster.py (mgmtd, storage) and tests/client/fs_cluster.py
(meta)."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for p in (str(_HERE.parent), str(_HERE.parent / "client"), str(_HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)
