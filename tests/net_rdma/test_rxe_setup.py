"""deploy/rxe-setup.sh: clear messages and exit codes where Soft-RoCE cannot be set up, never a hang.

Creating a device changes the machine, so only the failure paths run: on this machine for real, and
everywhere with stand-in ``rdma``/``id`` tools in front of PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)
SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "rxe-setup.sh"


def _iface() -> str:
    return "lo"  # exists everywhere


def run(
    *args: str, path_dir: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, **(env or {}))
    if path_dir is not None:
        e["PATH"] = f"{path_dir}:{e['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=45, env=e)


def _tool(d: Path, name: str, body: str) -> None:
    p = d / name
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)


def test_usage_and_unknown_interface() -> None:
    r = run()
    assert r.returncode == 2 and "usage" in r.stderr
    r = run("no-such-if0")
    assert r.returncode == 2 and "no network interface 'no-such-if0'" in r.stderr
    r = run(_iface(), "bad name")
    assert r.returncode == 2


def test_kernel_without_rdma_netlink_is_explained(tmp_path: Path) -> None:
    _tool(tmp_path, "id", "echo 0")
    _tool(tmp_path, "rdma", 'echo "Failed to open NETLINK_RDMA socket" >&2; exit 1')
    r = run(_iface(), path_dir=tmp_path)
    assert r.returncode == 4
    assert "no RDMA netlink support" in r.stderr and "NETLINK_RDMA" in r.stderr and "TCP" in r.stderr


def test_a_hanging_tool_times_out(tmp_path: Path) -> None:
    _tool(tmp_path, "id", "echo 0")
    _tool(tmp_path, "rdma", "sleep 30")
    r = run(_iface(), path_dir=tmp_path, env={"RXE_SETUP_TIMEOUT": "1"})
    assert r.returncode == 4 and "timed out" in r.stderr


def test_missing_module_is_explained(tmp_path: Path) -> None:
    if Path("/sys/module/rdma_rxe").exists():
        pytest.skip("rdma_rxe is loaded on this machine")
    _tool(tmp_path, "id", "echo 0")
    _tool(tmp_path, "rdma", "exit 0")  # netlink fine, no links yet
    _tool(tmp_path, "modprobe", 'echo "modprobe: FATAL: Module rdma_rxe not found" >&2; exit 1')
    r = run(_iface(), path_dir=tmp_path)
    assert r.returncode == 4 and "cannot load the rdma_rxe kernel module" in r.stderr


def test_existing_device_is_kept(tmp_path: Path) -> None:
    _tool(tmp_path, "id", "echo 0")
    _tool(tmp_path, "rdma", f'echo "link rxe7/1 state ACTIVE physical_state LINK_UP netdev {_iface()}"')
    r = run(_iface(), path_dir=tmp_path)
    assert r.returncode == 0 and "already has RDMA device 'rxe7'" in r.stdout


def test_this_machine() -> None:
    """The real tools, as root: here (no RDMA netlink) the script must fail fast with the reason."""
    if shutil.which("rdma") is None:
        pytest.skip("the rdma tool (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("needs root to get past the permission check")
    probe = subprocess.run(["rdma", "link", "show"], capture_output=True, text=True, timeout=20)
    if probe.returncode == 0:
        pytest.skip("this kernel has RDMA netlink; not creating a device from a test")
    r = run(_iface())
    assert r.returncode == 4 and "no RDMA netlink support" in r.stderr
