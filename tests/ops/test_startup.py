"""Daemons that cannot start say so in one line naming what and where, and exit non-zero; a
daemon that runs stops cleanly (exit 0) on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cluster import free_port
from ops_helpers import Spawner, fs3, wait_for

pytestmark = pytest.mark.timeout(120)

DAEMONS = ("mgmtd", "meta", "storage")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def config(tmp: Path, service: str, extra: str = "", *, mgmtd: str = "127.0.0.1:1") -> Path:
    """A config that would start ``service`` but for ``extra`` (which goes first, before tables)."""
    secret = write(tmp / "secret", "x" * 32 + "\n")
    body = {
        "mgmtd": f'listen_port = 0\ncluster_secret_file = "{secret}"\n{extra}\n[kv]\npath = "{tmp / "kv-mgmtd"}"\n',
        "meta": (
            f'listen_port = 0\nmgmtd_addresses = ["{mgmtd}"]\ncluster_secret_file = "{secret}"\n{extra}\n'
            f'[kv]\npath = "{tmp / "kv-meta"}"\n'
        ),
        "storage": (
            f'listen_port = 0\nmgmtd_addresses = ["{mgmtd}"]\ncluster_secret_file = "{secret}"\n{extra}\n'
        ),
    }[service]
    if service == "storage" and "target_paths" not in extra:
        body = body.replace(extra, f'{extra}\ntarget_paths = ["{tmp / "target-1"}"]\ntarget_ids = [1]\n', 1)
    return write(tmp / f"{service}.toml", body)


def run_daemon(
    service: str, cfg: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"fs3.{service}", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def the_line(out: subprocess.CompletedProcess, service: str) -> str:
    """The one line a daemon prints about why it did not start (log lines may come before it)."""
    assert out.returncode != 0, f"{service} started:\n{out.stderr[-2000:]}"
    lines = [line for line in out.stderr.splitlines() if line.startswith(f"fs3 {service}: ")]
    assert len(lines) == 1, out.stderr[-2000:]
    assert out.stderr.rstrip().endswith(lines[0]), "the reason is the last thing printed"
    assert "Traceback" not in out.stderr
    return lines[0]


@pytest.mark.parametrize("service", DAEMONS)
def test_unknown_config_key(tmp_path: Path, service: str) -> None:
    cfg = config(tmp_path, service, "listen_prot = 8000")
    line = the_line(run_daemon(service, cfg), service)
    assert "listen_prot" in line and str(cfg) in line


@pytest.mark.parametrize("service", DAEMONS)
def test_a_node_id_out_of_range_is_refused_in_one_line(tmp_path: Path, service: str) -> None:
    """A node id travels as uint32: 2^32 passed the checks, then mgmtd logged a traceback every
    election round and never served, and meta died of a ValueError."""
    cfg = config(tmp_path, service, "node_id = 4294967296")
    assert "must be from 1 to 4294967295" in the_line(run_daemon(service, cfg), service)
    cfg = config(tmp_path, service)
    out = subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", service, "--config", str(cfg), "--node-id", "4294967296"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "node id must be from 1 to 4294967295" in out.stderr.splitlines()[-1]


@pytest.mark.parametrize("service", DAEMONS)
def test_a_port_file_that_cannot_be_written_is_refused_before_serving(tmp_path: Path, service: str) -> None:
    """It was found only once the daemon served (mgmtd primary, meta and storage registered), which
    then died with a traceback and no clean stop."""
    cfg = config(tmp_path, service)
    for port_file, reason in (
        (tmp_path / "missing" / "port", "is not an existing directory"),
        (tmp_path, "is a directory"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", f"fs3.{service}", "--config", str(cfg), "--port-file", str(port_file)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and reason in the_line(out, service), out.stderr[-2000:]


@pytest.mark.parametrize("service", DAEMONS)
def test_port_in_use(tmp_path: Path, service: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = config(tmp_path, service)
        cfg.write_text(cfg.read_text().replace("listen_port = 0", f"listen_port = {port}"))
        # a setting from the environment is said to be one (the same FS3_* names serve fs3 admin)
        out = run_daemon(service, cfg, env={"FS3_LOG__LEVEL": "INFO", "FS3_NOT_A_KEY": "1"})
        line = the_line(out, service)
    assert f"127.0.0.1:{port}" in line and "in use" in line.lower()
    assert "config from the environment, over the config file: FS3_LOG__LEVEL\n" in out.stderr


@pytest.mark.parametrize("service", DAEMONS)
def test_unwritable_directory(tmp_path: Path, service: str) -> None:
    # Tests often run as root, for whom permission bits do not stop a write; a path below a
    # regular file cannot be created by anyone.
    blocker = write(tmp_path / "a-file", "")
    bad = blocker / "data"
    cfg = config(tmp_path, service)
    text = cfg.read_text()
    if service == "storage":
        text = text.replace(str(tmp_path / "target-1"), str(bad))
    else:
        text = text.replace(str(tmp_path / f"kv-{service}"), str(bad))
    cfg.write_text(text)
    line = the_line(run_daemon(service, cfg), service)
    assert str(bad) in line


@pytest.mark.parametrize("service", DAEMONS)
def test_a_store_or_target_on_a_disk_that_is_not_there_is_a_bad_config(tmp_path: Path, service: str) -> None:
    """A store path whose parent is missing (an unmounted disk, a typo) is refused, as a target's
    was: mgmtd and meta made the whole path and started on an empty store (meta served clients a
    new, empty file system); and a config found wrong as the daemon starts exits 2, which the
    units do not restart (it was 1, restarted every few seconds for ever)."""
    missing = tmp_path / "unmounted-disk" / "fs3"
    cfg = config(tmp_path, service)
    text = cfg.read_text()
    if service == "storage":
        text = text.replace(str(tmp_path / "target-1"), str(missing / "target-1"))
    else:
        text = text.replace(str(tmp_path / f"kv-{service}"), str(missing / "kv"))
    cfg.write_text(text)
    out = run_daemon(service, cfg)
    line = the_line(out, service)
    assert out.returncode == 2 and str(missing) in line and "mounted" in line, line
    assert not missing.exists()
    if service == "storage":  # and a storage node given no target at all
        cfg.write_text(text.replace(f'target_paths = ["{missing / "target-1"}"]\ntarget_ids = [1]\n', ""))
        out = run_daemon(service, cfg)
        assert out.returncode == 2 and "no targets" in the_line(out, service)


@pytest.mark.parametrize("service", DAEMONS)
def test_unwritable_log_file(tmp_path: Path, service: str) -> None:
    bad = write(tmp_path / "a-file", "") / "daemon.log"
    cfg = config(tmp_path, service)
    cfg.write_text(cfg.read_text() + f'[log]\nfile = "{bad}"\n')
    line = the_line(run_daemon(service, cfg), service)
    assert str(bad) in line


@pytest.mark.timeout(90)
def test_unreachable_mgmtd_after_retries(tmp_path: Path) -> None:
    """meta and storage give up on a mgmtd that never answers (their retry windows run at once)."""
    dead = f"127.0.0.1:{free_port()}"
    procs = {}
    for service in ("meta", "storage"):
        d = tmp_path / service
        d.mkdir()
        # storage's wait for routing is a setting (30 s by default); keep the test short
        extra = "mgmtd_connect_timeout_s = 3.0" if service == "storage" else ""
        cfg = config(d, service, extra, mgmtd=dead)
        procs[service] = subprocess.Popen(
            [sys.executable, "-m", f"fs3.{service}", "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        for service, p in procs.items():
            out, err = p.communicate(timeout=80)
            line = the_line(subprocess.CompletedProcess(p.args, p.returncode, out, err), service)
            assert dead in line and "mgmtd" in line
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _port(port_file: Path, proc: subprocess.Popen, name: str) -> int:
    def ready() -> str:
        assert proc.poll() is None, f"{name} exited with {proc.returncode}"
        return port_file.exists() and port_file.read_text().strip()

    return int(wait_for(ready, 30, f"{name} to listen"))


def _sigterm(proc: subprocess.Popen, name: str) -> None:
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert proc.wait(timeout=30) == 0, f"{name} exited with {proc.returncode} after SIGTERM"
    assert time.monotonic() - started < 30


@pytest.mark.timeout(120)
def test_sigterm_stops_every_daemon_cleanly(tmp_path: Path, spawner: Spawner) -> None:
    mgmtd_cfg = config(tmp_path, "mgmtd")
    mgmtd = spawner.start(
        "mgmtd",
        [
            sys.executable,
            "-m",
            "fs3.mgmtd",
            "--config",
            str(mgmtd_cfg),
            "--port-file",
            str(tmp_path / "m.port"),
        ],
    )
    address = f"127.0.0.1:{_port(tmp_path / 'm.port', mgmtd, 'mgmtd')}"
    flags = ["--mgmtd", address, "--secret-file", str(tmp_path / "secret")]
    token = tmp_path / "admin.token"
    for args in (
        ["init-cluster", "--token-out", str(token)],
        ["register-node", "10001", "storage", "--token-file", str(token)],
        ["create-targets", "--target-id", "1", "--node-id", "10001", "--token-file", str(token)],
    ):
        out = fs3("admin", *args, *flags)
        assert out.returncode == 0, out.stderr
    chains = write(tmp_path / "chains.csv", "chain_id,target_1\n1,1\n")
    assert fs3("admin", "upload-chains", str(chains), "--token-file", str(token), *flags).returncode == 0

    meta_cfg = config(tmp_path, "meta", mgmtd=address)
    storage_cfg = config(tmp_path, "storage", "node_id = 10001", mgmtd=address)
    meta = spawner.start(
        "meta",
        [
            sys.executable,
            "-m",
            "fs3.meta",
            "--config",
            str(meta_cfg),
            "--port-file",
            str(tmp_path / "meta.port"),
        ],
    )
    storage = spawner.start(
        "storage",
        [
            sys.executable,
            "-m",
            "fs3.storage",
            "--config",
            str(storage_cfg),
            "--port-file",
            str(tmp_path / "s.port"),
        ],
    )
    _port(tmp_path / "meta.port", meta, "meta")
    _port(tmp_path / "s.port", storage, "storage")
    for proc, name in ((meta, "meta"), (storage, "storage"), (mgmtd, "mgmtd")):
        _sigterm(proc, name)
    for name in ("meta", "storage", "mgmtd"):
        log = (tmp_path / f"{name}.log").read_text()
        assert "shutdown requested" in log and "Traceback" not in log, log[-3000:]


def test_storage_serves_metrics_on_its_listen_address(tmp_path: Path, spawner) -> None:
    """Prometheus scrapes /metrics from another host: storage binds it to its listen_host, as mgmtd
    and meta do (it was always 127.0.0.1). 127.0.0.2 stands in for a routable address here."""
    port = free_port()
    cfg = config(
        tmp_path,
        "storage",
        f'listen_host = "127.0.0.2"\nmetrics_port = {port}\nmgmtd_connect_timeout_s = 60.0',
    )
    p = spawner.start("storage", [sys.executable, "-m", "fs3.storage", "--config", str(cfg)])

    def scraped() -> bool:
        assert p.poll() is None, (tmp_path / "storage.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=2) as r:
                return b"fs3_" in r.read()
        except OSError:
            return False

    wait_for(scraped, 30, "storage metrics on 127.0.0.2")  # served while it waits for mgmtd


@pytest.mark.parametrize("service", DAEMONS)
def test_a_binary_cluster_secret_is_refused_in_one_line(tmp_path: Path, service: str) -> None:
    """The secret travels in gRPC metadata (to mgmtd), which takes printable ASCII: raw random bytes
    used to pass the check and then fail with a UnicodeDecodeError traceback in meta and storage."""
    cfg = config(tmp_path, service)
    (tmp_path / "secret").write_bytes(bytes(range(200, 240)))
    line = the_line(run_daemon(service, cfg), service)
    assert "printable ASCII" in line and str(tmp_path / "secret") in line


def test_a_secret_that_is_not_the_clusters_is_a_bad_config(tmp_path: Path, spawner: Spawner) -> None:
    """meta and storage whose cluster secret differs from mgmtd's said only "wrong cluster secret",
    naming no file, and exited 1, which their units restart every few seconds for ever; it is
    exit 2 now (a bad config, not restarted), naming the secret file."""
    mgmtd = spawner.start(
        "mgmtd",
        [sys.executable, "-m", "fs3.mgmtd", "--config", str(config(tmp_path, "mgmtd")), "--port-file",
         str(tmp_path / "m.port")],
    )  # fmt: skip
    address = f"127.0.0.1:{_port(tmp_path / 'm.port', mgmtd, 'mgmtd')}"
    for service in ("meta", "storage"):
        d = tmp_path / service
        d.mkdir()
        cfg = config(d, service, "node_id = 10001" if service == "storage" else "", mgmtd=address)
        (d / "secret").write_text("y" * 32 + "\n")  # not mgmtd's
        out = run_daemon(service, cfg)
        line = the_line(out, service)
        assert out.returncode == 2, out.stderr[-2000:]
        assert "wrong cluster secret" in line and str(d / "secret") in line, line
