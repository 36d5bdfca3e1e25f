"""The files of an ``fs3 local`` cluster directory: its state, secret, tokens, configs, and the
daemons that run from them (see :mod:`fs3.local` for the layout)."""

from __future__ import annotations

import errno
import json
import os
import random
import secrets
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fs3.cli.daemons import Daemon
from fs3.net.transport import format_address

EX_FAILED = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
STATE_FORMAT = 1
FIRST_STORAGE_NODE = 10001
META_NODE = 100
CHAIN_TABLE = 1

# A local cluster restarts often and has nothing across a network to wait for, so failures and
# restarts are noticed within seconds rather than the production defaults' tens of seconds.
MGMTD_SETTINGS = {"lease_interval_s": 2.5, "heartbeat_timeout_s": 6.0, "chain_update_interval_s": 0.2}
STORAGE_SETTINGS = {"heartbeat_interval_s": 1.0, "routing_refresh_interval_s": 0.5}


class LocalError(Exception):
    """A failure ``fs3 local`` reports as one line and exit status ``code``."""

    def __init__(self, message: str, code: int = EX_FAILED) -> None:
        super().__init__(message)
        self.code = code


def config_variables() -> frozenset[str]:
    """The ``FS3_*`` variables of this environment that would override a setting of a daemon's or
    the mount's config: not passed on to the processes of a local cluster, whose configs say all
    (the same names serve ``fs3 admin``: one exported for another cluster's admin commands made the
    local daemons dial that cluster's mgmtd, or the mount use the admin's token)."""
    from fs3.config import SERVICE_CONFIGS, overriding_variables

    return frozenset(name for cls in SERVICE_CONFIGS.values() for name in overriding_variables(cls))


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
        return format_address(self.host, self.ports["mgmtd"])


class LocalCluster:
    """The files and daemons of one local cluster directory."""

    def __init__(self, root: Path) -> None:
        # one spelling of the directory whatever the caller's (a symlink, '..'): the daemons are
        # known by their config paths under it
        self.root = root.expanduser().resolve()
        self.state_file = self.root / "local.json"
        self.lock_file = self.root / ".lock"  # the lock of older versions (now: flock of root)
        self.secret_file = self.root / "cluster.secret"
        self.admin_token_file = self.root / "admin.token"
        self.user_token_file = self.root / "user.token"
        self.config_dir = self.root / "config"
        self.log_dir = self.root / "logs"
        self.run_dir = self.root / "run"
        self.kv_dir = self.root / "kv"
        self.storage_dir = self.root / "storage"
        self.state: LocalState | None = None
        self.launched: list[Daemon] = []  # what this command started, stopped again if `up` fails

    # -- files ------------------------------------------------------------------------------------

    def exists(self) -> bool:
        try:
            return self.state_file.exists()
        except OSError as e:  # not ENOENT (exists() says False): EACCES, ENAMETOOLONG, ...
            raise LocalError(f"cannot use {self.root}: {e.strerror}") from None

    def own_entries(self) -> list[Path]:
        """What the cluster directory holds of its own (a mount point may be another directory in
        it: ``mnt`` is the default)."""
        return [
            self.state_file,
            self.lock_file,
            self.secret_file,
            self.admin_token_file,
            self.user_token_file,
            self.config_dir,
            self.log_dir,
            self.run_dir,
            self.kv_dir,
            self.storage_dir,
        ]

    def mount_conflict(self, mount: str) -> str | None:
        """Why ``mount`` cannot be this cluster's mount point, or None: it may not be the cluster's
        directory, a directory holding it, or one of the cluster's own files or directories (the
        daemons would keep their data under the mount they serve, and 'fs3 local' could no longer
        see the cluster it started)."""
        m, root = Path(os.path.realpath(mount)), Path(os.path.realpath(self.root))
        if m == root or m in root.parents:
            return f"--mount {mount} would hide the cluster's own directory {self.root}"
        own = {p.name for p in self.own_entries()}
        if root in m.parents and m.relative_to(root).parts[0] in own:
            return f"--mount {mount} is one of the cluster's own files or directories in {self.root}"
        return None

    def load(self) -> LocalState:
        if self.state is None:
            if not self.exists():
                raise LocalError(f"no local cluster in {self.root} (run 'fs3 local up --dir {self.root}')")
            self.state = LocalState.load(self.state_file)
        return self.state

    def target_dir(self, node_id: int, target_id: int) -> Path:
        return self.storage_dir / str(node_id) / f"target-{target_id}"

    @staticmethod
    def _disk_of(target: Path) -> Path:
        """The target path, with its parent (the node's "disk") made: storage creates only the
        target directory itself."""
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

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
        write_private(self.secret_file, secrets.token_hex(32).encode() + b"\n")
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
                # none here: the cluster's own mount gets its port from its environment (see
                # daemon), so that a second `fs3 mount --config client.toml` does not clash
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
                target_paths=[str(self._disk_of(self.target_dir(node_id, t))) for t in tids],
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
            # marked by this cluster's client config, not the mount point: another fs3 mount of
            # the same path (a production unit, another local cluster) is not ours to stop
            pid, log = self.run_dir / "mount.pid", self.log_dir / "mount.log"
            port = st.ports.get("client_metrics")
            env = {"FS3_METRICS_PORT": str(port)} if port else None
            return Daemon(name, argv, cfg, pid, log, drop_env=config_variables(), env=env)
        module = {"mgmtd": "fs3.mgmtd", "meta": "fs3.meta"}.get(name, "fs3.storage")
        cfg = str(self.config_path(name))
        argv = [py, "-m", module, "--config", cfg, "--port-file", str(self.port_file(name))]
        pid, log = self.run_dir / f"{name}.pid", self.log_dir / f"{name}.log"
        return Daemon(name, argv, cfg, pid, log, drop_env=config_variables())

    def service_names(self) -> list[str]:
        """Daemons in start order (stop in reverse)."""
        st = self.load()
        return ["mgmtd", "meta", *(f"storage-{n}" for n in st.storage_node_ids)]

    def all_daemons(self) -> list[Daemon]:
        return [self.daemon(n) for n in [*self.service_names(), "mount"]]


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports free on ``host`` now (held open together so none repeats), below the
    kernel's ephemeral range where it can: a cluster keeps its ports across `down` and `up`, and
    a port of that range may meanwhile be the local port of some process's connection (an `up`
    after a `down` failed with "Address already in use" on a metrics port until it closed)."""
    socks: list[socket.socket] = []
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        low = _ephemeral_low()
        candidates = list(range(max(1024, low - 16384), low))
        random.shuffle(candidates)
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError as e:
                s.close()
                if e.errno != errno.EADDRINUSE:
                    raise
                continue
            socks.append(s)
        while len(socks) < n:  # none free below the range: any the kernel gives
            s = socket.socket(family, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read (secrets and tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
