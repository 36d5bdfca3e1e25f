"""Unmounting the scratch file systems storage tests mount (ramfs, tmpfs, loop devices)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def unmount(where: Path) -> None:
    """Unmount ``where``; lazily if it is still busy (a failed test may have left files open on
    it: the file system then goes when the process ends, instead of staying mounted for good)."""
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
