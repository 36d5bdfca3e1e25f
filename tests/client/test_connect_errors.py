"""FileSystem.connect that reaches no mgmtd says which cluster it tried, as fs3 admin does: it
raised a bare "UNAVAILABLE: mgmtd 127.0.0.1:8000: failed to connect" after its wait."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster import free_port

from fs3.client import FileSystem
from fs3.client.mgmtd_client import MgmtdUnreachable

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]


async def test_a_named_cluster_that_does_not_answer(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "client.toml"
    cfg.write_text(f'mgmtd_addresses = ["{dead}"]\n')
    with pytest.raises(MgmtdUnreachable) as e:
        await FileSystem.connect(cfg, timeout_s=1.0)
    assert f"is the cluster running? mgmtd_addresses {dead} (from {cfg})" in e.value.message


async def test_no_cluster_named_and_none_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FS3_LOCAL_DIR", str(tmp_path / "none"))
    monkeypatch.delenv("FS3_MGMTD_ADDRESSES", raising=False)
    with pytest.raises(MgmtdUnreachable) as e:
        await FileSystem.connect(timeout_s=1.0)
    assert "no cluster was named and there is no fs3 local cluster" in e.value.message
