"""The README's Python example runs as written against a fresh local cluster (it once wrote into
/data, which no fresh cluster has)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ops_helpers import REPO

pytestmark = pytest.mark.timeout(120)


def test_the_readme_python_example_runs(small_cluster: Path) -> None:
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S)
    assert block is not None, "the README has no Python example"
    code = block.group(1).replace(
        "/path/to/run-dir/config/client.toml", str(small_cluster / "config" / "client.toml")
    )
    assert str(small_cluster) in code, "the example no longer connects with a client.toml path"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(4 << 20), "[b'...tensor bytes...', None]"], out.stdout
