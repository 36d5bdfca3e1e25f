"""deploy/: systemd units that systemd accepts and that run a command accepting its config
template, templates in step with the config dataclasses, and a well-formed Grafana dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ops_helpers import REPO, alert_metrics, alert_rules, dashboard_metrics, fs3

from fs3.cli.main import SUBCOMMANDS
from fs3.config import SERVICE_CONFIGS

DEPLOY = REPO / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
INSTALLED_FS3 = "/opt/fs3/bin/fs3"
# which template each unit's --config path is installed from
CONFIG_OF = {"mgmtd": "mgmtd", "meta": "meta", "storage": "storage", "mount": "client"}

pytestmark = pytest.mark.timeout(120)


class Section(dict):
    """A unit file section: key -> value, the values of a repeated key joined by newlines."""


def unit(path: Path) -> dict[str, Section]:
    """Sections of a unit file (keys may repeat, as ExecStartPre does)."""
    sections: dict[str, Section] = {}
    current: Section | None = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], Section())
            continue
        assert current is not None and "=" in line, f"{path.name}: {line!r}"
        key, value = (x.strip() for x in line.split("=", 1))
        current[key] = f"{current[key]}\n{value}" if key in current else value
    return sections


def test_units_exist() -> None:
    assert {u.name for u in UNITS} == {
        "fs3-mgmtd.service",
        "fs3-meta.service",
        "fs3-storage@.service",
        "fs3-mount@.service",
    }


def test_config_templates_match_the_dataclasses() -> None:
    out = subprocess.run(
        [sys.executable, str(DEPLOY / "generate_configs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("service", sorted(SERVICE_CONFIGS))
def test_config_template_is_valid_and_documents_every_option(service: str) -> None:
    path = DEPLOY / "config" / f"{service}.toml"
    check = fs3("config-template", service, "--check", str(path))
    assert check.returncode == 0, check.stderr
    text = path.read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+ = ", line):
            assert lines[i - 1].startswith("# "), f"{service}: {line.split()[0]} has no documentation"


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_unit_runs_a_command_that_accepts_its_config_template(path: Path) -> None:
    svc = unit(path)["Service"]
    argv = svc["ExecStart"].split()
    assert argv[0] == INSTALLED_FS3
    command = argv[1]
    assert command in SUBCOMMANDS, f"{path.name}: 'fs3 {command}' is no fs3 command"
    config = argv[argv.index("--config") + 1]
    assert config.startswith("/etc/fs3/") and config.endswith(".toml")
    template = DEPLOY / "config" / f"{CONFIG_OF[command]}.toml"
    check = fs3("config-template", CONFIG_OF[command], "--check", str(template))
    assert check.returncode == 0, check.stderr
    # A bad config is not started again: the daemon exits 2 for it, which the unit names. (Not
    # checked in an ExecStartPre, as it was: systemd restarts a unit whose ExecStartPre failed,
    # whatever the status, so a typo was retried every few seconds for ever.)
    assert svc["RestartPreventExitStatus"] == "2"
    assert not any("--check" in pre for pre in svc.get("ExecStartPre", "").splitlines())
    if command == "mount":
        # the unit's process must be the one serving the mount: a detaching fs3 mount's first
        # process exits 0, which Type=simple takes for the end of the service (systemd unmounts)
        assert "--foreground" in argv and svc.get("Type", "simple") == "simple"


def test_every_template_names_the_cluster_secret() -> None:
    """Clients included: without it a client speaks with the development secret and every
    production server refuses it."""
    secrets = set()
    for service in ("mgmtd", "meta", "storage", "client"):
        text = (DEPLOY / "config" / f"{service}.toml").read_text()
        found = re.findall(r'^cluster_secret_file = "(.*)"$', text, re.M)
        assert found and found[0], f"{service}.toml names no cluster_secret_file"
        secrets.add(found[0])
    assert len(secrets) == 1, secrets


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_unit_limits_restart_and_ordering(path: Path) -> None:
    u = unit(path)
    svc = u["Service"]
    assert int(svc["LimitNOFILE"]) >= 1 << 20
    assert svc["Restart"] == "on-failure"
    assert "network-online.target" in u["Unit"]["After"] and "network-online.target" in u["Unit"]["Wants"]
    if path.name != "fs3-mgmtd.service":
        assert "fs3-mgmtd.service" in u["Unit"]["After"], "start after a local mgmtd"
        assert svc["LimitMEMLOCK"] == "infinity", "RDMA registers memory"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify insists that ExecStart's program exists: point the units at this checkout's fs3
    fs3_bin = Path(sys.executable).with_name("fs3")
    assert fs3_bin.exists()
    for u in UNITS:
        (tmp_path / u.name).write_text(u.read_text().replace(INSTALLED_FS3, str(fs3_bin)))
    names = [
        "fs3-mgmtd.service",
        "fs3-meta.service",
        "fs3-storage@10001.service",
        "fs3-mount@mnt-fs3.service",
    ]
    out = subprocess.run(
        ["systemd-analyze", "verify", *names], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    ours = [line for line in out.stderr.splitlines() if "fs3" in line]
    assert not ours, "\n".join(ours)


def test_alert_rules_are_valid() -> None:
    """deploy/prometheus/fs3-alerts.yml: each rule named once, with a severity and a summary, over
    fs3 metrics (the cluster tests check the names against what the daemons export); promtool,
    where installed, checks the PromQL and the file as Prometheus loads it."""
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert names and len(names) == len(set(names))
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning"), r
        assert r["annotations"]["summary"] and r["annotations"]["description"], r
        assert "fs3_" in r["expr"] or 'job=~"fs3' in r["expr"], r  # fs3's metrics, or its jobs' up
    assert "fs3_storage_target_low_space" in alert_metrics()  # what deploy/README.md advises
    promtool = shutil.which("promtool")
    if promtool is not None:
        out = subprocess.run(
            [promtool, "check", "rules", str(DEPLOY / "prometheus" / "fs3-alerts.yml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_is_valid() -> None:
    dash = json.loads((DEPLOY / "grafana" / "fs3.json").read_text())
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert graphs and all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in graphs)
    names = dashboard_metrics()
    for service in ("mgmtd", "storage", "meta", "fuse", "kv"):
        assert any(n.startswith(f"fs3_{service}_") for n in names), f"no {service} panel"
