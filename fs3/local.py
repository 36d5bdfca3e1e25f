"""``fs3 local up|status|down``: a whole fs3 cluster on this machine, in one directory.

``up`` starts mgmtd, meta and N storage daemons as background processes on the embedded (lmdb)
store, each with its own config file; on the first ``up`` it also initialises the cluster, creates
targets, chains (balanced by :func:`fs3.placement.generate_chains`) and chain table 1, and an admin
token for the local user; then it mounts the file system if ``fs3 mount`` is in this build, waits
until every chain is SERVING and prints where everything is. A later ``up`` on the same directory
reuses its configs, ports and data. ``down`` unmounts and stops everything (SIGTERM, then SIGKILL
after a timeout) and keeps the data unless ``--purge``.

The directory (``--dir``, ``$FS3_LOCAL_DIR``, or ``~/.local/share/fs3/local``)::

    local.json          what was set up: ports, node ids, mount point
    cluster.secret      the shared cluster secret (0600)
    admin.token         the root admin token (0600); user.token: the local user's token (0600)
    config/*.toml       one config per daemon, plus client.toml for the mount and tools
    kv/                 the lmdb store of mgmtd and meta
    storage/<node>/     each storage daemon's target directories
    logs/*.log          each daemon's output; run/*.pid, run/*.port: PIDs and bound ports

Exit status: 0 done, 1 something failed (one line says what and where), 2 usage, 69 a needed part is
not in this build.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fs3.cli.daemons import Daemon, stop_all
from fs3.errors import FS3Error, StatusCode

EX_FAILED = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
STATE_FORMAT = 1
MOUNT_MODULE = "fs3.client.mount"
FIRST_STORAGE_NODE = 10001
META_NODE = 100
CHAIN_TABLE = 1

# A local cluster restarts often and has nothing across a network to wait for, so failures and
# restarts are noticed within seconds rather than the production defaults' tens of seconds.
MGMTD_SETTINGS = {"lease_interval_s": 5.0, "heartbeat_timeout_s": 6.0, "chain_update_interval_s": 0.2}
STORAGE_SETTINGS = {"heartbeat_interval_s": 1.0, "routing_refresh_interval_s": 0.5}


class LocalError(Exception):
    """A failure ``fs3 local`` reports as one line and exit status ``code``."""

    def __init__(self, message: str, code: int = EX_FAILED) -> None:
        super().__init__(message)
        self.code = code


def default_dir() -> Path:
    env = os.environ.get("FS3_LOCAL_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "fs3" / "local"


@dataclass
class LocalState:
    """``local.json``: the shape of the cluster and the ports chosen on the first ``up``."""

    host: str
    storage_nodes: int
    replicas: int
    targets_per_node: int
    mount: str
    ports: dict[str, int] = field(default_factory=dict)
    initialized: bool = False  # cluster, targets, chains, chain table and tokens exist
    root_owner_set: bool = False  # the file system's root belongs to the local user
    format: int = STATE_FORMAT

    @classmethod
    def load(cls, path: Path) -> LocalState:
        try:
            data = json.loads(path.read_text())
            if data.get("format") != STATE_FORMAT:
                raise LocalError(f"{path}: unknown format {data.get('format')!r}")
            return cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise LocalError(f"cannot read {path}: {e}") from None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @property
    def storage_node_ids(self) -> list[int]:
        return [FIRST_STORAGE_NODE + i for i in range(self.storage_nodes)]

    @property
    def mgmtd_address(self) -> str:
        return f"{self.host}:{self.ports['mgmtd']}"


class LocalCluster:
    """The files and daemons of one local cluster directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self.state_file = self.root / "local.json"
        self.secret_file = self.root / "cluster.secret"
        self.admin_token_file = self.root / "admin.token"
        self.user_token_file = self.root / "user.token"
        self.config_dir = self.root / "config"
        self.log_dir = self.root / "logs"
        self.run_dir = self.root / "run"
        self.kv_dir = self.root / "kv"
        self.state: LocalState | None = None
        self.launched: list[Daemon] = []  # what this command started, stopped again if `up` fails

    # -- files ------------------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.state_file.exists()

    def load(self) -> LocalState:
        if self.state is None:
            if not self.exists():
                raise LocalError(f"no local cluster in {self.root} (run 'fs3 local up --dir {self.root}')")
            self.state = LocalState.load(self.state_file)
        return self.state

    def target_dir(self, node_id: int, target_id: int) -> Path:
        return self.root / "storage" / str(node_id) / f"target-{target_id}"

    def config_path(self, name: str) -> Path:
        return self.config_dir / f"{name}.toml"

    def port_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.port"

    def create(self, state: LocalState) -> None:
        """Lay out a new cluster directory: secret, ports, configs. Nothing starts yet."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for d in (self.config_dir, self.log_dir, self.run_dir, self.kv_dir):
                d.mkdir(exist_ok=True)
            probe = self.root / ".fs3-write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise LocalError(f"cannot use {self.root} as the cluster directory: {e.strerror or e}") from None
        _write_private(self.secret_file, secrets.token_hex(32).encode() + b"\n")
        names = ["mgmtd", "mgmtd_metrics", "meta", "meta_metrics", "client_metrics"]
        for n in state.storage_node_ids:
            names += [f"storage-{n}", f"storage-{n}_metrics"]
        state.ports = dict(zip(names, free_ports(state.host, len(names)), strict=True))
        self.state = state
        state.save(self.state_file)

    def write_configs(self, targets: dict[int, list[int]]) -> None:
        """One config per daemon, rendered with :func:`fs3.config.to_toml` so every option shows
        with its documentation; ``targets`` maps storage node id → its target ids."""
        import dataclasses

        from fs3.config import (
            ClientConfig,
            KvConfig,
            LogConfig,
            MetaConfig,
            MgmtdConfig,
            StorageConfig,
            to_toml,
        )

        st = self.load()
        kv = KvConfig(engine="lmdb", path=str(self.kv_dir))
        log = LogConfig(level="INFO", file="")  # output goes to logs/<name>.log through the launcher
        common = {"cluster_id": "local", "cluster_secret_file": str(self.secret_file)}
        mgmtd = [st.mgmtd_address]
        configs: dict[str, Any] = {
            "mgmtd": MgmtdConfig(
                node_id=1,
                listen_host=st.host,
                listen_port=st.ports["mgmtd"],
                metrics_port=st.ports["mgmtd_metrics"],
                kv=kv,
                log=log,
                **common,
                **MGMTD_SETTINGS,
            ),
            "meta": MetaConfig(
                node_id=META_NODE,
                listen_host=st.host,
                listen_port=st.ports["meta"],
                metrics_port=st.ports["meta_metrics"],
                mgmtd_addresses=mgmtd,
                transport="tcp",
                default_chain_table=CHAIN_TABLE,
                kv=dataclasses.replace(kv),
                log=dataclasses.replace(log),
                **common,
            ),
            "client": ClientConfig(
                mgmtd_addresses=mgmtd,
                cluster_id="local",
                token_file=str(self.user_token_file),
                cluster_secret_file=str(self.secret_file),
                transport="tcp",
                metrics_port=st.ports["client_metrics"],
                log=dataclasses.replace(log),
            ),
        }
        for node_id in st.storage_node_ids:
            tids = targets.get(node_id, [])
            configs[f"storage-{node_id}"] = StorageConfig(
                node_id=node_id,
                listen_host=st.host,
                listen_port=st.ports[f"storage-{node_id}"],
                metrics_port=st.ports[f"storage-{node_id}_metrics"],
                mgmtd_addresses=mgmtd,
                transport="tcp",
                target_paths=[str(self.target_dir(node_id, t)) for t in tids],
                target_ids=tids,
                log=dataclasses.replace(log),
                **common,
                **STORAGE_SETTINGS,
            )
        for name, cfg in configs.items():
            header = f"# fs3 local: {name} of the cluster in {self.root} (written by 'fs3 local up')\n\n"
            self.config_path(name).write_text(header + to_toml(cfg))

    # -- daemons ----------------------------------------------------------------------------------

    def daemon(self, name: str) -> Daemon:
        """The daemon called ``name``: mgmtd, meta, storage-<node id>, or mount."""
        py = sys.executable
        if name == "mount":
            st = self.load()
            cfg = str(self.config_path("client"))
            # --foreground: the process we record is the one serving the mount, so down can stop it
            argv = [py, "-m", "fs3.cli.main", "mount", st.mount, "--config", cfg, "--foreground"]
            return Daemon(name, argv, st.mount, self.run_dir / "mount.pid", self.log_dir / "mount.log")
        module = {"mgmtd": "fs3.mgmtd", "meta": "fs3.meta"}.get(name, "fs3.storage")
        cfg = str(self.config_path(name))
        argv = [py, "-m", module, "--config", cfg, "--port-file", str(self.port_file(name))]
        return Daemon(name, argv, cfg, self.run_dir / f"{name}.pid", self.log_dir / f"{name}.log")

    def service_names(self) -> list[str]:
        """Daemons in start order (stop in reverse)."""
        st = self.load()
        return ["mgmtd", "meta", *(f"storage-{n}" for n in st.storage_node_ids)]

    def all_daemons(self) -> list[Daemon]:
        return [self.daemon(n) for n in [*self.service_names(), "mount"]]


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports free on ``host`` now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _mountinfo_entry(path: str) -> tuple[int, int] | None:
    """(major, minor) of what is mounted at ``path``, from /proc/self/mountinfo; None if nothing.

    Read from the mount table rather than by ``os.path.ismount``, which stats the mount point and
    would hang on a FUSE server that does not answer."""
    target = os.path.normpath(os.path.abspath(path))
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 4 and parts[4].replace("\\040", " ") == target:
                    major, minor = parts[2].split(":")
                    found = (int(major), int(minor))
    except OSError:
        return None
    return found


def is_mounted(path: str) -> bool:
    return bool(path) and _mountinfo_entry(path) is not None


def _answers(path: str, timeout_s: float) -> bool:
    """Whether a stat of ``path`` returns within ``timeout_s``; done by a child process, so that a
    FUSE server that never answers leaves a stuck child behind rather than a stuck ``fs3 local``."""
    child = subprocess.Popen(["stat", "-c", "%i", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return child.wait(timeout_s) == 0
    except subprocess.TimeoutExpired:
        child.kill()
        return False


def _abort_fuse(path: str) -> None:
    """Abort the FUSE connection mounted at ``path`` (a server stuck in the kernel cannot be
    killed otherwise); needs fusectl at /sys/fs/fuse/connections, else does nothing."""
    dev = _mountinfo_entry(path)
    if dev is None:
        return
    try:
        Path(f"/sys/fs/fuse/connections/{dev[1]}/abort").write_text("1\n")
    except OSError:
        pass


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read (secrets and tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _say(msg: str) -> None:
    print(msg, flush=True)


def _wait_port(d: Daemon, port_file: Path, timeout_s: float) -> int:
    """Wait until the daemon writes its port file; fail with its last log line if it exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = port_file.read_text().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        code = d.exited()
        if code is not None:
            raise LocalError(f"{d.name} exited with status {code}: {d.last_error()} (log: {d.log_file})")
        if time.monotonic() > deadline:
            raise LocalError(f"{d.name} did not start within {timeout_s:.0f}s (log: {d.log_file})")
        time.sleep(0.05)


# -- up -------------------------------------------------------------------------------------------


def _placement(st: LocalState):  # type: ignore[no-untyped-def]
    from fs3.placement import generate_chains

    try:
        return generate_chains(
            st.storage_nodes, 1, st.targets_per_node, st.replicas, node_ids=st.storage_node_ids
        )
    except ValueError as e:
        raise LocalError(str(e), EX_USAGE) from None


async def _initialize(lc: LocalCluster) -> None:
    """First start only: cluster, storage nodes, targets, chains, chain table, the user's token."""
    from fs3.client.mgmtd_client import MgmtdClient
    from fs3.proto import common_pb2, mgmtd_pb2

    st = lc.load()
    placement = _placement(st)
    secret = lc.secret_file.read_bytes().strip()
    async with MgmtdClient([st.mgmtd_address], cluster_secret=secret, timeout_s=30.0) as boot:
        try:
            root_token = await boot.init_cluster("local")
        except FS3Error as e:
            raise LocalError(f"init-cluster on mgmtd {st.mgmtd_address} failed: {e}") from None
    _write_private(lc.admin_token_file, root_token.encode() + b"\n")
    async with MgmtdClient([st.mgmtd_address], token=root_token, timeout_s=30.0) as admin:
        for node_id in st.storage_node_ids:
            await admin.register_node(node_id, common_pb2.NODE_STORAGE)
        await admin.create_targets(
            [
                mgmtd_pb2.TargetSpec(target_id=t.target_id, node_id=t.node_id, disk_index=t.disk_index)
                for t in placement.targets
            ]
        )
        await admin.upload_chains({c.chain_id: c.target_ids for c in placement.chains})
        await admin.upload_chain_table(CHAIN_TABLE, placement.chain_table, "fs3 local")
        uid = os.getuid()
        if uid == 0:
            user_token = root_token
        else:
            user_token = await admin.add_user(uid, getpass.getuser(), gid=os.getgid(), admin=True)
    _write_private(lc.user_token_file, user_token.encode() + b"\n")


async def _give_root_to_user(lc: LocalCluster) -> None:
    """Make the file system's root directory the local user's, so they can write to the mount."""
    from fs3.client.meta_client import ROOT_ID, MetaClient
    from fs3.proto import common_pb2

    if os.getuid() == 0:
        return
    st = lc.load()
    root_token = lc.admin_token_file.read_text().strip()
    secret = lc.secret_file.read_bytes().strip()
    user = common_pb2.UserInfo(uid=0, gid=0, token=root_token)
    async with MetaClient([f"{st.host}:{st.ports['meta']}"], secret, user=user) as meta:
        await meta.setattr(ROOT_ID, uid=os.getuid(), gid=os.getgid())


def _unhealthy(r: Any, st: LocalState) -> str | None:
    """What keeps routing ``r`` from being a healthy local cluster, or None: healthy means the meta
    node and every storage node heartbeat, and every target of every chain is SERVING with its
    data up to date (after a restart, routing read back from the store says SERVING before the
    daemons have reported in, hence the node and local-state checks)."""
    from fs3.proto import common_pb2, mgmtd_pb2

    active = {n.node_id for n in r.nodes.values() if n.status == mgmtd_pb2.NODE_STATUS_ACTIVE}
    missing = [str(n) for n in [META_NODE, *st.storage_node_ids] if n not in active]
    if missing:
        return f"nodes not heartbeating yet: {' '.join(missing)}"
    if not r.chains:
        return "no chains in routing info"
    waiting = [
        f"{t.target_id}:{common_pb2.PublicTargetState.Name(t.public_state)}"
        for ch in r.chains.values()
        for t in ch.targets
        if t.public_state != common_pb2.SERVING
        or (t.target_id in r.targets and r.targets[t.target_id].local_state != common_pb2.UPTODATE)
    ]
    if waiting:
        return f"targets not serving yet: {' '.join(waiting[:8])}"
    return None


async def _wait_healthy(lc: LocalCluster, timeout_s: float) -> None:
    """Wait until :func:`_unhealthy` finds nothing wrong; fail early if a daemon we started exits."""
    from fs3.client.mgmtd_client import MgmtdClient
    from fs3.client.routing import Routing

    st = lc.load()
    secret = lc.secret_file.read_bytes().strip()
    deadline = time.monotonic() + timeout_s
    problem = "no answer from mgmtd"
    async with MgmtdClient([st.mgmtd_address], cluster_secret=secret, timeout_s=5.0) as client:
        while time.monotonic() < deadline:
            try:
                r = Routing((await client.get_routing_info(0)).info)
            except FS3Error as e:
                problem = f"mgmtd: {e}"
            else:
                problem = _unhealthy(r, st)
                if problem is None:
                    return
            for d in lc.launched:
                if d.exited() is not None:
                    raise LocalError(f"{d.name} exited: {d.last_error()} (log: {d.log_file})")
            await asyncio.sleep(0.2)
    raise LocalError(f"cluster not healthy after {timeout_s:.0f}s: {problem} (logs: {lc.log_dir})")


def _start_service(lc: LocalCluster, name: str, timeout_s: float) -> str:
    d = lc.daemon(name)
    if d.pid() is not None:
        return f"{name}: already running (pid {d.pid()})"
    lc.port_file(name).unlink(missing_ok=True)
    pid = d.start()
    lc.launched.append(d)
    port = _wait_port(d, lc.port_file(name), timeout_s)
    return f"{name}: pid {pid}, port {port}"


def _mount(lc: LocalCluster, timeout_s: float) -> str:
    st = lc.load()
    if not st.mount:
        return "mount: none requested"
    if importlib.util.find_spec(MOUNT_MODULE) is None:
        return f"mount: SKIPPED - 'fs3 mount' ({MOUNT_MODULE}) is not in this build; use the native client"
    mp = Path(st.mount)
    d = lc.daemon("mount")
    if d.pid() is not None and is_mounted(str(mp)):
        return f"mount: {mp} already mounted (pid {d.pid()})"
    try:
        mp.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalError(f"cannot create mount point {mp}: {e.strerror}") from None
    if is_mounted(str(mp)):
        raise LocalError(f"{mp} is already a mount point of something else; unmount it or pick --mount")
    pid = d.start()
    lc.launched.append(d)
    deadline = time.monotonic() + timeout_s
    while not is_mounted(str(mp)):
        code = d.exited()
        if code is not None:
            raise LocalError(f"fs3 mount exited with status {code}: {d.last_error()} (log: {d.log_file})")
        if time.monotonic() > deadline:
            raise LocalError(f"{mp} was not mounted within {timeout_s:.0f}s (log: {d.log_file})")
        time.sleep(0.05)
    if not _answers(str(mp), timeout_s):
        _abort_fuse(str(mp))
        raise LocalError(f"{mp} is mounted but does not answer within {timeout_s:.0f}s (log: {d.log_file})")
    return f"mount: {mp} (pid {pid})"


def cmd_up(args: argparse.Namespace) -> int:
    lc = LocalCluster(args.dir)
    if args.host in ("0.0.0.0", "::", ""):
        raise LocalError(f"--host {args.host!r} is no address to dial; give this machine's address", EX_USAGE)
    fresh = not lc.exists()
    if fresh:
        st = LocalState(
            host=args.host,
            storage_nodes=args.storage_nodes,
            replicas=args.replicas,
            targets_per_node=args.targets_per_node,
            mount="" if args.no_mount else str(Path(args.mount or lc.root / "mnt").expanduser().absolute()),
        )
        if st.replicas > st.storage_nodes:
            raise LocalError(
                f"--replicas {st.replicas} needs at least as many storage nodes (--storage-nodes {st.storage_nodes})",
                EX_USAGE,
            )
        placement = _placement(st)
        lc.create(st)
        targets: dict[int, list[int]] = {}
        for t in placement.targets:
            targets.setdefault(t.node_id, []).append(t.target_id)
        lc.write_configs(targets)
        _say(f"fs3 local: new cluster in {lc.root}")
    else:
        st = lc.load()
        given = {"storage_nodes": args.storage_nodes, "replicas": args.replicas}
        differs = [
            f"--{k.replace('_', '-')} {v}" for k, v in given.items() if v is not None and v != getattr(st, k)
        ]
        if differs:
            raise LocalError(
                f"{lc.root} already holds a cluster of {st.storage_nodes} storage nodes with "
                f"{st.replicas} replicas; {' '.join(differs)} would need 'fs3 local down --purge' first",
                EX_USAGE,
            )
        if args.mount and str(Path(args.mount).expanduser().absolute()) != st.mount:
            st.mount = str(Path(args.mount).expanduser().absolute())
            st.save(lc.state_file)
        _say(f"fs3 local: starting the cluster in {lc.root}")
    if st.mount and importlib.util.find_spec(MOUNT_MODULE) is not None and not os.path.exists("/dev/fuse"):
        raise LocalError(
            f"cannot mount at {st.mount}: this machine has no /dev/fuse (use --no-mount)", EX_UNAVAILABLE
        )
    try:
        _say("  " + _start_service(lc, "mgmtd", args.timeout))
        if not st.initialized:
            try:
                asyncio.run(_initialize(lc))
            except FS3Error as e:
                raise LocalError(
                    f"setting up the new cluster failed: {e}; start afresh with "
                    f"'fs3 local down --dir {lc.root} --purge' (logs: {lc.log_dir})"
                ) from None
            st.initialized = True
            st.save(lc.state_file)
            _say("  cluster initialized: targets, chains and chain table 1 created")
        # meta and the storage daemons start together; each is then waited for
        for name in lc.service_names()[1:]:
            d = lc.daemon(name)
            if d.pid() is None:
                lc.port_file(name).unlink(missing_ok=True)
                d.start()
                lc.launched.append(d)
        for d in list(lc.launched):
            if d.name in ("mgmtd", "mount"):
                continue
            port = _wait_port(d, lc.port_file(d.name), args.timeout)
            _say(f"  {d.name}: pid {d.popen.pid if d.popen else '?'}, port {port}")
        asyncio.run(_wait_healthy(lc, args.timeout))
        if not st.root_owner_set:
            asyncio.run(_give_root_to_user(lc))
            st.root_owner_set = True
            st.save(lc.state_file)
        _say("  every node heartbeats and every chain is SERVING")
        mount_line = _mount(lc, args.timeout)
    except BaseException:
        # leave nothing half-started behind: what this command launched stops again
        mounted_by_us = any(d.name == "mount" for d in lc.launched)
        if mounted_by_us and is_mounted(st.mount) and not _answers(st.mount, 5.0):
            _abort_fuse(st.mount)
        if lc.launched:
            stop_all(lc.launched, timeout_s=10.0)
        if mounted_by_us:
            _unmount(st.mount)
        raise
    _say("  " + mount_line)
    _print_where(lc)
    return 0


def _fs3_command() -> str:
    """How the user can run ``fs3``: the bare name when PATH finds this installation, else the
    console script's full path (after ``make run`` it lives in the checkout's .venv)."""
    exe = Path(sys.executable).with_name("fs3")
    on_path = shutil.which("fs3")
    if on_path and exe.exists() and Path(on_path).resolve() == exe.resolve():
        return "fs3"
    return str(exe) if exe.exists() else "fs3"


def _print_where(lc: LocalCluster) -> None:
    st = lc.load()
    fs3 = _fs3_command()
    _say(
        "\n".join(
            [
                f"  mgmtd:   {st.mgmtd_address} (metrics http://{st.host}:{st.ports['mgmtd_metrics']}/metrics)",
                f"  meta:    {st.host}:{st.ports['meta']}",
                f"  configs: {lc.config_dir}   logs: {lc.log_dir}",
                f"  token:   {lc.user_token_file}   secret: {lc.secret_file}",
                f"  admin:   {fs3} admin --local-dir {lc.root} list-chains",
                f"  stop:    {fs3} local down --dir {lc.root}   (add --purge to delete the data)",
            ]
        )
    )


# -- status ---------------------------------------------------------------------------------------


async def _routing_summary(lc: LocalCluster) -> dict[str, Any]:
    from fs3.client.mgmtd_client import MgmtdClient
    from fs3.client.routing import Routing
    from fs3.proto import common_pb2, mgmtd_pb2

    st = lc.load()
    secret = lc.secret_file.read_bytes().strip()
    async with MgmtdClient([st.mgmtd_address], cluster_secret=secret, timeout_s=3.0) as client:
        r = Routing((await client.get_routing_info(0)).info)
    return {
        "routing_version": r.version,
        "bootstrapping": r.bootstrapping,
        "nodes": {
            str(n.node_id): {
                "type": common_pb2.NodeType.Name(n.type),
                "status": mgmtd_pb2.NodeStatus.Name(n.status),
            }
            for n in r.nodes.values()
        },
        "chains": {
            str(c.chain_id): [
                [t.target_id, common_pb2.PublicTargetState.Name(t.public_state)] for t in c.targets
            ]
            for c in r.chains.values()
        },
    }


def cmd_status(args: argparse.Namespace) -> int:
    lc = LocalCluster(args.dir)
    st = lc.load()
    procs = {d.name: d.pid() for d in lc.all_daemons()}
    out: dict[str, Any] = {"dir": str(lc.root), "processes": procs, "mount": st.mount, "mounted": False}
    if st.mount:
        out["mounted"] = is_mounted(st.mount)
    try:
        out["routing"] = asyncio.run(_routing_summary(lc)) if procs["mgmtd"] else None
    except FS3Error as e:
        out["routing"] = None
        out["routing_error"] = str(e)
    services_up = all(procs[n] for n in lc.service_names())
    if args.json:
        print(json.dumps(out, indent=2))
        return 0 if services_up else EX_FAILED
    _say(f"fs3 local cluster in {lc.root}")
    for name, pid in procs.items():
        if name == "mount" and not st.mount:
            continue
        _say(f"  {name:<14} {'running, pid ' + str(pid) if pid else 'stopped'}")
    if st.mount:
        _say(f"  mount point    {st.mount} ({'mounted' if out['mounted'] else 'not mounted'})")
    routing = out.get("routing")
    if routing:
        _say(
            f"  routing version {routing['routing_version']}"
            + (" (bootstrapping)" if routing["bootstrapping"] else "")
        )
        for cid, targets in sorted(routing["chains"].items(), key=lambda kv: int(kv[0])):
            _say(f"  chain {cid}: " + " -> ".join(f"{t}:{s}" for t, s in targets))
    elif "routing_error" in out:
        _say(f"  routing: {out['routing_error']}")
    return 0 if services_up else EX_FAILED


# -- down -----------------------------------------------------------------------------------------


def _unmount(mount: str) -> None:
    """Unmount ``mount`` if it is still mounted: normally, else lazily (detached now, finished by
    the kernel when the last user leaves), so that the daemons behind it can stop."""
    for cmd in (["fusermount3", "-u", mount], ["umount", mount], ["fusermount3", "-u", "-z", mount]):
        if not is_mounted(mount):
            return
        if shutil.which(cmd[0]):
            try:
                subprocess.run(cmd, capture_output=True, timeout=30)
            except subprocess.TimeoutExpired:
                continue


def cmd_down(args: argparse.Namespace) -> int:
    lc = LocalCluster(args.dir)
    if not lc.exists():
        if args.purge and lc.root.exists() and any(lc.root.iterdir()):
            raise LocalError(f"{lc.root} is not an fs3 local cluster directory (no local.json); not purging")
        _say(f"fs3 local: no cluster in {lc.root}; nothing to do")
        return 0
    st = lc.load()
    if st.mount and is_mounted(st.mount) and not _answers(st.mount, 5.0):
        _abort_fuse(st.mount)  # a server stuck in the kernel cannot be stopped otherwise
    # the mount first: on SIGTERM it flushes its write buffers and unmounts itself
    killed = stop_all([lc.daemon("mount")], timeout_s=args.timeout)
    if st.mount:
        _unmount(st.mount)
    daemons = [lc.daemon(n) for n in reversed(lc.service_names())]
    # meta and storage first, mgmtd last, so that their last heartbeats still find it
    killed += stop_all(daemons[:-1], timeout_s=args.timeout)
    killed += stop_all(daemons[-1:], timeout_s=args.timeout)
    _say(
        f"fs3 local: stopped the cluster in {lc.root}"
        + (f" (killed after {args.timeout:.0f}s: {', '.join(killed)})" if killed else "")
    )
    if args.purge:
        _purge(lc)
        _say(f"fs3 local: purged {lc.root}")
    else:
        _say(f"  data kept; 'fs3 local up --dir {lc.root}' starts it again")
    return 0


def _purge(lc: LocalCluster) -> None:
    """Delete what ``fs3 local`` made in the directory, and the directory if nothing else is left."""
    st = lc.load()
    for name in ("config", "logs", "run", "kv", "storage"):
        shutil.rmtree(lc.root / name, ignore_errors=True)
    for f in (lc.secret_file, lc.admin_token_file, lc.user_token_file, lc.state_file):
        f.unlink(missing_ok=True)
    mp = Path(st.mount) if st.mount else None
    if mp is not None and not is_mounted(str(mp)):
        try:
            mp.rmdir()  # only when empty: an unmounted mount point holds nothing of ours
        except OSError:
            pass
    try:
        lc.root.rmdir()
    except OSError:
        pass


# -- command line ---------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fs3 local",
        description="Start, inspect and stop a whole fs3 cluster on this machine.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def add_dir(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--dir",
            type=Path,
            default=default_dir(),
            help="the cluster's directory (default: $FS3_LOCAL_DIR or ~/.local/share/fs3/local)",
        )
        sp.add_argument(
            "--timeout", type=float, default=60.0, help="seconds to wait for each step (default 60)"
        )

    up = sub.add_parser("up", help="start the cluster (creating it on first use) and mount it")
    add_dir(up)
    up.add_argument("--mount", help="mount point (default: DIR/mnt)")
    up.add_argument("--no-mount", action="store_true", help="do not mount")
    up.add_argument("--storage-nodes", type=int, default=None, help="storage daemons (default 3)")
    up.add_argument("--replicas", type=int, default=None, help="targets per chain (default 3)")
    up.add_argument(
        "--targets-per-node", type=int, default=4, help="targets on each storage node (default 4)"
    )
    up.add_argument("--host", default="127.0.0.1", help="address every daemon binds (default 127.0.0.1)")

    status = sub.add_parser("status", help="processes, chain states and the mount")
    add_dir(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")

    down = sub.add_parser("down", help="unmount and stop everything; keep the data unless --purge")
    add_dir(down)
    down.set_defaults(timeout=20.0)
    down.add_argument("--purge", action="store_true", help="also delete the cluster's data and files")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 local``; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.action == "up":
        if not LocalCluster(args.dir).exists():
            if args.storage_nodes is None:
                args.storage_nodes = 3
            if args.replicas is None:
                args.replicas = min(3, max(args.storage_nodes, 1))
        for flag in ("storage_nodes", "replicas", "targets_per_node"):
            v = getattr(args, flag)
            if v is not None and v < 1:
                print(f"fs3 local: --{flag.replace('_', '-')} must be at least 1", file=sys.stderr)
                return EX_USAGE
    handler = {"up": cmd_up, "status": cmd_status, "down": cmd_down}[args.action]
    try:
        return handler(args)
    except LocalError as e:
        print(f"fs3 local {args.action}: {e}", file=sys.stderr)
        return e.code
    except FS3Error as e:
        code = EX_UNAVAILABLE if e.code == StatusCode.UNAVAILABLE else EX_FAILED
        print(f"fs3 local {args.action}: {e}", file=sys.stderr)
        return code
    except OSError as e:  # e.g. a daemon's program cannot be run, a file cannot be written
        where = f" {e.filename}" if e.filename else ""
        print(f"fs3 local {args.action}: {e.strerror or e}:{where}", file=sys.stderr)
        return EX_FAILED
