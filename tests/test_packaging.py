"""`pip install .` and `pip install -e .` both give importable fs3, fs3.meta, fs3.storage, fs3.client.

Each install goes into a fresh virtual environment, without dependencies (the four packages import
none at the top level). The wheel is built with this environment's setuptools; the editable install
uses pip's build isolation, as a user's would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPORT_ALL = (
    "import fs3, fs3.meta, fs3.storage, fs3.client, fs3.errors, fs3.config;"
    "print(fs3.meta.__file__); print(fs3.client.__name__)"
)

pytest.importorskip("setuptools", reason="building a wheel needs setuptools in the test environment")


def source_packages() -> list[str]:
    """Every __init__.py of the source tree, as the path it has inside an installed fs3."""
    mapping = {"fs3": "fs3", "meta": "fs3/meta", "storage": "fs3/storage", "client": "fs3/client"}
    out = []
    for top, installed in mapping.items():
        for init in (ROOT / top).rglob("__init__.py"):
            out.append(f"{installed}/{init.relative_to(ROOT / top).as_posix()}")
    return out


def copy_source(dst: Path) -> Path:
    ignore = shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", ".*cache", "tests"
    )
    shutil.copytree(ROOT, dst, ignore=ignore)
    return dst


def fresh_venv(path: Path) -> Path:
    """A virtual environment without pip of its own (ensurepip takes seconds of CPU): :func:`pip`
    installs into it with this environment's pip."""
    venv.EnvBuilder(with_pip=False).create(path)
    return path / "bin" / "python"


def pip(py: Path, *args: str | Path, cwd: Path) -> str:
    """``pip ARGS`` run for the environment of ``py`` (pip's ``--python``), by this environment's pip."""
    return run(sys.executable, "-m", "pip", "--python", py, *args, cwd=cwd)


def run(*cmd, cwd: Path) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.timeout(300)
def test_wheel_installs_and_imports_all_packages(tmp_path):
    src = copy_source(tmp_path / "src")
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp_path / "dist",
        ".",
        cwd=src,
    )
    (wheel,) = (tmp_path / "dist").glob("fs3-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for mod in (
        "fs3/__init__.py",
        "fs3/meta/__init__.py",
        "fs3/storage/__init__.py",
        "fs3/client/__init__.py",
        "fs3/proto/common_pb2.py",
    ):
        assert mod in names
    assert not any(n.startswith(("meta/", "storage/", "client/")) for n in names), (
        "generic top-level names leaked"
    )
    py = fresh_venv(tmp_path / "venv")
    pip(py, "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    out = run(py, "-c", IMPORT_ALL, cwd=tmp_path)
    assert "site-packages/fs3/meta/__init__.py" in out
    assert "fs3 0.1.0" in run(tmp_path / "venv" / "bin" / "fs3", "--version", cwd=tmp_path)


@pytest.mark.timeout(300)
def test_editable_install_imports_all_packages(tmp_path):
    src = copy_source(tmp_path / "src")
    py = fresh_venv(tmp_path / "venv")
    # build isolation: the fresh environment fetches its own setuptools, as a user's would
    pip(py, "install", "-q", "--no-deps", "-e", src, cwd=tmp_path)
    # from elsewhere, through the editable finder, and from the checkout itself
    assert str(src / "meta" / "__init__.py") in run(py, "-c", IMPORT_ALL, cwd=tmp_path)
    assert str(src / "meta" / "__init__.py") in run(py, "-c", IMPORT_ALL, cwd=src)


def test_make_installs_what_a_fresh_debian_needs_to_build_the_venv() -> None:
    """python3 -m venv needs python3-venv on Debian, and pip builds pyfuse3 from source (gcc and
    the Python headers): make's system-packages step must install them."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("SYSTEM_PACKAGES :="))
    packages = set(line.split(":=", 1)[1].split())
    assert {"python3-venv", "python3-dev", "gcc", "fuse3", "libfuse3-dev", "pkg-config"} <= packages
