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
import contextlib
import fcntl
import getpass
import importlib.util
import io
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fs3.cli import positive_seconds
from fs3.cli.daemons import Daemon, stop_all
from fs3.cli.fuse_mounts import (
    FS3_MOUNT_TYPE,
    abort,
    answers,
    is_mounted,
    mount_type,
    mounted_over,
    resolved,
    unmount,
)
from fs3.cli.local_cluster import (
    CHAIN_TABLE,
    EX_FAILED,
    EX_UNAVAILABLE,
    EX_USAGE,
    META_NODE,
    LocalCluster,
    LocalError,
    LocalState,
    config_variables,
    default_dir,
    free_ports,
    write_private,
)
from fs3.errors import FS3Error, StatusCode
from fs3.net.auth import read_secret
from fs3.net.transport import format_address

MOUNT_MODULE = "fs3.client.mount"


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
            why = d.last_error()
            hint = (
                " (a cluster keeps the ports chosen when it was made, in local.json: something else "
                "listens on that one now; stop it, or start a new cluster in another --dir)"
                if "in use" in why.lower()
                else ""
            )
            raise LocalError(f"{d.name} exited with status {code}: {why}{hint} (log: {d.log_file})")
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
    secret = read_secret(str(lc.secret_file))
    async with MgmtdClient(
        [st.mgmtd_address], cluster_secret=secret, timeout_s=30.0, log_outages=False
    ) as boot:
        try:
            root_token = await boot.init_cluster("local")
        except FS3Error as e:
            raise LocalError(
                f"init-cluster on mgmtd {st.mgmtd_address} failed: {e}"
                + (
                    f" (an earlier start was stopped while it set the cluster up; start afresh with "
                    f"'fs3 local down --dir {lc.root} --purge')"
                    if e.code == StatusCode.ALREADY_EXISTS
                    else ""
                )
            ) from None
    write_private(lc.admin_token_file, root_token.encode() + b"\n")
    async with MgmtdClient([st.mgmtd_address], token=root_token, timeout_s=30.0, log_outages=False) as admin:
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
    write_private(lc.user_token_file, user_token.encode() + b"\n")


async def _give_root_to_user(lc: LocalCluster) -> None:
    """Make the file system's root directory the local user's, so they can write to the mount."""
    from fs3.client.meta_client import ROOT_ID, MetaClient
    from fs3.proto import common_pb2

    if os.getuid() == 0:
        return
    st = lc.load()
    root_token = lc.admin_token_file.read_text().strip()
    secret = read_secret(str(lc.secret_file))
    user = common_pb2.UserInfo(uid=0, gid=0, token=root_token)
    async with MetaClient([format_address(st.host, st.ports["meta"])], secret, user=user) as meta:
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
    secret = read_secret(str(lc.secret_file))
    deadline = time.monotonic() + timeout_s
    problem = "no answer from mgmtd"
    async with MgmtdClient(
        [st.mgmtd_address], cluster_secret=secret, timeout_s=5.0, log_outages=False
    ) as client:
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
    pid = _launch(lc, d)
    port = _wait_port(d, lc.port_file(name), timeout_s)
    return f"{name}: pid {pid}, port {port}"


def _check_fuse(mount: str) -> None:
    if mount and importlib.util.find_spec(MOUNT_MODULE) is not None and not os.path.exists("/dev/fuse"):
        raise LocalError(
            f"cannot mount at {mount}: this machine has no /dev/fuse (use --no-mount)", EX_UNAVAILABLE
        )


def _check_not_anothers_mount(lc: LocalCluster | None, mount: str) -> None:
    """Refuse, before anything starts, a mount point where another fs3 mount than ``lc``'s is
    alive (the cluster was started, then stopped again, to find it in :func:`_mount`)."""
    ours = lc is not None and lc.daemon("mount").pid() is not None
    if not ours and mount_type(mount) == FS3_MOUNT_TYPE and answers(mount, 2.0):
        raise LocalError(
            f"{mount} is mounted by another fs3 (not this cluster's mount); unmount it or pick --mount",
            EX_USAGE,
        )


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
    _check_not_anothers_mount(lc, str(mp))  # (again: one may have come up meanwhile)
    if d.pid() is None and mount_type(str(mp)) == FS3_MOUNT_TYPE:
        # an earlier mount of ours whose process died ("transport endpoint is not connected")
        abort(str(mp))
        unmount(str(mp))
    try:
        mp.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalError(f"cannot create mount point {mp}: {e.strerror}") from None
    if taken := mounted_over(str(mp)):
        raise LocalError(f"{taken}, not this cluster's; unmount it or pick --mount")
    with contextlib.suppress(OSError):
        if os.listdir(mp):  # as fs3 mount says (its standard error goes to its log here)
            _say(
                f"  warning: {mp} is not empty; what it holds is hidden while the cluster is mounted over it"
            )
    pid = _launch(lc, d)
    deadline = time.monotonic() + timeout_s
    while not is_mounted(str(mp)):
        code = d.exited()
        if code is not None:
            raise LocalError(f"fs3 mount exited with status {code}: {d.last_error()} (log: {d.log_file})")
        if time.monotonic() > deadline:
            raise LocalError(f"{mp} was not mounted within {timeout_s:.0f}s (log: {d.log_file})")
        time.sleep(0.05)
    if not answers(str(mp), timeout_s):
        abort(str(mp))
        raise LocalError(f"{mp} is mounted but does not answer within {timeout_s:.0f}s (log: {d.log_file})")
    return f"mount: {mp} (pid {pid})"


def cmd_up(args: argparse.Namespace) -> int:
    lc = LocalCluster(args.dir)
    if args.host in ("0.0.0.0", "::", ""):
        raise LocalError(f"--host {args.host!r} is no address to dial; give this machine's address", EX_USAGE)
    fresh = not lc.exists()
    earlier_mount: str | None = None
    if fresh:
        st = LocalState(
            host=args.host,
            storage_nodes=args.storage_nodes,
            replicas=args.replicas,
            targets_per_node=args.targets_per_node,
            mount="" if args.no_mount else os.path.realpath(Path(args.mount or lc.root / "mnt").expanduser()),
        )
        if st.mount and (conflict := lc.mount_conflict(st.mount)):
            raise LocalError(conflict, EX_USAGE)
        if st.replicas > st.storage_nodes:
            raise LocalError(
                f"--replicas {st.replicas} needs at least as many storage nodes (--storage-nodes {st.storage_nodes})",
                EX_USAGE,
            )
        if (st.storage_nodes * st.targets_per_node) % st.replicas:
            per = _default_targets_per_node(st.storage_nodes, st.replicas)
            raise LocalError(
                f"--storage-nodes {st.storage_nodes} × --targets-per-node {st.targets_per_node} targets "
                f"do not make chains of --replicas {st.replicas}: the product must be a multiple of it "
                f"(--targets-per-node {per}, say)",
                EX_USAGE,
            )
        placement = _placement(st)
        # before anything is written: a failed first up leaves no cluster (nor a directory that
        # `fs3 local down --purge` does not take for one)
        _check_fuse(st.mount)
        if st.mount and os.path.exists(st.mount) and not os.path.isdir(st.mount):
            raise LocalError(f"--mount {st.mount} is not a directory", EX_USAGE)
        if st.mount:
            _check_not_anothers_mount(None, st.mount)  # a new cluster has no mount of its own
        try:
            free_ports(st.host, 1)
        except OSError as e:
            raise LocalError(f"cannot listen on --host {st.host}: {e.strerror or e}", EX_USAGE) from None
        lc.create(st)
        targets: dict[int, list[int]] = {}
        for t in placement.targets:
            targets.setdefault(t.node_id, []).append(t.target_id)
        lc.write_configs(targets)
        _say(f"fs3 local: new cluster in {lc.root}")
    else:
        st = lc.load()
        given = {
            "storage_nodes": args.storage_nodes,
            "replicas": args.replicas,
            "targets_per_node": args.targets_per_node,
        }
        differs = [
            f"--{k.replace('_', '-')} {v}" for k, v in given.items() if v is not None and v != getattr(st, k)
        ]
        if differs:
            raise LocalError(
                f"{lc.root} already holds a cluster of {st.storage_nodes} storage nodes with "
                f"{st.replicas} replicas; {' '.join(differs)} would need 'fs3 local down --purge' first",
                EX_USAGE,
            )
        # resolved without a stat of the mount point: with this cluster's meta down (the reason
        # for this up, often) a stat through the live mount waits out the mount's meta timeout
        new = resolved(str(Path(args.mount).expanduser())) if args.mount else ""
        if new and new != (st.mount or "/"):
            if conflict := lc.mount_conflict(new):
                raise LocalError(conflict, EX_USAGE)
            running = lc.daemon("mount").pid() if st.mount else None
            if running is not None:
                # its PID file would be the new mount's, and the old mount nobody's to stop
                raise LocalError(
                    f"the cluster is mounted at {st.mount} (pid {running}); 'fs3 local down --dir "
                    f"{lc.root}' first to mount it at {new}",
                    EX_USAGE,
                )
            earlier_mount = st.mount  # put back if this up fails (see below)
            st.mount = new
            st.save(lc.state_file)
        _say(f"fs3 local: starting the cluster in {lc.root}")
    ignored = config_variables()
    if ignored:
        _say(
            f"fs3 local: not passing {' '.join(sorted(ignored))} on to the cluster's processes "
            f"(their settings are in {lc.config_dir})"
        )
    # --no-mount on an existing cluster: start it without mounting, this time
    mounting = bool(st.mount) and not args.no_mount
    if mounting:
        _check_fuse(st.mount)
        _check_not_anothers_mount(lc, st.mount)
        if not is_mounted(st.mount) and os.path.exists(st.mount) and not os.path.isdir(st.mount):
            bad = st.mount
            if earlier_mount is not None:  # the --mount just given: not kept
                st.mount = earlier_mount
                st.save(lc.state_file)
            raise LocalError(f"mount point {bad} is not a directory", EX_USAGE)
    # SIGTERM and SIGHUP (`timeout 60 fs3 local up`, a closed terminal) end the start as Ctrl-C
    # does, through the clean-up below: they killed this command and left the daemons it had
    # started running
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        _say("  " + _start_service(lc, "mgmtd", args.timeout))
        if not st.initialized:
            with _signals_deferred(SET_UP_HOLDS):  # a set-up cut short could not be done again
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
                _launch(lc, d)
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
        mount_line = _mount(lc, args.timeout) if mounting or not st.mount else "mount: skipped (--no-mount)"
    except BaseException:
        # leave nothing half-started behind: what this command launched stops again (a second
        # SIGTERM meanwhile ends this command as it asks)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        mounted_by_us = any(d.name == "mount" for d in lc.launched)
        if mounted_by_us and is_mounted(st.mount) and not answers(st.mount, 5.0):
            abort(st.mount)
        if lc.launched:
            stop_all(lc.launched, timeout_s=10.0)
        if mounted_by_us:
            unmount(st.mount)
        if earlier_mount is not None:  # a --mount that did not work is not the cluster's
            kept = lc.load()
            kept.mount = earlier_mount
            kept.save(lc.state_file)
        raise
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    _say("  " + mount_line)
    _print_where(lc)
    return 0


#: what a stop signal during the new cluster's set-up is told (see _signals_deferred)
SET_UP_HOLDS = "stopping once the new cluster is set up (a set-up cut short cannot be redone)"


def _launch(lc: LocalCluster, d: Daemon) -> int:
    """Start ``d`` and record it among what this up launched (and stops again if the up fails),
    with stop signals held in between: a SIGTERM during the start (the Popen takes milliseconds
    here) ended this command before the daemon was recorded, and left it running."""
    with _signals_deferred():
        pid = d.start()
        lc.launched.append(d)
    return pid


@contextlib.contextmanager
def _signals_deferred(why: str | None = None) -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then act on the first one as if it
    came then (saying ``why`` when one comes). Around the new cluster's set-up: mgmtd's
    init-cluster answers its root token once, so a start stopped after it and before the set-up
    was recorded could never set up again (every later up failed with ALREADY_EXISTS until
    --purge). Around each daemon's start, see :func:`_launch`."""
    held: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        if not held and why:
            sys.stderr.write(f"fs3 local: {why}\n")
        held.append(signum)

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, hold) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


def _exit_on_signal(signum: int, _frame: object) -> None:
    """A stop signal during ``fs3 local up``: SystemExit with the shell's status for it (143 for
    SIGTERM), raised where the start is, whose clean-up then runs."""
    raise SystemExit(128 + signum)


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
                f"  mgmtd:   {st.mgmtd_address} (metrics http://{format_address(st.host, st.ports['mgmtd_metrics'])}/metrics)",
                f"  meta:    {format_address(st.host, st.ports['meta'])}",
                "  metrics: "
                + ", ".join(
                    f"{name.removesuffix('_metrics').replace('client', 'mount')} {port}"
                    for name, port in sorted(st.ports.items())
                    if name.endswith("_metrics") and port and (st.mount or name != "client_metrics")
                )
                + f" (http://{format_address(st.host, 0).rsplit(':', 1)[0]}:PORT/metrics)",
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
    secret = read_secret(str(lc.secret_file))
    async with MgmtdClient(
        [st.mgmtd_address], cluster_secret=secret, timeout_s=3.0, log_outages=False
    ) as client:
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


MOUNT_ANSWER_S = 2.0  # how long status waits for a stat of the mount point


def _mount_state(mount: str, pid: int | None) -> str:
    """What ``status`` says of the cluster's mount point: ``mounted`` (and answering), ``not
    mounted``, ``stale`` (still in the mount table, but the process serving it is gone: every
    access fails with "Transport endpoint is not connected"), or ``not answering`` (its process
    runs, a stat does not return). A stat is tried in a child process: it may hang."""
    if not is_mounted(mount):
        return "not mounted"
    if pid is None:
        # no process serves it (a stat may still answer from the kernel's cache for a moment)
        return "stale"
    return "mounted" if answers(mount, MOUNT_ANSWER_S) else "not answering"


def cmd_status(args: argparse.Namespace) -> int:
    lc = LocalCluster(args.dir)
    st = lc.load()
    procs = {d.name: d.pid() for d in lc.all_daemons()}
    out: dict[str, Any] = {"dir": str(lc.root), "processes": procs, "mount": st.mount, "mounted": False}
    if st.mount:
        out["mount_state"] = _mount_state(st.mount, procs["mount"])
        out["mounted"] = out["mount_state"] == "mounted"  # and usable
    try:
        out["routing"] = asyncio.run(_routing_summary(lc)) if procs["mgmtd"] else None
    except FS3Error as e:
        out["routing"] = None
        out["routing_error"] = str(e)
    # every daemon runs, and mgmtd answers (a stopped or hung one runs, and serves nobody)
    services_up = all(procs[n] for n in lc.service_names()) and "routing_error" not in out
    # a mount that is there and fails every access is a failure too (not mounted at all is not:
    # an up with --no-mount)
    healthy = services_up and out.get("mount_state") not in ("stale", "not answering")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0 if healthy else EX_FAILED
    _say(f"fs3 local cluster in {lc.root}")
    for name, pid in procs.items():
        if name == "mount" and not st.mount:
            continue
        where = f", {format_address(st.host, st.ports[name])}" if name in st.ports else ""
        _say(f"  {name:<14} {f'running, pid {pid}{where}' if pid else 'stopped'}")
    if st.mount:
        state = out["mount_state"]
        down = f"'fs3 local down --dir {lc.root}'"
        if state == "stale":
            state = (
                "stale: its mount process is gone, so every access fails with 'Transport endpoint is "
                f"not connected'; remove it with 'fusermount3 -u {st.mount}' or {down}"
            )
        elif state == "not answering":
            state = f"mounted but not answering within {MOUNT_ANSWER_S:.0f} s; {down} aborts it"
        _say(f"  mount point    {st.mount} ({state})")
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
    return 0 if healthy else EX_FAILED


# -- down -----------------------------------------------------------------------------------------


def cmd_down(args: argparse.Namespace) -> int:
    lc = LocalCluster(args.dir)
    if not lc.exists():
        if args.purge and lc.root.exists() and any(lc.root.iterdir()):
            raise LocalError(f"{lc.root} is not an fs3 local cluster directory (no local.json); not purging")
        _say(f"fs3 local: no cluster in {lc.root}; nothing to do")
        return 0
    st = lc.load()
    ours = lc.daemon("mount").pid() is not None
    foreign = False
    if st.mount and is_mounted(st.mount):
        if not answers(st.mount, 5.0):
            abort(st.mount)  # a server stuck in the kernel (or dead) cannot be stopped otherwise
        elif not ours:
            foreign = True  # alive but not served by this cluster's mount daemon: not ours
    users = _users_of(st.mount) if st.mount and not foreign and is_mounted(st.mount) else []
    # the mount first: on SIGTERM it flushes its write buffers and unmounts itself
    killed = stop_all([lc.daemon("mount")], timeout_s=args.timeout)
    if st.mount and not foreign:
        unmount(st.mount)
        if users:  # unmounted lazily (by the mount, or here): said, as `fs3 umount` refuses it
            _say(
                f"fs3 local: {st.mount} was in use (pids {', '.join(map(str, users[:10]))}"
                f"{', ...' if len(users) > 10 else ''}): detached; those processes now get "
                "'Transport endpoint is not connected' there"
            )
    elif foreign:
        _say(f"fs3 local: left {st.mount} mounted: another fs3 serves it, not this cluster")
    daemons = [lc.daemon(n) for n in reversed(lc.service_names())]
    # meta and storage first, mgmtd last, so that their last heartbeats still find it
    killed += stop_all(daemons[:-1], timeout_s=args.timeout)
    killed += stop_all(daemons[-1:], timeout_s=args.timeout)
    _say(
        f"fs3 local: stopped the cluster in {lc.root}"
        + (f" (killed after {args.timeout:.0f}s: {', '.join(killed)})" if killed else "")
    )
    for pid, where in _other_mounts(lc):
        _say(
            f"fs3 local: warning: {where} (pid {pid}) is another mount of this cluster, left up: every "
            f"access there fails while the cluster is stopped; unmount it: fs3 umount {where}"
        )
    if args.purge:
        _purge(lc)
        _say(f"fs3 local: purged {lc.root}")
    else:
        _say(f"  data kept; 'fs3 local up --dir {lc.root}' starts it again")
    return 0


def _processes() -> Iterator[tuple[int, Path]]:
    """Every other process's pid and /proc directory."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me:
            yield int(entry.name), entry


def _users_of(mount: str) -> list[int]:
    """Processes with their working directory, root or an open file in the file system mounted
    at ``mount`` (not the directory under it, which a process may have entered before the mount
    went up). Called on a mount that answers."""
    top = mount.rstrip("/") or "/"
    try:
        device = os.stat(top).st_dev
    except OSError:
        return []
    found = []
    for pid, entry in _processes():
        try:
            links = [entry / "cwd", entry / "root", *(entry / "fd").iterdir()]
        except OSError:
            continue
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target == top or target.startswith(top + "/"):
                try:
                    if os.stat(link).st_dev != device:
                        continue
                except OSError:
                    continue
                found.append(pid)
                break
    return sorted(found)


def _other_mounts(lc: LocalCluster) -> list[tuple[int, str]]:
    """``fs3 mount`` processes of this cluster's client config (not its own mount, stopped by
    now): (pid, mount point), their command lines read by fs3 mount's own parser."""
    if importlib.util.find_spec(MOUNT_MODULE) is None:
        return []  # no fs3 mount in this build: none runs
    from fs3.client.mount import _parser

    parser = _parser()
    config = os.path.realpath(lc.root / "config" / "client.toml")
    found = []
    for pid, entry in _processes():
        try:
            args = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if "mount" not in args:
            continue
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # not a mount's command line: quietly
                parsed = parser.parse_known_args(args[args.index("mount") + 1 :])[0]
        except SystemExit:
            continue
        if not parsed.config or os.path.realpath(os.path.join(cwd, parsed.config)) != config:
            continue
        found.append((pid, os.path.normpath(os.path.join(cwd, parsed.mountpoint))))
    return found


def _purge(lc: LocalCluster) -> None:
    """Delete what ``fs3 local`` made in the directory, and the directory if nothing else is left."""
    st = lc.load()
    for name in ("config", "logs", "run", "kv", "storage"):
        shutil.rmtree(lc.root / name, ignore_errors=True)
    for f in (lc.secret_file, lc.admin_token_file, lc.user_token_file, lc.state_file, lc.lock_file):
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
            "--timeout",
            type=positive_seconds,
            default=60.0,
            help="seconds to wait for each step (default 60)",
        )

    up = sub.add_parser("up", help="start the cluster (creating it on first use) and mount it")
    add_dir(up)
    up.add_argument("--mount", help="mount point (default: DIR/mnt)")
    up.add_argument("--no-mount", action="store_true", help="do not mount")
    up.add_argument("--storage-nodes", type=int, default=None, help="storage daemons (default 3)")
    up.add_argument("--replicas", type=int, default=None, help="targets per chain (default 3)")
    up.add_argument(
        "--targets-per-node",
        type=int,
        default=None,
        help="targets on each storage node (default 4, or the nearest number making whole chains)",
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


@contextlib.contextmanager
def _exclusive(lc: LocalCluster, creating: bool = False) -> Iterator[None]:
    """Hold the lock of the cluster's directory (an flock of the directory itself: no lock file
    is dropped into a stranger's directory), so that two up/down commands never work on one
    cluster at once, nor two first ups make two clusters in one directory. ``creating`` (an up)
    makes the directory first where there is none; one made here and left empty by a failed up
    goes again."""
    made = False
    if creating and not lc.root.exists():
        try:
            lc.root.mkdir(parents=True)
            made = True
        except FileExistsError:
            pass
        except OSError as e:
            raise LocalError(f"cannot create {lc.root}: {e.strerror}") from None
    if not lc.root.is_dir():
        yield  # nothing to lock: a status or down of nothing, or an up that will say why
        return
    fd = os.open(lc.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalError(
                f"another 'fs3 local' command is working on {lc.root}; try again when it ends"
            ) from None
        yield
    finally:
        os.close(fd)  # and with it the lock
        if made and not lc.exists():
            with contextlib.suppress(OSError):
                lc.root.rmdir()  # only if still empty


def _default_targets_per_node(nodes: int, replicas: int) -> int:
    """4, or the number nearest it that makes every target one of a chain's ``replicas``: the
    targets, ``nodes`` times it, a multiple of ``replicas`` (--storage-nodes 4 was refused
    with the default 4 and 3 replicas)."""
    if nodes < 1 or replicas < 1:
        return 4  # (refused below, naming the flag)
    step = replicas // math.gcd(nodes, replicas)
    return max(step, round(4 / step) * step)


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 local``; returns the exit status."""
    args = _parser().parse_args(argv)
    handler = {"up": cmd_up, "status": cmd_status, "down": cmd_down}[args.action]
    try:
        if args.action == "up":
            if not LocalCluster(args.dir).exists():
                if args.storage_nodes is None:
                    args.storage_nodes = 3
                if args.replicas is None:
                    args.replicas = min(3, max(args.storage_nodes, 1))
                if args.targets_per_node is None:
                    args.targets_per_node = _default_targets_per_node(args.storage_nodes, args.replicas)
            for flag in ("storage_nodes", "replicas", "targets_per_node"):
                v = getattr(args, flag)
                if v is not None and v < 1:
                    print(f"fs3 local: --{flag.replace('_', '-')} must be at least 1", file=sys.stderr)
                    return EX_USAGE
        if args.action == "status":
            return handler(args)
        with _exclusive(LocalCluster(args.dir), creating=args.action == "up"):
            return handler(args)
    except LocalError as e:
        print(f"fs3 local {args.action}: {e}", file=sys.stderr)
        return e.code
    except FS3Error as e:
        code = EX_UNAVAILABLE if e.code == StatusCode.UNAVAILABLE else EX_FAILED
        print(f"fs3 local {args.action}: {e}", file=sys.stderr)
        return code
    except BrokenPipeError:
        raise  # the reader of the output went away (`fs3 local status | head`): fs3's main says so
    except OSError as e:  # e.g. a daemon's program cannot be run, a file cannot be written
        what = f"{e.strerror or e}: {e.filename}" if e.filename else f"{e.strerror or e}"
        print(f"fs3 local {args.action}: {what}", file=sys.stderr)
        return EX_FAILED
