"""``fs3 admin`` against a real mgmtd process: every cluster command, the placement files, the
output formats and the exit statuses."""

from __future__ import annotations

import asyncio
import calendar
import itertools
import json
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import free_port
from ops_helpers import FS3, REPO, Spawner, fs3, wait_for

from fs3.cli import admin
from fs3.cli.admin_placement import read_chain_table, read_chains, read_targets
from fs3.client.mgmtd_client import MgmtdClient
from fs3.errors import FS3Error
from fs3.proto import common_pb2, mgmtd_pb2

pytestmark = pytest.mark.timeout(120)

NODES = [10001, 10002, 10003]


class Mgmtd:
    """A mgmtd process with a cluster secret, and the flags that reach it."""

    def __init__(self, tmp: Path, spawner: Spawner, settings: str = "") -> None:
        self.tmp = tmp
        self.secret = tmp / "cluster.secret"
        self.secret.write_text("s" * 40 + "\n")
        self.token = tmp / "admin.token"
        cfg = tmp / "mgmtd.toml"
        cfg.write_text(
            f'listen_port = 0\ncluster_secret_file = "{self.secret}"\nheartbeat_timeout_s = 60.0\n{settings}'
            f'[kv]\npath = "{tmp / "kv"}"\n'
        )
        port_file = tmp / "mgmtd.port"
        spawner.start(
            "mgmtd", [sys.executable, "-m", "fs3.mgmtd", "--config", str(cfg), "--port-file", str(port_file)]
        )
        port = wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 30, "mgmtd port")
        self.address = f"127.0.0.1:{port}"

    def admin(self, *args: str, token: bool = True) -> object:
        flags = ["--mgmtd", self.address, "--secret-file", str(self.secret)]
        if token:
            flags += ["--token-file", str(self.token)]
        return fs3("admin", *args, *flags)

    def json(self, *args: str) -> object:
        out = self.admin(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


@pytest.fixture(scope="module")
def mgmtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mgmtd]:
    tmp = tmp_path_factory.mktemp("admin")
    spawner = Spawner(tmp)
    try:
        m = Mgmtd(tmp, spawner)
        out = m.admin("init-cluster", "--cluster-id", "opstest", "--token-out", str(m.token), token=False)
        assert out.returncode == 0, out.stderr
        yield m
    finally:
        spawner.close()


def test_init_cluster_wrote_a_private_token_and_refuses_twice(mgmtd: Mgmtd) -> None:
    assert stat.S_IMODE(mgmtd.token.stat().st_mode) == 0o600
    assert len(mgmtd.token.read_text().strip()) > 16
    again = mgmtd.admin("init-cluster", token=False)
    assert again.returncode == 1
    assert len(again.stderr.strip().splitlines()) == 1


def test_every_command_has_help() -> None:
    parser = admin.parser()
    assert set(admin.COMMANDS) >= {
        "init-cluster", "list-nodes", "list-targets", "list-chains", "create-targets", "upload-chains",
        "upload-chain-table", "offline-target", "remove-target", "update-chain", "rotate-lastsrv",
        "user-add", "user-list", "user-set", "user-token", "gen-chains", "config", "ls", "stat", "checksum", "gc-list",
    }  # fmt: skip
    for name in admin.COMMANDS:
        with pytest.raises(SystemExit) as e:
            parser.parse_args([name, "--help"])
        assert e.value.code == 0, name


def test_usage_and_unreachable_exit_statuses(tmp_path: Path) -> None:
    assert fs3("admin").returncode == 2
    assert fs3("admin", "update-chain", "1", "2").returncode == 2  # --mode missing
    dead = fs3("admin", "list-nodes", "--mgmtd", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert dead.returncode == 69
    assert len(dead.stderr.strip().splitlines()) == 1 and "127.0.0.1" in dead.stderr


@pytest.mark.parametrize(
    "argv", [["set-layout", "", "--stripe", "2"], ["stat", ""], ["ls", ""], ["checksum", ""]]
)
def test_the_empty_path_is_a_usage_error(argv: list[str]) -> None:
    """Meta takes the empty path for the root: `set-layout "$DIR"` with DIR unset changed the
    root's layout, for every new file of the file system."""
    out = fs3("admin", *argv, "--mgmtd", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert out.returncode == 2, out.stderr
    assert "the empty path names nothing" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["user-add", "-5", "neg"],
        ["user-add", "4294967296", "huge"],  # past a u32 field: refused before anything is asked
        ["user-add", "5", "five", "--groups", "1,-2"],
        ["register-node", "-1", "storage"],
        ["offline-target", "-1"],
        ["list-chains", "--table", "-1"],
        ["rotate-lastsrv", "x"],
        ["config", "get", "meta", "--version", "-1"],
    ],
)
def test_numbers_out_of_range_are_usage_errors(argv: list[str]) -> None:
    """One line and exit status 2, not protobuf's ValueError with a traceback."""
    out = fs3("admin", *argv, "--mgmtd", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]  # after argparse's usage, if it printed it
    assert last.startswith(f"fs3 admin {argv[0]}: "), out.stderr
    assert "out of range" in last or "whole number" in last, out.stderr


def test_gc_list_opens_only_a_store_that_is_there(tmp_path: Path) -> None:
    """A mistyped --kv-path made an empty store there (and said the queue was empty); fdb with
    the local cluster's path was a traceback; a limit of 0 listed everything."""
    missing = tmp_path / "no-store"
    out = fs3("admin", "gc-list", "--kv-path", str(missing), "--mgmtd", "127.0.0.1:1")
    assert out.returncode == 2 and "no lmdb store there" in out.stderr, out.stdout + out.stderr
    assert not missing.exists()
    out = fs3("admin", "gc-list", "--kv-path", str(tmp_path), "--mgmtd", "127.0.0.1:1")
    assert out.returncode == 2 and not (tmp_path / "data.mdb").exists(), out.stderr
    out = fs3("admin", "gc-list", "--engine", "fdb", "--kv-path", str(tmp_path), "--mgmtd", "127.0.0.1:1")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    out = fs3("admin", "gc-list", "--limit", "0", "--kv-path", str(tmp_path), "--mgmtd", "127.0.0.1:1")
    assert out.returncode == 2 and "out of range" in out.stderr, out.stderr


def test_a_short_secret_or_an_empty_token_file_is_a_usage_error(tmp_path: Path) -> None:
    short, empty = tmp_path / "short.secret", tmp_path / "empty.token"
    short.write_text("wrongsecret\n")
    empty.write_text("")
    for flags, says in (
        (["--secret-file", str(short)], "at least 16 bytes"),
        (["--token-file", str(empty)], "is empty"),
    ):
        out = fs3("admin", "ls", "/", "--mgmtd", f"127.0.0.1:{free_port()}", "--timeout", "1", *flags)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("timeout", ["-1", "0", "inf"])
def test_a_timeout_that_is_no_wait_is_a_usage_error(timeout: str) -> None:
    out = fs3("admin", "list-nodes", "--mgmtd", f"127.0.0.1:{free_port()}", "--timeout", timeout)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    why = f"argument --timeout: must be a finite number of seconds above 0, not {timeout}"
    assert last == f"fs3 admin list-nodes: error: {why}", out.stderr


@pytest.mark.parametrize(
    "reader, text",
    [
        (read_chains, "chain_id,targets\n-1,5,6\n"),
        (read_chains, "chain_id,targets\n4294967296,5,6\n"),  # a chain id is 32 bits
        (read_targets, "target_id,node_id,disk_index\n5,4294967296,0\n"),
        (read_chain_table, "chain_id\nx\n"),
    ],
)
def test_placement_files_with_numbers_out_of_range_are_refused(reader, text: str, tmp_path: Path) -> None:
    path = tmp_path / "plan.csv"
    path.write_text(text)
    with pytest.raises(admin.UsageError) as e:
        reader(path)
    assert f"{path}:2: " in str(e.value)


def test_placement_upload_and_listings(mgmtd: Mgmtd, tmp_path: Path) -> None:
    for n in NODES:
        assert mgmtd.admin("register-node", str(n), "storage").returncode == 0
    # a node registered already is said to be (it said "registered" again)
    known = mgmtd.admin("register-node", str(NODES[0]), "storage")
    assert known.returncode == 0 and "was registered already" in known.stdout, known.stdout
    plan = tmp_path / "plan"
    gen = fs3(
        "admin", "gen-chains", "--nodes", "3", "--disks", "1", "--targets-per-disk", "2", "--replicas", "3",
        "--node-ids", ",".join(map(str, NODES)), "--out", str(plan),
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    targets = read_targets(plan / "targets.csv")
    chains = read_chains(plan / "chains.csv")
    table = read_chain_table(plan / "chain-table.csv")
    assert len(targets) == 6 and len(chains) == 2 and table == sorted(chains)

    create = mgmtd.admin("create-targets", "--file", str(plan / "targets.csv"))
    assert create.returncode == 0, create.stderr
    assert "created 6 targets" in create.stdout, create.stdout
    again = mgmtd.admin("create-targets", "--file", str(plan / "targets.csv"))  # a no-op: said so
    assert again.returncode == 0 and "created 0 targets (6 existed already)" in again.stdout, again.stdout
    (tmp_path / "empty.csv").write_text("")  # refused, as upload-chains refuses a file of no chains
    empty = mgmtd.admin("create-targets", "--file", str(tmp_path / "empty.csv"))
    assert empty.returncode == 2 and "holds no targets" in empty.stderr, empty.stderr
    assert mgmtd.admin("upload-chains", str(plan / "chains.csv")).returncode == 0
    up = mgmtd.json("upload-chain-table", "1", str(plan / "chain-table.csv"), "--desc", "ops")
    assert up["version"] == 1

    listed = mgmtd.json("list-chains")
    assert {c["chain_id"] for c in listed} == set(chains)
    for c in listed:
        assert [t["target_id"] for t in c["targets"]] == chains[c["chain_id"]]
        assert all(t["state"] and t["role"] for t in c["targets"])
    tlist = mgmtd.json("list-targets")
    assert {t["target_id"] for t in tlist} == {t[0] for t in targets}
    assert {t["node_id"] for t in tlist} == set(NODES)
    tables = mgmtd.json("list-chain-tables")
    assert tables[0]["table_id"] == 1 and tables[0]["chain_ids"] == table
    nodes = mgmtd.json("list-nodes")
    assert {n["node_id"] for n in nodes} >= set(NODES)

    version_alone = mgmtd.admin("list-chains", "--table-version", "7")  # of which table?
    assert version_alone.returncode == 2 and "--table-version needs --table" in version_alone.stderr

    human = mgmtd.admin("list-chains")
    assert human.returncode == 0 and human.stdout.splitlines()[0].split()[:3] == [
        "CHAIN_ID",
        "VERSION",
        "STATUS",
    ]

    # chain changes: each returns the chain, with a new version
    chain_id, tids = next(iter(chains.items()))
    before = next(c for c in listed if c["chain_id"] == chain_id)["version"]
    off = mgmtd.json("offline-target", str(tids[0]), "--force")
    assert off["version"] > before
    assert next(t for t in off["targets"] if t["target_id"] == tids[0])["state"] == "OFFLINE"
    removed = mgmtd.json("update-chain", str(chain_id), str(tids[0]), "--mode", "remove")
    assert tids[0] not in [t["target_id"] for t in removed["targets"]]
    assert mgmtd.admin("remove-target", str(tids[0])).returncode == 0
    missing = mgmtd.admin("remove-target", "999999")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    rot = mgmtd.admin("rotate-lastsrv", str(chain_id), "--force")
    assert rot.returncode in (0, 1) and (rot.returncode == 0 or rot.stderr.count("\n") == 1)

    # a node out of service until enabled again (offline-target lasts only until its daemon reports;
    # what disabling does to its chains: tests/mgmtd/test_mgmtd_draining.py)
    def disabled(node: int) -> bool:
        return next(n["disabled"] for n in mgmtd.json("list-nodes") if n["node_id"] == node)

    assert mgmtd.json("disable-node", str(NODES[1])) == {
        "node_id": NODES[1],
        "enabled": False,
        "draining": [],
    }
    assert disabled(NODES[1])
    twice = mgmtd.admin("disable-node", str(NODES[1]))  # said so, as enable-node of an enabled one
    assert twice.returncode == 0 and f"node {NODES[1]} was disabled already" in twice.stdout, twice.stdout
    assert mgmtd.json("enable-node", str(NODES[1]))["enabled"] is True and not disabled(NODES[1])
    assert mgmtd.admin("disable-node", "424242").returncode == 1
    again = mgmtd.admin("enable-node", str(NODES[1]))
    assert again.returncode == 0 and f"node {NODES[1]} was not disabled" in again.stdout
    # a node holding a chain's last SERVING target is not disabled without --force (its data would
    # be unavailable), as offline-target would not take that target
    last = tids[2]
    # down to one copy of the chain's data: refused without --force (it said OK with one replica)
    one = mgmtd.admin("update-chain", str(chain_id), str(tids[1]), "--mode", "remove")
    assert one.returncode == 2 and f"one copy of its data left (on target {last})" in one.stderr, one.stderr
    assert len(next(c for c in mgmtd.json("list-chains") if c["chain_id"] == chain_id)["targets"]) == 2
    forced = mgmtd.admin("update-chain", str(chain_id), str(tids[1]), "--mode", "remove", "--force")
    assert forced.returncode == 0, forced.stderr
    none = mgmtd.admin("update-chain", str(chain_id), str(last), "--mode", "remove")
    assert none.returncode == 2 and "no SERVING target left (its data unavailable and gone)" in none.stderr
    node = next(n for t, n, _ in targets if t == last)
    refused = mgmtd.admin("disable-node", str(node))
    assert refused.returncode == 2 and f"last SERVING target of chains {chain_id}" in refused.stderr
    assert not disabled(node)
    assert mgmtd.admin("disable-node", str(node), "--force").returncode == 0 and disabled(node)
    assert mgmtd.json("enable-node", str(node))["enabled"] is True


def _heartbeat(mgmtd: Mgmtd, node_id: int, node_type: int, sequence: int, pid: int) -> str:
    """One heartbeat of a node (registered first), as its daemon sends it; the refusal's code, if any."""

    async def beat() -> str:
        client = MgmtdClient([mgmtd.address], cluster_secret=mgmtd.secret.read_text().strip().encode())
        try:
            await client.register_node(node_id, node_type)
            req = mgmtd_pb2.HeartbeatRequest(
                node_id=node_id, type=node_type, incarnation=1, sequence=sequence, pid=pid
            )
            await client.heartbeat(req)
            return ""
        except FS3Error as e:
            return e.code.name
        finally:
            await client.close()

    return asyncio.run(beat())


def test_disabling_a_meta_node_says_what_it_does(mgmtd: Mgmtd) -> None:
    """A meta node has no targets: disable-node says what disabling it does (clients that find meta
    through routing leave it), and refuses, as for a chain's last SERVING target, to leave no
    meta node active without --force."""
    meta = 20001
    assert _heartbeat(mgmtd, meta, common_pb2.NODE_META, 1, pid=4001) == ""
    refused = mgmtd.admin("disable-node", str(meta))
    assert refused.returncode == 2, refused.stderr
    assert f"node {meta} is the only active meta node" in refused.stderr and "--force" in refused.stderr
    done = mgmtd.admin("disable-node", str(meta), "--force")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"node {meta} disabled (a meta node: it has no targets): mgmtd refuses its heartbeats, and "
        "clients that find meta through routing find no meta node until enable-node"
    )
    assert _heartbeat(mgmtd, meta, common_pb2.NODE_META, 2, pid=4001) == "MGMTD_NODE_DISABLED"
    enabled = mgmtd.admin("enable-node", str(meta))
    assert enabled.returncode == 0 and "targets" not in enabled.stdout, enabled.stdout  # it has none
    assert "clients that find meta through routing use it again" in enabled.stdout


def test_list_nodes_ages_a_disabled_nodes_last_accepted_heartbeat(mgmtd: Mgmtd) -> None:
    """A disabled node's heartbeats are refused: list-nodes shows the pid and the growing age of the
    last one accepted, not a fresh-looking 0.0; a node never heard shows neither."""
    node, silent = 20002, 20003
    assert _heartbeat(mgmtd, node, common_pb2.NODE_STORAGE, 1, pid=4002) == ""
    assert mgmtd.admin("disable-node", str(node)).returncode == 0
    assert _heartbeat(mgmtd, node, common_pb2.NODE_STORAGE, 2, pid=5002) == "MGMTD_NODE_DISABLED"
    assert mgmtd.admin("register-node", str(silent), "storage").returncode == 0

    def row(node_id: int) -> dict:
        return next(n for n in mgmtd.json("list-nodes") if n["node_id"] == node_id)

    wait_for(lambda: row(node)["heartbeat_age_s"] >= 1.0, 30, "the disabled node's heartbeat age to grow")
    assert row(node)["pid"] == 4002 and row(node)["status"] == "DISABLED"
    assert (row(silent)["pid"], row(silent)["heartbeat_age_s"]) == ("", "")
    assert mgmtd.admin("enable-node", str(node)).returncode == 0


def test_unregistering_a_node_whose_daemon_heartbeats_is_refused(mgmtd: Mgmtd) -> None:
    """A node whose daemon still heartbeats registers again at its next heartbeat: unregister-node
    said "unregistered" and the node was back, ACTIVE, two seconds later. Refused without --force;
    a node never heard from (or silent) is forgotten as before."""
    live, silent = 20004, 20005
    assert _heartbeat(mgmtd, live, common_pb2.NODE_STORAGE, 1, pid=4004) == ""
    refused = mgmtd.admin("unregister-node", str(live))
    assert refused.returncode == 2 and f"node {live} is ACTIVE" in refused.stderr, refused.stderr
    assert "stop its daemon first" in refused.stderr
    assert live in {n["node_id"] for n in mgmtd.json("list-nodes")}
    assert mgmtd.admin("unregister-node", str(live), "--force").returncode == 0
    assert mgmtd.admin("register-node", str(silent), "storage").returncode == 0
    assert mgmtd.admin("unregister-node", str(silent)).returncode == 0
    assert not {live, silent} & {n["node_id"] for n in mgmtd.json("list-nodes")}


def test_connection_flags_go_before_or_after_the_command(mgmtd: Mgmtd) -> None:
    flags = ["--mgmtd", mgmtd.address, "--token-file", str(mgmtd.token)]
    before = fs3("admin", *flags, "--json", "list-chain-tables")
    after = fs3("admin", "list-chain-tables", *flags, "--json")
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)


def test_output_to_a_reader_that_went_away_ends_quietly(mgmtd: Mgmtd) -> None:
    """`fs3 admin list-chains | head -1` with more output than head reads: exit status 141 (as a
    tool SIGPIPE ended) and no traceback."""
    proc = subprocess.Popen(
        [*FS3, "admin", "--mgmtd", mgmtd.address, "--token-file", str(mgmtd.token), "list-nodes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


def test_no_credentials_says_how_to_give_them(mgmtd: Mgmtd) -> None:
    out = fs3("admin", "list-nodes", "--mgmtd", mgmtd.address, env={"FS3_LOCAL_DIR": str(mgmtd.tmp / "none")})
    assert out.returncode == 1 and "--token-file" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_users_and_tokens(mgmtd: Mgmtd, tmp_path: Path) -> None:
    token_file = tmp_path / "alice.token"
    token_file.write_text("old\n")
    token_file.chmod(0o644)  # an existing file: the token must not stay readable by all
    add = mgmtd.admin("user-add", "1000", "alice", "--groups", "10,20", "--token-out", str(token_file))
    assert add.returncode == 0, add.stderr
    # mgmtd's error quoting a long name reached the admin whole in gRPC's trailing metadata,
    # which the client refuses past 16 KiB: RESOURCE_EXHAUSTED instead of the reason (a review)
    long_name = mgmtd.admin("user-add", "1001", "n" * 17_000)
    assert long_name.returncode == 1 and "must be 1..255 bytes" in long_name.stderr, long_name.stderr
    assert "bytes cut" in long_name.stderr and len(long_name.stderr) < 5000
    empty = mgmtd.admin("user-set", "1000", "--name", "")  # was "name at least one of --name, ..."
    assert empty.returncode == 2 and "a user name is 1..255 bytes" in empty.stderr, empty.stderr
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    users = {u["uid"]: u for u in mgmtd.json("user-list")}
    assert users[1000]["name"] == "alice" and users[1000]["groups"] == [10, 20] and not users[1000]["admin"]
    assert users[1000]["first_expiry"] == "never" and users[1000]["token_list"][0]["expires"] == "never"
    tok = mgmtd.json("user-token", "1000")
    assert tok["token"] and tok["token"] != token_file.read_text().strip()
    # when each token expires: user-list showed only how many there were
    before = time.time()
    assert mgmtd.admin("user-token", "1000", "--ttl", "7200").returncode == 0
    alice = next(u for u in mgmtd.json("user-list") if u["uid"] == 1000)
    expiry = calendar.timegm(time.strptime(alice["first_expiry"], "%Y-%m-%dT%H:%M:%SZ"))
    assert before + 7200 - 5 <= expiry <= time.time() + 7200 + 5, alice
    assert [t["expires"] for t in alice["token_list"]] == ["never", "never", alice["first_expiry"]]
    table = mgmtd.admin("user-list").stdout
    assert "FIRST_EXPIRY" in table and alice["first_expiry"] in table, table
    # alice is no admin: the admin API refuses her token
    denied = fs3("admin", "list-nodes", "--mgmtd", mgmtd.address, "--token-file", str(token_file))
    assert denied.returncode == 1 and "PERMISSION" in denied.stderr.upper()
    # groups and flags change in place, her tokens still valid (there was no command for it:
    # only a removal and a new user, which revoked every token of hers and failed her jobs)
    changed = mgmtd.json("user-set", "1000", "--groups", "30", "--gid", "7", "--admin")
    assert changed["groups"] == [30] and changed["gid"] == 7 and changed["admin"], changed
    assert mgmtd.json("user-set", "1000", "--no-admin", "--groups", "")["groups"] == []
    assert mgmtd.admin("user-set", "1000").returncode == 2  # nothing to change: a usage error
    users = {u["uid"]: u for u in mgmtd.json("user-list")}
    assert (users[1000]["gid"], users[1000]["admin"], users[1000]["tokens"]) == (7, False, 3)
    # a 17th token revokes her oldest: said (it was silent, and a job on the oldest failed)
    for _ in range(13):
        assert "oldest token was revoked" not in mgmtd.admin("user-token", "1000").stdout
    full = mgmtd.admin("user-token", "1000")
    assert full.returncode == 0 and "its oldest token was revoked: a user keeps at most 16" in full.stdout
    # revoking the token this command runs with is refused unless forced
    own = mgmtd.admin("user-token", "0", "--invalidate")
    assert own.returncode == 2 and f"the token this command uses (--token-file {mgmtd.token})" in own.stderr
    assert mgmtd.admin("user-remove", "0").returncode == 2
    # so is a 17th token of the command's own uid, whose oldest token (maybe this one) would go
    while mgmtd.json("user-list")[0]["tokens"] < 16:
        assert mgmtd.admin("user-token", "0").returncode == 0
    seventeenth = mgmtd.admin("user-token", "0")
    assert seventeenth.returncode == 2 and "its oldest goes" in seventeenth.stderr, seventeenth.stderr
    assert mgmtd.admin("list-nodes").returncode == 0  # still the admin
    removed = mgmtd.admin("user-remove", "1000")
    assert removed.returncode == 0 and "cache of token checks" in removed.stdout  # not at once
    assert 1000 not in {u["uid"] for u in mgmtd.json("user-list")}

    # a token that could not be written is not issued: the user is not created either, and the
    # same command with a writable path then works
    nowhere = tmp_path / "missing-dir" / "carol.token"
    lost = mgmtd.admin("user-add", "3001", "carol", "--token-out", str(nowhere))
    assert lost.returncode == 2 and f"cannot write --token-out {nowhere}" in lost.stderr, lost.stderr
    assert 3001 not in {u["uid"] for u in mgmtd.json("user-list")}
    assert (
        mgmtd.admin("user-add", "3001", "carol", "--token-out", str(tmp_path / "carol.token")).returncode == 0
    )
    # a failed change leaves no token file it created behind
    again = mgmtd.admin("user-add", "3001", "carol", "--token-out", str(tmp_path / "again.token"))
    assert again.returncode == 1 and not (tmp_path / "again.token").exists()
    for ttl in ("nan", "-1", "inf"):
        assert mgmtd.admin("user-token", "3001", "--ttl", ttl).returncode == 2, ttl
    # a ttl past any date is refused before a token is issued (one was stored, the command then
    # failed formatting its expiry without showing it, and every user-list failed after)
    tokens = next(u for u in mgmtd.json("user-list") if u["uid"] == 3001)["tokens"]
    for ttl in ("1e17", "99999999999999999999"):
        huge = mgmtd.admin("user-token", "3001", "--ttl", ttl)
        assert huge.returncode == 1 and "100 years" in huge.stderr, huge.stderr + huge.stdout
    assert next(u for u in mgmtd.json("user-list") if u["uid"] == 3001)["tokens"] == tokens
    # duplicate groups are kept once
    assert mgmtd.json("user-set", "3001", "--groups", "5,5,6,5")["groups"] == [5, 6]


def test_config_set_and_get(mgmtd: Mgmtd, tmp_path: Path) -> None:
    good = tmp_path / "meta.toml"
    good.write_text("gc_interval_s = 7.5\n")
    stored = mgmtd.json("config", "set", "meta", str(good), "--desc", "slower gc")
    got = mgmtd.json("config", "get", "meta")
    assert got["version"] == stored["version"] and "gc_interval_s = 7.5" in got["content"]
    assert got["description"] == "slower gc"
    bad = tmp_path / "bad.toml"
    bad.write_text("gc_intervall_s = 1\n")
    refused = mgmtd.admin("config", "set", "meta", str(bad))
    # a file to mend: a usage error like the others (it was 1, as for a cluster that failed)
    assert refused.returncode == 2 and "gc_intervall_s" in refused.stderr and str(bad) in refused.stderr
    assert mgmtd.admin("config", "set", "meta").returncode == 2
    # --version is get's: given to set it was ignored, the next version stored all the same
    for version in ("1", "0"):  # (0 was taken for none, and a version stored)
        versioned = mgmtd.admin("config", "set", "meta", str(good), "--version", version)
        assert versioned.returncode == 2 and "--version is for config get" in versioned.stderr, (
            versioned.stderr
        )
    assert mgmtd.json("config", "get", "meta")["version"] == stored["version"]
    assert mgmtd.admin("config", "get", "meta", str(good)).returncode == 2
    # what only mgmtd checks is a file (or description) to mend too: exit 2, not 1 (a review)
    per_node = tmp_path / "storage.toml"
    per_node.write_text("node_id = 5\n")
    refused = mgmtd.admin("config", "set", "storage", str(per_node))
    assert refused.returncode == 2 and "node_id: each node's own" in refused.stderr, refused.stderr
    # a long description failed deep in the store (KV_VALUE_TOO_LARGE, naming neither)
    refused = mgmtd.admin("config", "set", "meta", str(good), "--desc", "é" * 60_000)
    assert refused.returncode == 2 and "description of 120000 bytes" in refused.stderr, refused.stderr
    assert mgmtd.json("config", "get", "meta")["version"] == stored["version"]


def test_config_get_with_nothing_stored_says_so_and_succeeds(mgmtd: Mgmtd) -> None:
    out = mgmtd.admin("config", "get", "storage")  # no test stores a storage config
    assert out.returncode == 0, out.stderr
    assert "no storage config stored" in out.stdout and "own config files" in out.stdout
    assert mgmtd.json("config", "get", "storage") == {"service": "storage", "version": 0, "content": ""}
    missing = mgmtd.admin("config", "get", "storage", "--version", "9")  # a version that is not there
    assert missing.returncode == 1 and "config version 9 does not exist" in missing.stderr


def test_list_clients_notes_missing_clients_only_while_one_can_be(tmp_path: Path) -> None:
    """A new primary lists a live client from its next session extension, due at least every third
    of the session timeout (here 15 s: 5 s). The note said 'took over recently' for the whole
    timeout (300 s by default), after a plain start too."""
    spawner = Spawner(tmp_path)
    try:
        m = Mgmtd(tmp_path, spawner, settings="client_session_timeout_s = 15.0\n")
        out = m.admin("init-cluster", "--token-out", str(m.token), token=False)
        assert out.returncode == 0, out.stderr
        started = time.monotonic()
        first = m.admin("list-clients")
        assert first.returncode == 0, first.stderr
        note = first.stdout.strip().splitlines()[-1]
        assert re.fullmatch(
            r"note: this mgmtd has listened for client sessions for \d+ s \(it became primary or resumed "
            r"after a stall then\); live clients extend theirs at least every 5 s, so one may not be listed yet",
            note,
        ), first.stdout

        def quiet() -> bool:
            out = m.admin("list-clients")
            assert out.returncode == 0, out.stderr
            return "note:" not in out.stdout

        wait_for(quiet, 20, "the note to go", interval_s=0.5)
        assert time.monotonic() - started < 15, "the note stayed for the whole session timeout"
    finally:
        spawner.close()


@pytest.mark.parametrize(
    ("nodes", "disks", "per_disk", "replicas"), [(5, 2, 6, 3), (6, 1, 5, 3), (4, 3, 3, 2)]
)
def test_gen_chains_balances_node_pairs(
    tmp_path: Path, nodes: int, disks: int, per_disk: int, replicas: int
) -> None:
    args = ["--nodes", str(nodes), "--disks", str(disks), "--targets-per-disk", str(per_disk)]
    out = fs3("admin", "gen-chains", *args, "--replicas", str(replicas), "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    targets = {t: (n, d) for t, n, d in read_targets(tmp_path / "targets.csv")}
    chains = read_chains(tmp_path / "chains.csv")
    assert len(targets) == nodes * disks * per_disk == summary["targets"]
    assert len(chains) == nodes * disks * per_disk // replicas
    used = [t for tids in chains.values() for t in tids]
    assert sorted(used) == sorted(targets), "every target in exactly one chain"
    pairs = dict.fromkeys(itertools.combinations(sorted({n for n, _ in targets.values()}), 2), 0)
    for tids in chains.values():
        chain_nodes = [targets[t][0] for t in tids]
        assert len(set(chain_nodes)) == replicas, "a chain's replicas sit on distinct nodes"
        assert len({targets[t][1] for t in tids}) == 1, "a chain's targets share a disk slot"
        for a, b in itertools.combinations(sorted(chain_nodes), 2):
            pairs[(a, b)] += 1
    assert max(pairs.values()) - min(pairs.values()) <= disks, pairs  # at most one apart per disk slot
    assert (summary["pair_chains_min"], summary["pair_chains_max"]) == (
        min(pairs.values()),
        max(pairs.values()),
    )


def test_gen_chains_impossible_shape_is_a_usage_error(tmp_path: Path) -> None:
    out = fs3(
        "admin", "gen-chains", "--nodes", "2", "--disks", "1", "--targets-per-disk", "1", "--replicas", "3"
    )
    assert out.returncode == 2 and "3" in out.stderr
    # so is an --out that cannot hold the files (a bare errno, exit 1)
    (tmp_path / "file").write_text("")
    bad = fs3("admin", "gen-chains", "--nodes", "3", "--disks", "1", "--targets-per-disk", "1",
              "--replicas", "3", "--out", str(tmp_path / "file" / "x"))  # fmt: skip
    assert bad.returncode == 2 and "cannot write the files into --out" in bad.stderr, bad.stderr


def test_checksum_compares_every_replica() -> None:
    from fs3.cli.admin_fs import compare_replicas
    from fs3.proto import storage_pb2

    def meta(version: int, length: int, crc: int) -> storage_pb2.ChunkMeta:
        return storage_pb2.ChunkMeta(committed_version=version, length=length, crc32c=crc)

    same = {t: meta(2, 100, 0xABCD) for t in (1, 2, 3)}
    assert compare_replicas(0, 9, [1, 2, 3], same)["status"] == "ok"
    assert compare_replicas(0, 9, [1, 2, 3], {})["status"] == "ok"  # a hole on every replica
    assert compare_replicas(0, 9, [1, 2, 3], {**same, 2: meta(2, 100, 0x1234)})["status"] == "MISMATCH"
    assert compare_replicas(0, 9, [1, 2, 3], {**same, 3: meta(1, 100, 0xABCD)})["status"] == "MISMATCH"
    short = compare_replicas(0, 9, [1, 2, 3], {1: same[1], 2: same[2]})
    assert short["status"] == "MISMATCH" and short["replicas"][2] == "3:missing"
    # a target that could not be asked: not missing; the others agreeing is all that can be said
    down = compare_replicas(0, 9, [1, 2, 3], {1: same[1], 2: same[2]}, unreachable={3})
    assert down["status"] == "unverified" and down["replicas"][2] == "3:unreachable"
    differ = compare_replicas(0, 9, [1, 2, 3], {1: same[1], 2: meta(1, 100, 0xABCD)}, unreachable={3})
    assert differ["status"] == "MISMATCH"
    assert compare_replicas(0, 9, [1, 2, 3], {}, unreachable={1, 2, 3})["status"] == "unverified"
