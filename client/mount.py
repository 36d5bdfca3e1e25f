"""``fs3 mount MOUNTPOINT [--config PATH] [--foreground] [-o OPTIONS]``: the FUSE mount.

Connects to the cluster (:class:`fs3.client.FileSystem`), mounts with pyfuse3 on asyncio and serves
until unmounted: by ``fusermount3 -u`` / ``umount``, or by SIGTERM, SIGINT or SIGHUP, after which it flushes
and closes every open file, unmounts, and exits 0. Requests that only read and are still waiting
``READ_GRACE_S`` after that (on storage that does not answer) are ended with ENOTCONN, not waited
for; writes and flushes are. The closes of files left open get ``UNMOUNT_CLOSE_WAIT_S`` together
(:meth:`Fs3Operations.close_all`): one still flushing goes on in the background, and the exit
waits for its data (and for meta to end its session, within the RPC deadline). Without
``--foreground`` it detaches once the mount is up (the command returns 0 then, or 1 with the
reason when mounting failed).

The event loop is uvloop (``FS3_FUSE_LOOP=asyncio`` selects the standard loop): pyfuse3 only needs
``add_reader`` on the FUSE device, which uvloop provides, and the RPC clients are faster on it.
The FUSE device stays registered with the loop between requests (``fs3.client.fuse_wait``;
``FS3_FUSE_WAIT=pyfuse3`` keeps pyfuse3's register-and-remove per request).

After mounting it raises the mount's readahead (``read_ahead_kb`` of its bdi; page-cache reads
follow it, and 128 KiB, the kernel's default, halves sequential read throughput here) and the FUSE
connection's ``max_background`` and ``congestion_threshold`` (parallel readahead and async
requests), all found through ``/proc/self/mountinfo`` without touching the mount itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import select
import signal
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fs3.background import Periodic, cancel_and_wait
from fs3.cli.fuse_mounts import (
    FS3_MOUNT_TYPE,
    dead,
    fuse_connections,
    is_mounted,
    mount_device,
    mount_type,
    mounted_over,
    resolved,
    unmount,
)
from fs3.config import ClientConfig, load_config
from fs3.daemon import STOP_SIGNALS, apply_pushed_config, ensure_std_fds, hot_log_level, log_env_overrides
from fs3.errors import FS3Error, StatusCode
from fs3.memory import glibc_function

if TYPE_CHECKING:
    from fs3.client.filesystem import FileSystem
    from fs3.client.fuse_ops import Fs3Operations

log = logging.getLogger(__name__)

# FUSE requests the kernel keeps in flight in the background (readahead, async direct I/O), and
# the count past which it throttles new ones: enough for a few fio jobs at queue depth 16-32 and a
# 4 MiB readahead window, so the storage daemons always have work queued.
MAX_BACKGROUND = 128
CONGESTION_THRESHOLD = 96
# pyfuse3 worker tasks: each takes one request off /dev/fuse and serves it. MIN_IDLE_WORKERS stay
# waiting when the load drops, so a burst does not pay for creating tasks again; MAX_WORKERS is
# above MAX_BACKGROUND plus the synchronous requests of a few dozen callers.
MIN_IDLE_WORKERS = 16
MAX_WORKERS = 256
# Once the FUSE session is over (an unmount aborted the connection, or a signal asked the mount to
# stop), requests that only read get this long to finish before they are ended: one waiting on
# storage that does not answer would otherwise keep the process (and, after a signal, the mount
# point: nobody serves it until the process unmounts it) for the whole retry budget, a minute.
READ_GRACE_S = 2.0
#: at unmount, how long the client's close waits for the writes of files closed in the background
#: (after Fs3Operations.close_all's own wait): the whole stop stays within systemd's TimeoutStopSec
UNMOUNT_GIVE_UP_S = 30.0
SESSION_CHECK_S = 0.5


def fuse_device_fd() -> int | None:
    """The descriptor of /dev/fuse this process holds (pyfuse3 does not say it), or None."""
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
    return None


def connection_aborted(fd: int) -> bool:
    """Whether the kernel has ended the FUSE connection on ``fd`` (unmounted, or aborted through
    fusectl): the device then polls POLLERR, as libfuse checks before it unmounts."""
    p = select.poll()
    p.register(fd, 0)
    return any(ev & (select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0))


async def end_reads_when_over(fd: int | None, stopping: asyncio.Event, ops: Fs3Operations) -> None:
    """Wait until the FUSE session is over (``stopping`` set, or the connection on ``fd`` ended:
    then :func:`fuse_wait.device_gone`), then READ_GRACE_S more, and end the reads still in flight
    (:meth:`Fs3Operations.abandon_reads`); UNMOUNT_CLOSE_WAIT_S after that, give up the closes
    (RELEASE) still in flight (:meth:`Fs3Operations.abandon_releases`)."""
    from fs3.client import fuse_wait
    from fs3.client.fuse_ops import UNMOUNT_CLOSE_WAIT_S

    while not stopping.is_set() and (fd is None or not connection_aborted(fd)):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SESSION_CHECK_S):
                await stopping.wait()
    if fd is not None and connection_aborted(fd):
        fuse_wait.device_gone()  # pyfuse3's workers may wait for it for ever otherwise
    await asyncio.sleep(READ_GRACE_S)
    if n := ops.abandon_reads():
        log.info("ended reads still in flight after the FUSE session was over count=%d", n)
    await asyncio.sleep(UNMOUNT_CLOSE_WAIT_S)
    if n := ops.abandon_releases():
        log.warning("gave up closes still in flight after the FUSE session was over count=%d", n)


# the end of pyfuse3's "fuse_xxx(): fuse_reply_* failed with %s" for ENOENT
_ENOENT_TEXT = f"failed with {os.strerror(errno.ENOENT)}"


class _AbandonedReplies(logging.Filter):
    """pyfuse3 logs an ERROR when the kernel refuses a reply with ENOENT; the kernel does so when it
    no longer waits for the request: interrupted, or the connection aborted by an unmount (a RELEASE,
    which the kernel sends after close(2) has returned, is often answered just after a prompt
    unmount). Nothing is lost then, so the line is logged at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage().endswith(_ENOENT_TEXT):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("pyfuse3").isEnabledFor(logging.DEBUG)
        return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fs3 mount", description="Mount fs3 with FUSE.")
    p.add_argument("mountpoint", help="directory to mount on")
    p.add_argument(
        "--config",
        metavar="PATH",
        help="client TOML config (default: the fs3 local cluster's, from $FS3_LOCAL_DIR or "
        "~/.local/share/fs3/local, where there is one and $FS3_MGMTD_ADDRESSES is unset, as the "
        "native client and fs3 admin take it; else built-in defaults)",
    )
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        help="extra FUSE mount options, comma separated; may be given more than once",
    )
    p.add_argument(
        "--log-level",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        type=str.upper,
        help="override log.level",
    )
    return p


def memory_trimmer(interval_s: float, activity: Callable[[], int]) -> Periodic | None:
    """Started: glibc's ``malloc_trim(0)`` on a thread once the mount has been idle for
    ``interval_s`` after serving I/O (``activity``, a count of bytes read and written, did not move
    for one interval but did since the last trim). A burst of random writes leaves the heap holding
    the gathered buffers it freed (~340 MB after 4 files of 4 KiB random writes), which glibc keeps
    mapped; the trim gives them back (to ~70 MB). Only when idle: it holds each arena's lock while
    it walks it (tens of ms on a big heap), which the event loop's allocations would wait for. None
    where there is no glibc or ``interval_s`` is 0."""
    if not interval_s:
        return None
    malloc_trim = glibc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    if malloc_trim is None:
        return None
    last = trimmed_at = activity()

    async def step() -> None:
        nonlocal last, trimmed_at
        now = activity()
        busy, last = now != last, now
        if busy or now == trimmed_at:
            return  # serving I/O, or nothing served since the last trim
        trimmed_at = now
        await asyncio.to_thread(malloc_trim, 0)

    trimmer = Periodic("fs3-mount-trim", step, interval_s)
    trimmer.start()
    return trimmer


def tune_mount(mountpoint: str, read_ahead_kb: int) -> None:
    """Set the mount's readahead and the FUSE connection's max_background and congestion
    threshold (best effort; fusectl is mounted first where nothing has mounted it)."""
    dev = mount_device(mountpoint)
    if dev is None:
        log.warning("mount not found in mountinfo mountpoint=%s", mountpoint)
        return
    settings: list[tuple[str, int]] = []
    conns, why = fuse_connections()
    if conns is None:
        log.warning(
            "cannot raise max_background: %s; the kernel keeps 12 background requests in flight "
            "(readahead, async direct I/O), about half the random read rate",
            why,
        )
    else:
        settings += [
            (f"{conns}/{dev[1]}/max_background", MAX_BACKGROUND),
            (f"{conns}/{dev[1]}/congestion_threshold", CONGESTION_THRESHOLD),
        ]
    if read_ahead_kb:
        settings.append((f"/sys/class/bdi/{dev[0]}:{dev[1]}/read_ahead_kb", read_ahead_kb))
    for path, value in settings:
        try:
            Path(path).write_text(f"{value}\n")
        except OSError as e:
            log.warning("cannot set %s=%s error=%s", path, value, e.strerror)


async def check_member_token(fs: FileSystem, token: str, *, serves_others: bool) -> None:
    """Refuse to mount when meta would refuse the mount's requests. A mount that holds the cluster
    secret sends each caller's own uid with the mount's token; a meta that authenticates acts on a
    non-root token only for its own uid, and on no request without one: such a mount came up, then
    failed every request (EACCES for all, root's and the token user's own included, as the
    mount's own getattr of / runs as uid 0) and logged nothing. So a stat of the root directory is
    asked first, as the mount will ask for its users: as root when it serves every local user
    (allow_other, as root mounts do), else as the uid running it; a meta that does not
    authenticate takes any token, and the mount starts."""
    from fs3.client.meta_client import ROOT_ID
    from fs3.proto import common_pb2

    uid, gid = (0, 0) if serves_others else (os.getuid(), os.getgid())
    try:
        await fs.meta.acting_as(common_pb2.UserInfo(uid=uid, gid=gid, token=token)).stat(ROOT_ID)
        return
    except FS3Error as e:
        if e.code != StatusCode.UNAUTHENTICATED:
            raise  # meta unreachable, say: the mount would not work, but its token is not why
        refusal = e.message
    if not token:
        raise FS3Error(
            StatusCode.CONFIG_INVALID,
            "meta refuses requests without a user token (it authenticates them): set token_file to "
            "a file holding a root token ('fs3 admin user-add UID NAME --root --token-out FILE')",
        )
    try:
        user = await fs.mgmtd.verify_token(token)
    except FS3Error as e:
        if e.retryable:
            raise  # mgmtd unreachable: not the token's fault (exit 1, started again)
        raise FS3Error(
            StatusCode.CONFIG_INVALID, f"the token in token_file is refused: {e.message}"
        ) from None
    who = f"uid {user.uid} ({user.name})"
    if serves_others:
        why = (
            f"the token in token_file acts only for {who}, but this mount serves every local user "
            "(allow_other): meta refuses every other uid"
        )
    else:
        why = f"the token in token_file acts only for {who}, not for uid {uid}, which runs this mount"
    raise FS3Error(
        StatusCode.CONFIG_INVALID,
        f"{why} ({refusal}). Give the mount a root token ('fs3 admin user-add UID NAME --root "
        "--token-out FILE'), or set user_auth = true for a mount of that user's own",
    )


async def serve(
    cfg: ClientConfig,
    mountpoint: str,
    options: list[str],
    ready: Callable[[], None],
    mounted: Callable[[], None] = lambda: None,
) -> int:
    """Mount and serve until unmounted or signalled; returns the exit status. ``mounted`` is
    called once the mount is in the mount table, ``ready`` once it has answered a request (the
    kernel took the INIT reply: libfuse can still refuse the session after the mount)."""
    import pyfuse3
    import pyfuse3.asyncio

    from fs3.client import fuse_wait
    from fs3.client.filesystem import FileSystem, read_token
    from fs3.client.fuse_ops import Fs3Operations
    from fs3.daemon import settle_gc, stack_dump_on_signal

    stack_dump_on_signal()  # first: a mount that hangs while it connects can be asked too
    if any(o.startswith("subtype=") for o in options):
        # fs3 umount and the replacement of a dead mount know an fs3 mount by it
        raise FS3Error(StatusCode.CONFIG_INVALID, "-o subtype: the subtype of an fs3 mount is fs3")
    pyfuse3.asyncio.enable()
    logging.getLogger("pyfuse3").addFilter(_AbandonedReplies())
    if os.environ.get("FS3_FUSE_WAIT", "fs3") != "pyfuse3":
        fuse_wait.install()  # one reader on the FUSE device for all requests
    metrics_server = None
    if cfg.metrics_port:
        from fs3.metrics import serve as serve_metrics

        metrics_server = serve_metrics(cfg.metrics_port, cfg.metrics_host)
    # In order, the user's last, as mount(8) takes them: libfuse reads them one after another and
    # the last of two that disagree wins ("-o ro" over the default rw). A set's order changed with
    # every process: "-o rw,ro" mounted rw or ro at random.
    opts = [*sorted(pyfuse3.default_options), "fsname=fs3", "subtype=fs3", "noatime"]
    if os.getuid() == 0:
        opts.append("allow_other")  # the mount serves every local user; permissions are checked
    opts += [o for o in options if o]
    fs = await FileSystem.connect(cfg, timeout_s=cfg.rpc_timeout_s)
    try:
        token = read_token(cfg.token_file)
        if not cfg.user_auth:
            await check_member_token(fs, token, serves_others="allow_other" in opts)
        file_cfg = copy.deepcopy(cfg)
        fs.on_pushed_config(lambda info: apply_pushed_config("client", cfg, file_cfg, info, hot_log_level()))
        ops = Fs3Operations(fs, cfg, token, on_init=lambda: tune_mount(mountpoint, cfg.read_ahead_kb))
        fs.on_token_changed(ops.use_token)
        try:
            pyfuse3.init(ops, mountpoint, opts)
        except RuntimeError as e:
            if "fuse_session_new" in str(e):
                # libfuse said which on standard error ("fuse: unknown option(s)"): an option to
                # mend, exit 2 like a bad config (the unit does not start it again)
                raise FS3Error(
                    StatusCode.CONFIG_INVALID,
                    f"libfuse refused the mount options ({', '.join(o for o in options if o)}): {e}",
                ) from None
            if "fuse_session_mount" in str(e):
                # the kernel or fusermount3 refused it, and said why on standard error: an option
                # the kernel takes not (-o blksize=), allow_other for a user without
                # user_allow_other in /etc/fuse.conf; exit 2 too, the unit starting it again every
                # 5 s would fail the same way
                raise FS3Error(
                    StatusCode.CONFIG_INVALID,
                    f"the mount was refused (fusermount3's or the kernel's reason is on the line "
                    f"above; options {','.join(opts)}): {e}",
                ) from None
            raise
    except BaseException:
        await fs.close()
        raise
    device = mount_device(mountpoint)  # this mount's: told apart from one mounted there later
    mounted()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def stop() -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("unmount requested by signal")
            pyfuse3.terminate()

    for sig in STOP_SIGNALS:  # SIGHUP too: a closed terminal unmounts cleanly, not a dead mount
        loop.add_signal_handler(sig, stop)
    fd = fuse_device_fd()
    ending = loop.create_task(end_reads_when_over(fd, stopping, ops))
    log.info("mounted mountpoint=%s loop=%s options=%s", mountpoint, type(loop).__module__, ",".join(opts))
    settle_gc()
    trim = memory_trimmer(
        cfg.memory_trim_interval_s, lambda: ops.metrics.read_bytes + ops.metrics.write_bytes
    )
    served = loop.create_task(answers_itself(mountpoint, device))
    served.add_done_callback(lambda t: ready() if not t.cancelled() and t.result() else None)
    status = 0
    try:
        await pyfuse3.main(min_tasks=MIN_IDLE_WORKERS, max_tasks=MAX_WORKERS)
    except Exception:
        log.exception("FUSE main loop failed")
        status = 1
    finally:
        # at once, not after the flush below: once our mount is gone its device number may be
        # another's (the kernel gives the lowest free one)
        if fd is not None and device is not None and connection_aborted(fd):
            if mount_device(mountpoint) == device:
                await asyncio.to_thread(unmount_dead, mountpoint, device)
        try:
            await cancel_and_wait(ending)
        except Exception:
            log.exception("ending the reads in flight failed")
        log.info("FUSE session over, closing what is still open open_files=%d", ops.open_files())
        try:
            await ops.close_all()
        except Exception:
            log.exception("flushing open files at unmount failed")
            status = 1
        fuse_wait.uninstall()  # before pyfuse3 closes the device it watches
        # libfuse unmounts by path, which takes whatever is mounted on top: never another's mount
        covered = device is not None and is_mounted(mountpoint) and mount_device(mountpoint) != device
        if covered:
            log.warning(
                "another file system is mounted over this one at %s: left mounted; this mount stays "
                "under it, dead, until that one is unmounted and then this one (fs3 umount)",
                mountpoint,
            )
        pyfuse3.close(unmount=not covered)
        # within systemd's TimeoutStopSec (60 s) with close_all's wait before it
        await fs.close(give_up_s=UNMOUNT_GIVE_UP_S)
        lost = ops.failed_at_unmount + fs.lost_closes
        if lost:
            # not written out (the cluster out of reach): the writers had no error from close or
            # fsync, which they never made, but the stop was not a clean one
            log.error(
                "files open for writing at unmount could not be written out and closed: what they "
                "had buffered may be lost (meta settles their lengths from storage once this "
                "client's session expires) count=%d",
                lost,
            )
            status = 1
        if metrics_server is not None:
            metrics_server.close()
        if trim is not None:
            await trim.stop()  # last: a cancellation raised here must not skip the unmount
    if not served.done() or served.cancelled() or not served.result():
        served.cancel()
        if not stopping.is_set():
            raise RuntimeError(
                "the FUSE session ended before it served a request: the kernel or libfuse refused "
                "it (see libfuse's line above, or the log)"
            )
    log.info("unmounted mountpoint=%s", mountpoint)
    return status


async def answers_itself(mountpoint: str, device: tuple[int, int] | None) -> bool:
    """Whether the mount at ``mountpoint`` serves: a stat of it (from a thread: this process
    answers it) is answered by this mount, successfully or with an error it gave. False when the
    FUSE connection failed (libfuse refused the kernel's INIT: a mount option it rejects) or
    another mount answered."""
    try:
        st = await asyncio.to_thread(os.stat, mountpoint)
    except OSError as e:
        return e.errno not in (errno.ENOTCONN, errno.ECONNREFUSED, errno.ENODEV)
    return device is None or (os.major(st.st_dev), os.minor(st.st_dev)) == device


def unmount_dead(mountpoint: str, device: tuple[int, int]) -> None:
    """Unmount this process's mount whose connection was aborted (fusectl, ``fs3 umount --force``):
    libfuse takes the aborted connection for an unmount already done and leaves the mount, dead
    (every use fails with ENOTCONN) until someone unmounts it. Lazily where busy (a shell's working
    directory in it): its users get errors either way. Only while what is mounted there with that
    device is dead: a mount that answers is a new one that got the device number ours freed (after
    an unmount by ``fs3 umount --force``, say)."""
    if not dead(mountpoint):
        return
    error = unmount(mountpoint, device)
    if mount_device(mountpoint) == device:
        log.warning("the dead mount could not be unmounted mountpoint=%s error=%s", mountpoint, error)
    else:
        log.info("unmounted the mount whose connection was aborted mountpoint=%s", mountpoint)


def _run(
    cfg: ClientConfig,
    mountpoint: str,
    options: list[str],
    ready: Callable[[], None],
    mounted: Callable[[], None],
) -> int:
    if os.environ.get("FS3_FUSE_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop

            return uvloop.run(serve(cfg, mountpoint, options, ready, mounted))
        except ImportError:
            pass
    return asyncio.run(serve(cfg, mountpoint, options, ready, mounted))


def _lock_dir() -> str:
    """Where mount locks live: /run/fs3 for root, else the user's runtime directory (or a private
    directory in the temporary directory)."""
    if os.geteuid() == 0:
        return "/run/fs3"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "fs3")
    return os.path.join(tempfile.gettempdir(), f"fs3-{os.geteuid()}")


def _mount_lock(mountpoint: str) -> int | None:
    """Wait for, take and return the lock of mounts on ``mountpoint`` (an exclusive flock of a
    file named by the path's hash): held from the check of the mount table until this process's
    mount is in it (a fork inherits it). None, with a warning, where no lock file can be made."""
    directory = _lock_dir()
    name = hashlib.sha256(os.fsencode(mountpoint)).hexdigest()[:32]
    path = os.path.join(directory, f"mount-{name}.lock")
    while True:
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise OSError(errno.EPERM, "not a directory of this user")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            sys.stderr.write(
                f"fs3 mount: warning: no mount lock in {directory} ({e.strerror}): another mount "
                "started on this directory at the same moment would not be refused\n"
            )
            return None
        fcntl.flock(fd, fcntl.LOCK_EX)
        # The holder before us removes the file as it lets go (else one file per mount point
        # ever used piles up): the lock is ours only if the file is still the one at the path.
        held = os.fstat(fd)
        try:
            there = os.lstat(path)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino):
            _lock_paths[fd] = path
            return fd
        os.close(fd)


_lock_paths: dict[int, str] = {}  # a held mount lock's file, removed as it is let go


def _unlock(fd: int | None) -> None:
    """Let go of a lock of :func:`_mount_lock` (again: nothing)."""
    if fd is None or (path := _lock_paths.pop(fd, None)) is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)  # while still held: whoever waits for it sees it gone, and makes another
    with contextlib.suppress(OSError):
        os.close(fd)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # one the enum does not name (a realtime signal)
        return f"signal {number}"


def _detach(log_file: str) -> tuple[Callable[[], None], Callable[[int], None]]:
    """Fork. The parent waits for the child's word and exits with it: 0 once the mount is up, the
    child's status (1, or 2 for a config or option to mend) once it has printed why it failed (on
    the standard error they share until then), and when the child ends without a word (killed, or
    a traceback), its status with a line that says where to look. The child goes on, with its two
    words: ``(ready, failed(status))``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        # Ctrl-C (or SIGTERM, SIGHUP) while the mount comes up: the mount process has a session
        # of its own and hears nothing of it, so this command exited 130 and the mount came up
        # anyway. It is told to stop with SIGTERM whatever came here (it ends a mount process at
        # once wherever its start is, and unmounts one that got that far; a SIGINT's
        # KeyboardInterrupt could land where a clean-up waits on the unanswering mgmtd, and is
        # ignored in what a shell starts in the background), and this command ends once the mount
        # process has, with the signal's status.
        caught: list[int] = []

        def pass_on(signum: int, _frame: object) -> None:
            caught.append(signum)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

        for sig in STOP_SIGNALS:
            signal.signal(sig, pass_on)
        with os.fdopen(r, "rb") as pipe:
            word = pipe.read(1)
        if caught:
            os.waitpid(pid, 0)
            sys.stderr.write(f"fs3 mount: stopped by {_signal_name(caught[0])}\n")
            os._exit(128 + caught[0])
        if word == b"1":
            os._exit(0)
        if word == b"0":
            os._exit(1)  # the reason is printed already
        if word == b"2":
            os._exit(2)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])  # the pipe closed: it has ended
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        where = f" (see the log: {log_file})" if log_file else ""
        sys.stderr.write(f"fs3 mount: the mount did not come up: its process {how}{where}\n")
        os._exit(code if code > 0 else 1)
    os.close(r)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)

    told = False

    def tell(word: bytes) -> None:
        nonlocal told
        if told:  # a failure after the mount came up: the parent has exited already
            return
        told = True
        sys.stderr.flush()
        os.write(w, word)
        os.close(w)
        os.dup2(devnull, 2)  # stderr stays open until the parent has its word, for its sake

    return lambda: tell(b"1"), lambda code: tell(b"2" if code == 2 else b"0")


def _replace_dead_mount(path: str) -> bool:
    """Unmount a dead fs3 mount at ``path`` (nobody serves it: its mount process was killed, or ran
    out of memory, or its connection was aborted), so that a new mount (systemd's restart of the
    mount service, for one) can take its place; True if it did. A mount of another file system,
    or one whose server is alive (answering or stuck), is left alone: refused by the caller. It
    goes lazily where busy (a shell's working directory in it): the dead mount's users get errors
    either way, the new one's see the new mount."""
    device = mount_device(path)
    if mount_type(path) != FS3_MOUNT_TYPE or not dead(path):
        return False
    error = unmount(path, device)
    if mount_device(path) == device:
        sys.stderr.write(
            f"fs3 mount: the dead fs3 mount at {path} could not be unmounted: {error or 'no reason given'}\n"
        )
        return False
    if mounted_over(path, fuse_only=True):
        return False
    sys.stderr.write(
        f"fs3 mount: warning: unmounted the dead fs3 mount at {path} (nobody served it any more: its "
        "mount process was killed or its connection aborted) to mount there again\n"
    )
    return True


# Options asking the kernel to move atime on reads: fs3 mounts noatime (a read would be a metadata
# commit), and libfuse took "-o atime" (the mount table then said relatime) while reads moved
# nothing; it refuses the other two as unknown options.
_ATIME_OPTIONS = frozenset({"atime", "strictatime", "relatime"})


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 mount``; returns the exit status."""
    ensure_std_fds()
    args = _parser().parse_args(argv)
    options = [o.strip() for group in args.options for o in group.split(",") if o.strip()]
    if any(o.split("=", 1)[0] == "max_read" for o in options):
        sys.stderr.write(
            "fs3 mount: -o max_read is not supported: libfuse refuses the session with it under "
            "pyfuse3 ('init() and fuse_session_new() requested different maximum read size'); "
            "reads reach 1 MiB per request without it\n"
        )
        return 2
    if timed := [o for o in options if o in _ATIME_OPTIONS]:
        sys.stderr.write(
            f"fs3 mount: -o {timed[0]} is not supported: fs3 keeps no access times (the mount is "
            "noatime: reads never move atime; touch -a and utime set it)\n"
        )
        return 2
    where = os.path.abspath(args.mountpoint)
    # another fs3 mount starting on this directory now would pass the check below too, and the two
    # would stack: the check and the mount are done under a lock per directory
    lock = _mount_lock(resolved(where))
    try:
        return _mount_locked(args, options, where, lock)
    finally:
        _unlock(lock)  # at the latest (the mount lets go of it once it is in the mount table)


def _mount_locked(args: argparse.Namespace, options: list[str], where: str, lock: int | None) -> int:
    """:func:`main` once it holds the lock of mounts on ``where``."""
    # a FUSE mount there already (a dead or hung fs3 mount, most likely), from the mount table,
    # before anything starts: a stat of a dead FUSE mount fails (ENOTCONN, "not a directory"
    # below) and one of a hung mount never returns
    for path in dict.fromkeys((where, resolved(where))):
        if taken := mounted_over(path, fuse_only=True):
            if not _replace_dead_mount(path):
                sys.stderr.write(f"fs3 mount: {taken}; unmount it first or pick another directory\n")
                return 1
    from fs3.client.filesystem import local_cluster_config

    try:
        cfg = load_config(ClientConfig, args.config or local_cluster_config())
    except FS3Error as e:
        sys.stderr.write(f"fs3 mount: {e.message}\n")
        return 2
    if (loop := os.environ.get("FS3_FUSE_LOOP", "uvloop")) not in ("uvloop", "asyncio"):
        sys.stderr.write(f"fs3 mount: FS3_FUSE_LOOP is uvloop (the default) or asyncio, not {loop!r}\n")
        return 2
    if args.log_level:
        cfg.log.level = args.log_level
    if not os.path.lexists(args.mountpoint):
        sys.stderr.write(f"fs3 mount: {args.mountpoint} does not exist (create it first: mkdir -p)\n")
        return 2
    if not os.path.isdir(args.mountpoint):
        sys.stderr.write(f"fs3 mount: {args.mountpoint} is not a directory\n")
        return 2
    from fs3.log import setup_logging

    try:
        setup_logging(cfg.log, "fuse")
    except OSError as e:
        sys.stderr.write(f"fs3 mount: cannot open log file {cfg.log.file}: {e.strerror}\n")
        return 2
    log_env_overrides(ClientConfig)
    with contextlib.suppress(OSError):
        if os.listdir(args.mountpoint):
            sys.stderr.write(
                f"fs3 mount: warning: {args.mountpoint} is not empty; what it holds is hidden while "
                "fs3 is mounted over it\n"
            )
    ready: Callable[[], None] = lambda: None  # noqa: E731
    failed: Callable[[int], None] = lambda code: None  # noqa: E731
    if not args.foreground:
        if not cfg.log.file:
            sys.stderr.write(
                "fs3 mount: note: no log.file in the config, so the mount's log is discarded once it "
                "runs in the background (set log.file, or run it with --foreground)\n"
            )
        ready, failed = _detach(cfg.log.file)
    try:
        return _run(cfg, os.path.realpath(args.mountpoint), options, ready, lambda: _unlock(lock))
    except (FS3Error, RuntimeError) as e:
        reason = e.message if isinstance(e, FS3Error) else str(e)
        if cfg.log.file:  # otherwise the log is standard error, where the line below goes anyway
            log.error("mount failed: %s", reason)
        sys.stderr.write(f"fs3 mount: {reason}\n")
        # 2, as for a config that does not load: one found wrong as the mount started (a refused
        # token, a secret file that is missing or not the cluster's), which the unit does not
        # start again for
        bad = (StatusCode.CONFIG_INVALID, StatusCode.UNAUTHENTICATED)
        code = 2 if isinstance(e, FS3Error) and e.code in bad else 1
        failed(code)
        return code
    except KeyboardInterrupt:
        return 130
