"""fs3.config: defaults, TOML files, environment overrides and the errors a user sees."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from fs3.config import (
    SERVICE_CONFIGS,
    KvConfig,
    MetaConfig,
    MgmtdConfig,
    StorageConfig,
    load_config,
    to_toml,
)
from fs3.errors import FS3Error, StatusCode


def write(tmp_path, text: str):
    p = tmp_path / "svc.toml"
    p.write_text(text)
    return p


def test_defaults_need_no_file():
    cfg = load_config(MgmtdConfig, environ={})
    assert cfg == MgmtdConfig()
    assert cfg.kv.engine == "lmdb"


def test_file_sets_fields_and_tables(tmp_path):
    p = write(tmp_path, 'listen_port = 9100\nmgmtd_addresses = ["a:1", "[::1]:2"]\n[kv]\nengine = "mem"\n')
    cfg = load_config(MetaConfig, p, environ={})
    assert cfg.listen_port == 9100
    assert cfg.mgmtd_addresses == ["a:1", "[::1]:2"]
    assert cfg.kv == KvConfig(engine="mem")


@pytest.mark.parametrize(
    "text, needle",
    [
        ("listen_prot = 1\n", "unknown key 'listen_prot'"),
        ("[kv]\nengin = 'lmdb'\n", "unknown key 'kv.engin'"),
        ("[nosuch]\nx = 1\n", "unknown key 'nosuch'"),
        ("listen_port = 'eighty'\n", "'listen_port'"),
        ("listen_port = 70000\n", "port number"),
        ("listen_port = true\n", "expected an integer"),
        ("[kv]\nengine = 'redis'\n", "must be one of lmdb, fdb, mem"),
        ("kv = 3\n", "must be a table"),
        ("mgmtd_addresses = 'a:1'\n", "expected a list"),
        ("gc_interval_s = -1\n", "must be > 0"),
        # a node id travels as uint32: mgmtd logged a traceback per election round, meta crashed
        ("node_id = 4294967296\n", "must be from 1 to 4294967295"),
        ("node_id = 0\n", "must be from 1 to 4294967295"),
        ("default_chunk_size = 1000000\n", "must be a power of two"),  # meta refused it only later
        ("default_chunk_size = 32768\n", "'default_chunk_size'"),
        ("capability_ttl_s = inf\n", "must be a finite number"),  # TOML has inf and nan
        ("idem_ttl_s = nan\n", "must be a finite number"),
        ("capability_ttl_s = 5000000000\n", "from 1 to 2^32-1"),  # a capability's field is 32 bits
        ("capability_ttl_s = 1.9\n", "must be whole seconds"),  # taken as 1 (a review)
        ("idem_ttl_s = 1e300\n", "at most 1e9"),  # overflowed where it becomes nanoseconds
        ("[kv]\nmap_size = 99999999999999999999\n", "at most 2^46"),  # an OverflowError at start
        ('mgmtd_addresses = ["m1:8000", "m2"]\n', "not host:port"),
        ('mgmtd_addresses = ["m1:99999"]\n', "port 1..65535"),  # gRPC dialled port 34463
        # an IPv6 address without brackets: "::1" passed as host ":" port 1, gRPC dialled port 443
        ('mgmtd_addresses = ["::1"]\n', "goes in brackets"),
        ('mgmtd_addresses = ["::1:8000"]\n', "goes in brackets"),
        ('mgmtd_addresses = ["fd00::2"]\n', "goes in brackets"),
        # passed the check, to be found (or not) only when used
        ("default_chain_table = 0\n", "chain table id 1.."),
        ("default_chain_table = -5\n", "chain table id 1.."),
        ("[rdma]\ngid_index = -99\n", "must be -1"),
        ("[rdma]\ninline_payload_bytes = -1\n", "must be >= 0"),
    ],
)
def test_bad_files_name_the_key_and_the_file(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(FS3Error) as ei:
        load_config(MetaConfig, p, environ={})
    assert ei.value.code == StatusCode.CONFIG_INVALID
    assert needle in str(ei.value)
    assert str(p) in str(ei.value)


@pytest.mark.parametrize(
    "cls, text, needle",
    [
        (StorageConfig, 'target_paths = ["/a", "/b"]\ntarget_ids = [1]\n', "2 target_paths but 1 target_ids"),
        (StorageConfig, 'target_paths = ["/a", "/b"]\ntarget_ids = [1, 1]\n', "distinct numbers from 1"),
        (StorageConfig, 'target_paths = ["/a"]\ntarget_ids = [0]\n', "distinct numbers from 1"),
        (
            StorageConfig,
            'target_paths = ["/a"]\ntarget_ids = [18446744073709551616]\n',
            "distinct numbers from 1",
        ),
        (MetaConfig, "authenticate = true\nmgmtd_addresses = []\n", "needs mgmtd_addresses"),
        # the daemon started and died of a ValueError in its mgmtd client
        (StorageConfig, "mgmtd_addresses = []\n", "at least one host:port"),
    ],
)
def test_rules_across_fields_are_checked_where_a_config_is_loaded(tmp_path, cls, text, needle):
    """Not only when the daemon starts: `fs3 config-template --check` (a unit's ExecStartPre) said
    such a storage config was valid, and the unit then restarted a daemon that refused it."""
    p = write(tmp_path, text)
    with pytest.raises(FS3Error) as ei:
        load_config(cls, p, environ={})
    assert ei.value.code == StatusCode.CONFIG_INVALID and needle in str(ei.value) and str(p) in str(ei.value)
    service = {StorageConfig: "storage", MetaConfig: "meta"}[cls]
    out = subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", "config-template", service, "--check", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(FS3Error, match="does not exist"):
        load_config(MgmtdConfig, tmp_path / "absent.toml", environ={})
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe")  # a traceback (UnicodeDecodeError) before
    with pytest.raises(FS3Error, match="not valid UTF-8"):
        load_config(MgmtdConfig, tmp_path / "binary.toml", environ={})
    with pytest.raises(FS3Error, match="not valid TOML"):
        load_config(MgmtdConfig, write(tmp_path, "listen_port = = 3\n"), environ={})
    with pytest.raises(FS3Error, match="is a directory"):
        load_config(MgmtdConfig, tmp_path, environ={})


def test_environment_overrides_win_over_the_file(tmp_path):
    p = write(tmp_path, "listen_port = 9100\n[kv]\nengine = 'lmdb'\npath = '/from/file'\n")
    env = {
        "FS3_LISTEN_PORT": "9200",
        "FS3_KV__ENGINE": "mem",
        "FS3_MGMTD_ADDRESSES": '["x:1"]',
        "FS3_CLUSTER_ID": "with spaces ok",
        "FS3_SOMETHING_FOR_ANOTHER_SERVICE": "1",
        "HOME": "/root",
    }
    cfg = load_config(MetaConfig, p, environ=env)
    assert cfg.listen_port == 9200
    assert cfg.kv.engine == "mem"
    assert cfg.kv.path == "/from/file"
    assert cfg.mgmtd_addresses == ["x:1"]
    assert cfg.cluster_id == "with spaces ok"


def test_a_comma_list_variable_of_numbers_is_read_as_numbers():
    cfg = load_config(StorageConfig, None, environ={"FS3_TARGET_IDS": "1, 2", "FS3_TARGET_PATHS": "/a,/b"})
    assert cfg.target_ids == [1, 2] and cfg.target_paths == ["/a", "/b"]


def test_bad_environment_override_is_reported():
    """The variable at fault is named (it was "'kv.engine' in defaults with FS3_* environment
    overrides ...", leaving the user to find which of them)."""
    with pytest.raises(FS3Error) as ei:
        load_config(
            MgmtdConfig, None, environ={"FS3_LISTEN_PORT": "high", "FS3_KV__MAP_SIZE": "4096", "HOME": "/x"}
        )
    assert (
        ei.value.message
        == "environment variable FS3_LISTEN_PORT='high': 'listen_port': expected an integer, got 'high'"
    )
    with pytest.raises(FS3Error) as ei:
        load_config(MetaConfig, None, environ={"FS3_KV__ENGINE": "bogus"})
    assert ei.value.message.startswith(
        "environment variable FS3_KV__ENGINE='bogus': 'kv.engine' must be one of"
    )


def test_process_environment_is_the_default(monkeypatch):
    monkeypatch.setenv("FS3_KV__MAP_SIZE", "4096")
    assert load_config(MgmtdConfig).kv.map_size == 4096
    assert "FS3_KV__MAP_SIZE" in os.environ


@pytest.mark.parametrize("service", sorted(SERVICE_CONFIGS))
def test_rendered_template_loads_back_to_the_defaults(tmp_path, service):
    cls = SERVICE_CONFIGS[service]
    p = write(tmp_path, to_toml(cls()))
    assert load_config(cls, p, environ={}) == cls()


@pytest.mark.parametrize(
    "raw, expected",
    [('["m1:8000", "m2:8000"]', ["m1:8000", "m2:8000"]), ("m1:8000,m2:8000", ["m1:8000", "m2:8000"]),
     ("m1:8000", ["m1:8000"])],
)  # fmt: skip
def test_an_address_list_variable_means_the_same_to_every_command(raw, expected, monkeypatch):
    """deploy/README has admins export FS3_MGMTD_ADDRESSES; the daemons and clients that inherit it
    must read it as fs3 admin does (a comma list used to make them refuse to start)."""
    from fs3.cli.admin import connection
    from fs3.config import ClientConfig

    assert load_config(ClientConfig, None, environ={"FS3_MGMTD_ADDRESSES": raw}).mgmtd_addresses == expected
    monkeypatch.setenv("FS3_MGMTD_ADDRESSES", raw)
    args = argparse.Namespace(mgmtd=None, token_file=None, secret_file=None, local_dir=None, timeout=5.0)
    assert connection(args).mgmtd == expected
