"""The `fs3` console script: help, version, config templates, and honest answers for what is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fs3.cli.main import EX_UNAVAILABLE, SUBCOMMANDS

FS3 = [sys.executable, "-m", "fs3.cli.main"]


def fs3(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*FS3, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_subcommand():
    out = fs3("--help")
    assert out.returncode == 0
    for name in SUBCOMMANDS:
        assert name in out.stdout


def test_console_script_is_installed():
    exe = shutil.which("fs3") or str(__import__("pathlib").Path(sys.executable).with_name("fs3"))
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("fs3 ")


def test_unknown_subcommand_is_a_usage_error():
    out = fs3("frobnicate")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr
    out = fs3()  # named the parser's internal "args" as missing
    assert out.returncode == 2 and "args" not in out.stderr
    assert out.stderr.splitlines()[-1] == "fs3: error: a COMMAND is needed; 'fs3 --help' lists them"


def test_missing_subcommands_say_so():
    import importlib.util

    missing = [n for n, s in SUBCOMMANDS.items() if importlib.util.find_spec(s.module) is None]
    for name in missing:
        out = fs3(name, "--help")
        assert out.returncode == EX_UNAVAILABLE
        assert "not available in this build" in out.stderr
        assert f"issue {SUBCOMMANDS[name].issue}" in out.stderr


@pytest.mark.parametrize("service", ["mgmtd", "meta", "storage", "client"])
def test_config_template_round_trips(tmp_path, service):
    out = fs3("config-template", service)
    assert out.returncode == 0
    path = tmp_path / f"{service}.toml"
    path.write_text(out.stdout)
    check = fs3("config-template", service, "--check", str(path))
    assert check.returncode == 0, check.stderr


def test_config_check_reports_unknown_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("listen_port = 1\nlisten_prot = 2\n")
    out = fs3("config-template", "meta", "--check", str(path))
    assert out.returncode == 2  # as the daemon exits for it
    assert "unknown key 'listen_prot'" in out.stderr and str(path) in out.stderr


@pytest.mark.parametrize("service", ["mgmtd", "meta", "storage", "mount"])
def test_a_bad_log_level_is_a_usage_error_not_a_traceback(service: str) -> None:
    argv = ["mount", "/tmp"] if service == "mount" else [service]
    out = fs3(*argv, "--log-level", "verbose")
    assert out.returncode == 2 and "--log-level" in out.stderr and "Traceback" not in out.stderr


def test_admin_number_lists_are_usage_errors_not_tracebacks() -> None:
    out = fs3("admin", "gen-chains", "--nodes", "3", "--disks", "1", "--targets-per-disk", "1",
              "--replicas", "3", "--node-ids", "a,b,c")  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        "fs3 admin gen-chains: --node-ids takes comma-separated whole numbers, not 'a,b,c'"
    )


def test_mount_with_an_unwritable_log_file_says_so_in_one_line(tmp_path) -> None:
    cfg = tmp_path / "client.toml"
    cfg.write_text('[log]\nfile = "/nonexistent/dir/x.log"\n')
    out = fs3("mount", str(tmp_path), "--config", str(cfg), "--foreground")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "fs3 mount: cannot open log file /nonexistent/dir/x.log: No such file or directory"
    ]


def test_mount_refuses_max_read_before_mounting(tmp_path) -> None:
    """libfuse refuses the FUSE session after the mount with it under pyfuse3: the command said
    'mounted' and exited 0 with nothing mounted."""
    out = fs3("mount", str(tmp_path), "-o", "noatime", "-o", "ro,max_read=131072")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("fs3 mount: -o max_read is not supported: "), out.stderr


def test_mount_refuses_atime_options_before_mounting(tmp_path) -> None:
    """fs3 keeps no access times: "-o atime" was taken (the mount table said relatime) and reads
    moved nothing."""
    for option in ("atime", "rw,strictatime", "relatime"):
        out = fs3("mount", str(tmp_path), "-o", option)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().startswith(
            f"fs3 mount: -o {option.split(',')[-1]} is not supported: fs3 keeps no access times"
        ), out.stderr


def test_mount_refuses_an_unknown_event_loop_before_mounting(tmp_path, monkeypatch) -> None:
    """FS3_FUSE_LOOP=bogus mounted on uvloop without a word."""
    monkeypatch.setenv("FS3_FUSE_LOOP", "bogus")
    out = fs3("mount", str(tmp_path), "--foreground")
    assert (
        out.returncode == 2 and "FS3_FUSE_LOOP is uvloop (the default) or asyncio, not 'bogus'" in out.stderr
    )


def test_a_detached_mount_that_fails_says_why_once(tmp_path) -> None:
    """The reason is printed: no '(see the log)' after it (it was, even with no log file)."""
    cfg = tmp_path / "dead.toml"
    cfg.write_text('mgmtd_addresses = ["127.0.0.1:1"]\nrpc_timeout_s = 2.0\n')
    out = fs3("mount", str(tmp_path), "--config", str(cfg))
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1].startswith("fs3 mount: mgmtd 127.0.0.1:1: "), out.stderr
    assert "did not come up" not in out.stderr and "see the log" not in out.stderr, out.stderr
    # with no log file, what a mount in the background logs is discarded: said, once, up front
    assert out.stderr.count("the mount's log is discarded once it runs in the background") == 1, out.stderr


def _forked_child(pid: int) -> int:
    """The detached mount process ``fs3 mount`` (process ``pid``) forks, once it has."""
    import time

    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + 30
    while not children.read_text().split():
        assert time.monotonic() < deadline, "fs3 mount did not fork"
        time.sleep(0.02)
    return int(children.read_text().split()[0])


def test_a_detached_mount_killed_before_it_came_up_points_to_the_log(tmp_path) -> None:
    """Nothing said why: the command says how the mount process ended, and where its log is."""
    import os
    import signal
    import socket

    with socket.socket() as silent:  # takes connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        cfg = tmp_path / "silent.toml"
        log = tmp_path / "mount.log"
        cfg.write_text(
            f'mgmtd_addresses = ["127.0.0.1:{silent.getsockname()[1]}"]\nrpc_timeout_s = 60.0\n'
            f'[log]\nfile = "{log}"\n'
        )
        mnt = tmp_path / "mnt"  # empty: no warning that files are hidden
        mnt.mkdir()
        p = subprocess.Popen(
            [*FS3, "mount", str(mnt), "--config", str(cfg)], stderr=subprocess.PIPE, text=True
        )
        try:
            os.kill(_forked_child(p.pid), signal.SIGKILL)
            err = p.communicate(timeout=30)[1]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 1
    assert err.splitlines() == [
        f"fs3 mount: the mount did not come up: its process was killed by SIGKILL (see the log: {log})"
    ]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_a_mount_coming_up_stops_the_mount_too(tmp_path, sig: str) -> None:
    """Ctrl-C on `fs3 mount` while it connected: the command exited 130 and its detached mount
    process (a session of its own, which a terminal's Ctrl-C does not reach) went on and mounted.
    The signal is passed on; the command ends once the mount process has."""
    import os
    import signal
    import socket
    import time

    with socket.socket() as silent:  # takes connections and never answers: the mount waits
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        cfg = tmp_path / "silent.toml"
        cfg.write_text(f'mgmtd_addresses = ["127.0.0.1:{silent.getsockname()[1]}"]\nrpc_timeout_s = 60.0\n')
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        p = subprocess.Popen(
            [*FS3, "mount", str(mnt), "--config", str(cfg)], stderr=subprocess.PIPE, text=True
        )
        child = 0
        try:
            child = _forked_child(p.pid)
            time.sleep(0.5)  # connecting
            p.send_signal(getattr(signal, sig))
            err = p.communicate(timeout=30)[1]
            assert p.returncode == 128 + getattr(signal, sig), err
            assert err.splitlines()[-1] == f"fs3 mount: stopped by {sig}", err
            assert (
                not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()
            )
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            if child and Path(f"/proc/{child}").exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)


def test_files_that_are_not_text_are_named_not_a_traceback(tmp_path: Path) -> None:
    """A binary token, secret or chain-table file, or config: one line naming the file (they
    ended in a UnicodeDecodeError traceback)."""
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    for args in (
        ("admin", "--mgmtd", "127.0.0.1:1", "--token-file", str(binary), "list-nodes"),
        ("admin", "--mgmtd", "127.0.0.1:1", "--secret-file", str(binary), "list-nodes"),
        ("admin", "--mgmtd", "127.0.0.1:1", "upload-chains", str(binary)),
        ("mgmtd", "--config", str(binary)),
    ):
        out = fs3(*args)
        assert out.returncode != 0 and "Traceback" not in out.stderr, (args, out.stderr)
        assert str(binary) in out.stderr and ("UTF-8" in out.stderr or "not text" in out.stderr), out.stderr


def test_admin_with_a_damaged_local_state_file_or_no_cluster_says_what_to_do(tmp_path: Path) -> None:
    """A damaged local.json ended in a JSONDecodeError or KeyError traceback; a cluster that is not
    up gave gRPC's "failed to connect to all addresses" and nothing on which cluster was tried."""
    import os

    local = tmp_path / "local"
    local.mkdir()
    (local / "cluster.secret").write_text("0123456789abcdef0123")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    for key in ("FS3_LOCAL_DIR", "FS3_MGMTD_ADDRESSES", "FS3_TOKEN_FILE", "FS3_TOKEN"):
        env.pop(key, None)

    def admin(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*FS3, "admin", *args], capture_output=True, text=True, timeout=60, env=env)

    for content, what in (("{bad", "Expecting property name"), ("{}", "no 'host' in it")):
        (local / "local.json").write_text(content)
        out = admin("--local-dir", str(local), "list-chains")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert f"cannot read {local / 'local.json'} ({what}" in out.stderr, out.stderr
    (local / "local.json").write_text('{"host": "127.0.0.1", "ports": {"mgmtd": 1}}')
    out = admin("--local-dir", str(local), "--timeout", "2", "list-chains")
    assert out.returncode == EX_UNAVAILABLE, out.stderr
    assert f"start it with: fs3 local up --dir {local}" in out.stderr, out.stderr
    out = admin("--timeout", "2", "list-chains")  # no cluster named, none in the default directory
    assert out.returncode == EX_UNAVAILABLE, out.stderr
    assert "the default 127.0.0.1:8000 was tried: pass --mgmtd" in out.stderr, out.stderr


def test_mount_and_umount_name_a_missing_directory_and_warn_of_a_non_empty_one(tmp_path) -> None:
    """A missing mount point was "not a directory" (mount) and "not a mount point" (umount); a
    non-empty one was mounted over without a word, its files hidden."""
    missing = tmp_path / "nope"
    out = fs3("mount", str(missing))
    assert out.returncode == 2
    assert out.stderr.strip() == f"fs3 mount: {missing} does not exist (create it first: mkdir -p)"
    out = fs3("umount", str(missing))
    assert out.returncode == 1 and out.stderr.strip() == f"fs3 umount: {missing} does not exist"
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("hidden while mounted")
    cfg = tmp_path / "dead.toml"
    cfg.write_text('mgmtd_addresses = ["127.0.0.1:1"]\nrpc_timeout_s = 1.0\n')
    out = fs3("mount", str(full), "--config", str(cfg), "--foreground")
    assert out.returncode == 1  # no cluster there; the warning came first
    assert out.stderr.splitlines()[0] == (
        f"fs3 mount: warning: {full} is not empty; what it holds is hidden while fs3 is mounted over it"
    ), out.stderr


def test_local_cluster_ports_lie_below_the_ephemeral_range() -> None:
    """`fs3 local` keeps its ports across down and up: taken from the ephemeral range, one could be
    some connection's local port by the next up ("Address already in use" on a metrics port)."""
    from fs3.cli.local_cluster import _ephemeral_low, free_ports

    ports = free_ports("127.0.0.1", 12)
    assert len(set(ports)) == 12
    assert all(1024 <= p < _ephemeral_low() for p in ports), ports


def test_admin_arguments_that_meant_something_else_are_usage_errors() -> None:
    """A --mgmtd without a port dialled port 443, an empty one the default address; --stripe 0 was taken for no --stripe at all
    (with another option it was dropped without a word, alone it said none was named)."""
    out = fs3("admin", "--mgmtd", "127.0.0.1", "list-nodes")
    assert out.returncode == 2 and "'127.0.0.1', not host:port" in out.stderr, out.stderr
    # an empty --mgmtd (a variable that was not set) named no cluster: the default was dialled
    for empty in ("", " , "):
        out = fs3("admin", "--mgmtd", empty, "list-nodes")
        assert out.returncode == 2 and "names no address" in out.stderr, out.stderr
    for flag in ("--stripe", "--chain-table", "--chunk-size"):
        out = fs3("admin", "--mgmtd", "127.0.0.1:1", "set-layout", "/", flag, "0", "--stripe", "2")
        if flag == "--stripe":  # the last one counts
            out = fs3("admin", "--mgmtd", "127.0.0.1:1", "set-layout", "/", "--chunk-size", "1M", flag, "0")
        assert out.returncode == 2 and f"{flag} must be from 1 to" in out.stderr, out.stderr


def test_admin_text_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    """A --desc (or a user name) of bytes that are not UTF-8 reached protobuf as surrogates and
    ended in a traceback (UnicodeEncodeError), exit 1 (a review)."""
    cfg = tmp_path / "meta.toml"
    cfg.write_text("gc_interval_s = 7.5\n")
    bad = b"\xe9" * 8
    for args in (
        [b"config", b"set", b"meta", str(cfg).encode(), b"--desc", bad],
        [b"user-add", b"5000", bad],
        [b"user-set", b"5000", b"--name", bad],
        [b"upload-chain-table", b"1", b"table.txt", b"--desc", bad],
    ):
        out = subprocess.run(
            [*map(os.fsencode, FS3), b"admin", b"--mgmtd", b"127.0.0.1:1", *args],
            capture_output=True,
            timeout=60,
        )
        assert out.returncode == 2 and b"is not valid UTF-8" in out.stderr, (args, out.stderr)
        assert b"Traceback" not in out.stderr


def test_mount_locks_leave_no_files_behind_and_still_exclude(tmp_path: Path, monkeypatch) -> None:
    """Each mount point ever mounted left its lock file in /run/fs3 (1,796 on one machine); the
    file now goes as its lock is let go, and a mount waiting for it then locks a file of its own."""
    import threading
    import time

    from fs3.client import mount

    monkeypatch.setattr(mount, "_lock_dir", lambda: str(tmp_path))
    first = mount._mount_lock("/mnt/a")
    waiting: list[int | None] = []
    t = threading.Thread(target=lambda: waiting.append(mount._mount_lock("/mnt/a")))
    t.start()
    time.sleep(0.3)
    assert not waiting  # excluded while the first holds it
    other = mount._mount_lock("/mnt/b")  # another mount point's lock is another's
    mount._unlock(other)
    mount._unlock(first)
    t.join(10)
    assert waiting and waiting[0] is not None
    assert len(list(tmp_path.iterdir())) == 1  # the waiter's own file, made after the first went
    later: list[int | None] = []
    t = threading.Thread(target=lambda: later.append(mount._mount_lock("/mnt/a")))
    t.start()
    time.sleep(0.3)
    assert not later  # the waiter's lock excludes as the first's did
    mount._unlock(waiting[0])
    mount._unlock(waiting[0])  # again: nothing
    t.join(10)
    assert later and later[0] is not None
    mount._unlock(later[0])
    assert list(tmp_path.iterdir()) == []
