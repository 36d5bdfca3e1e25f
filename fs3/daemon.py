"""What every fs3 daemon process does the same way: its command line, start-up errors, shutdown.

``fs3 mgmtd``, ``fs3 meta`` and ``fs3 storage`` each describe their service with a ``serve(cfg,
port_file=...)`` coroutine and call :func:`run`, which parses the common options, loads and checks
the config, sets up logging, runs ``serve`` on uvloop, and turns a start-up failure into one line on
standard error and a non-zero exit: 2 for a bad config or command line, 1 for anything that stops
the service from starting (port in use, unreadable secret, store that cannot be opened).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import faulthandler
import gc
import logging
import os
import resource
import signal
import sys
import threading
import traceback
import types
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fs3.config import MAX_NODE_ID, get_dotted, load_config, overriding_variables, pushed_settings, set_dotted
from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import Database
from fs3.net.auth import read_secret
from fs3.proto import mgmtd_pb2

log = logging.getLogger(__name__)

__all__ = [
    "STOP_SIGNALS",
    "apply_overrides",
    "ensure_std_fds",
    "parser",
    "read_secret",
    "run",
    "settle_gc",
    "stack_dump_on_signal",
    "wait_for_shutdown",
    "write_port_file",
]

C = TypeVar("C")


def write_port_file(path: str, port: int) -> None:
    """Tell a launcher which port was bound (for ``listen_port = 0``)."""
    tmp = f"{path}.tmp"
    try:
        Path(tmp).write_text(f"{port}\n")
        os.replace(tmp, path)  # readers never see a half-written file
    except OSError as e:
        raise FS3Error(
            StatusCode.CONFIG_INVALID, f"cannot write --port-file {path}: {e.strerror or e}"
        ) from None


def port_file_problem(path: str) -> str | None:
    """Why ``--port-file path`` could not be written once the daemon serves (checked before it
    starts: a daemon that had registered and served died there, with a traceback), or None."""
    where = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(where):
        return f"--port-file {path}: {where} is not an existing directory"
    if os.path.isdir(path):
        return f"--port-file {path} is a directory"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"--port-file {path}: {where} is not writable"
    return None


def settle_gc() -> None:
    """Once a daemon has started: what it allocated so far lives as long as the process, and its
    hot paths allocate many small short-lived objects (messages, futures, coroutines) that reference
    counting frees. So the collector skips the former (``gc.freeze``) and runs its young generation
    every 50,000 allocations instead of every 700: a collection walks every young object, and at the
    default threshold a busy server spends a few per cent of its CPU there (a mount serving 4 KiB
    reads spent ~4% of its CPU in collections; with this, ~5% less CPU per read)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def _await_chain(coro: Any, depth: int = 100) -> list[str]:
    """Where a task is: ``file:line in function`` for each coroutine in its chain of awaits, outermost
    first (a task's own ``get_stack`` gives only the outermost, its frame's ``f_back`` is None); at
    the end, the type of what the innermost awaits (a future, an async generator step...)."""
    where: list[str] = []
    while coro is not None and len(where) < depth:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if isinstance(frame, types.FrameType):  # a compiled (Cython) coroutine's has no line
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        elif type(coro).__name__ == "coroutine_wrapper":
            # what a Python coroutine awaits of a compiled one: that coroutine is its referent
            inner = [o for o in gc.get_referents(coro) if hasattr(o, "cr_await")]
            if not inner:
                where.append(type(coro).__qualname__)
                break
            coro = inner[0]
            continue
        else:  # finished, or not a coroutine (a future, an async generator step...)
            where.append(type(coro).__qualname__)
            break
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return where


def log_stacks() -> None:
    """Log where every task of the running event loop and every thread is: what a daemon or a mount
    that does not answer, or does not exit, waits for. One line per task and per thread."""
    tasks = asyncio.all_tasks()
    frames = sys._current_frames()
    log.warning("stack dump (SIGUSR1) tasks=%d threads=%d", len(tasks), len(frames))
    for task in sorted(tasks, key=lambda t: t.get_name()):
        log.warning("task %s: %s", task.get_name(), " -> ".join(_await_chain(task.get_coro())))
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in frames.items():
        stack = [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack(frame)]
        log.warning("thread %s: %s", names.get(ident, ident), " -> ".join(stack))


def stack_dump_on_signal() -> None:
    """``kill -USR1 PID`` logs every task's and thread's stack (:func:`log_stacks`), from a handler
    of the running loop, so the dump runs between two callbacks, never inside one (and not at all
    while the loop is blocked). ``kill -USR2 PID`` writes every thread's Python stack to standard
    error at once, from the signal itself (:mod:`faulthandler`): for a loop that is blocked."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, log_stacks)
    faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)


#: signals that stop a daemon cleanly: SIGHUP too (a closed terminal, or a supervisor's
#: "reload", which fs3 has none of: a config change takes a restart, or ``fs3 admin config set``)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """A daemon's stop signals, from before it starts until it has stopped (:func:`run`): the
    first asks for the stop (and, before the daemon serves, cuts its start short: it stops and
    exits 0); any later one is logged and ignored, so that the stop under way (a storage daemon
    telling mgmtd its targets go, draining its disks) is not cut short by the default action of a
    second signal. SIGKILL ends a daemon at once."""

    def __init__(self, main: asyncio.Task[Any]) -> None:
        self.requested = asyncio.Event()
        self.serving = False  # wait_for_shutdown reached: the start is over
        self.by = ""
        self._main = main
        self._loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self._on, sig)

    def _on(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.requested.is_set():
            log.warning("%s while stopping: the stop goes on (SIGKILL ends the process at once)", name)
            return
        self.by = name
        self.requested.set()
        if not self.serving:
            log.info("shutdown requested by %s while starting", name)
            self._main.cancel()

    def remove(self) -> None:
        for sig in STOP_SIGNALS:
            self._loop.remove_signal_handler(sig)


_signals: StopSignals | None = None  # the running daemon's (see run)


async def wait_for_shutdown(db: Database | None = None, *, check_s: float = 1.0) -> int:
    """Return 0 once a stop signal arrives (:data:`STOP_SIGNALS`), or 1 once ``db`` can commit
    nothing any more (:meth:`fs3.kv.Database.failure`, e.g. after an fsync error): a daemon that
    could only answer errors exits, so that clients fail over to another and its supervisor
    restarts it (reopening the store recovers its last durable state). Under :func:`run` the
    signals are its :class:`StopSignals`; called alone, it handles them itself meanwhile."""
    shared = _signals
    if shared is not None:
        shared.serving = True
        stop = shared.requested
    else:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            failure = db.failure() if db is not None else None
            if failure is not None:
                log.critical("stopping: the kv store failed: %s", failure.message)
                return 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(check_s):
                    await stop.wait()
    finally:
        if shared is None:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
    log.info("shutdown requested" + (f" by {shared.by}" if shared is not None and shared.by else ""))
    return 0


#: how often a daemon counts its open files, and the share of its limit (RLIMIT_NOFILE) above which
#: it warns: out of descriptors, it refuses connections without a word (uvloop, like libuv, closes
#: each as it accepts it), and its targets' files cannot be opened
OPEN_FILES_CHECK_S = 30.0
OPEN_FILES_WARN = 0.9


def _open_files() -> int | None:
    """How many file descriptors this process holds; None when it cannot count them for want of
    one (the listing needs a descriptor itself)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # not the listing's own
    except OSError:
        return None


async def watch_open_files(check_s: float = OPEN_FILES_CHECK_S) -> None:
    """Warn while this process holds most of the file descriptors its limit allows (and once it
    no longer does); fs3_process_open_fds and fs3_process_max_fds say the same to Prometheus."""
    near = False
    while True:
        await asyncio.sleep(check_s)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        used = _open_files()
        if limit == resource.RLIM_INFINITY:
            continue
        over = used is None or used >= limit * OPEN_FILES_WARN
        if over and not near:
            log.warning(
                "open files near the limit: %s of %d (RLIMIT_NOFILE): new connections and files "
                "fail once none are left; raise LimitNOFILE (the units set 1048576) or ulimit -n",
                "all" if used is None else used,
                limit,
            )
        elif near and not over:
            log.info("open files below the limit again: %d of %d", used, limit)
        near = over


def ensure_std_fds() -> None:
    """Open /dev/null on standard input, output or error where the process was started without
    them (``>&-``, some supervisors): a descriptor the process opens later would take that number
    (the event loop's epoll did), its log lines would go to it, and uvloop aborts at exit when it
    closes a descriptor below 3 (every daemon exited by SIGABRT, or at once)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    # Python made no sys.stdout / sys.stderr for a descriptor closed at its start (None): writes
    # to them (an error line, a warning) would raise
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - for the process's life
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - for the process's life


def parser(
    service: str, description: str, *, listen_host: bool = True, kv: bool = True
) -> argparse.ArgumentParser:
    """The options every daemon takes (``listen_host`` and ``kv`` where its config has them)."""
    p = argparse.ArgumentParser(prog=f"fs3 {service}", description=description)
    p.add_argument("--config", metavar="PATH", help="TOML config file (default: built-in defaults)")
    p.add_argument("--node-id", type=int, help="override node_id")
    if listen_host:
        p.add_argument("--listen-host", help="override listen_host")
    p.add_argument("--port", type=int, help="override listen_port (0 = any free port)")
    if kv:
        p.add_argument("--kv-engine", choices=("lmdb", "fdb", "mem"), help="override kv.engine")
        p.add_argument("--kv-path", help="override kv.path")
    p.add_argument(
        "--log-level",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        type=str.upper,
        help="override log.level",
    )
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here once serving")
    return p


def apply_overrides(cfg: C, args: argparse.Namespace) -> C:
    """The config with the command line's overrides applied (options left out change nothing)."""
    top = {
        "node_id": args.node_id,
        "listen_host": getattr(args, "listen_host", None),
        "listen_port": args.port,
    }
    cfg = dataclasses.replace(cfg, **{k: v for k, v in top.items() if v is not None})  # type: ignore[type-var]
    kv = {"engine": getattr(args, "kv_engine", None), "path": getattr(args, "kv_path", None)}
    if any(v is not None for v in kv.values()):
        cfg.kv = dataclasses.replace(cfg.kv, **{k: v for k, v in kv.items() if v is not None})  # type: ignore[attr-defined]
    if args.log_level is not None:
        cfg.log = dataclasses.replace(cfg.log, level=args.log_level)  # type: ignore[attr-defined]
    if not 0 < cfg.node_id <= MAX_NODE_ID or not 0 <= cfg.listen_port <= 65535:  # type: ignore[attr-defined]
        raise FS3Error(
            StatusCode.CONFIG_INVALID, f"node id must be from 1 to {MAX_NODE_ID} and port 0..65535"
        )
    return cfg


def apply_pushed_config(
    service: str,
    cfg: Any,
    base: Any,
    info: mgmtd_pb2.ConfigInfo,
    hot: Mapping[str, Callable[[Any], None]],
) -> None:
    """Apply a config mgmtd pushed (``fs3 admin config set``) to the running ``cfg``: each setting
    ``hot`` can change while running (dotted key to setter) takes the value the push names, or
    ``base``'s (the config this process loaded from its file) where the push no longer names it,
    so that every node runs its file plus the newest push, whatever it heard before; the other
    settings the push names are logged as taking effect only from the node's file, at a restart.
    Never raises: a setting that cannot be applied is logged, and the others still are."""
    source = f"{service} config version {info.version} from mgmtd"
    try:
        named = pushed_settings(type(cfg), info.content, source)
    except FS3Error as e:
        log.error("%s not applied: %s", source, e.message)
        return
    applied = []
    for key, setter in hot.items():
        value = named[key] if key in named else get_dotted(base, key)
        if value == get_dotted(cfg, key):
            continue
        try:
            setter(value)
        except Exception:
            log.exception("%s: %s=%r could not be applied", source, key, value)
            continue
        set_dotted(cfg, key, value)
        applied.append(f"{key}={value!r}")
    later = [key for key, value in named.items() if key not in hot and value != get_dotted(base, key)]
    if applied:
        log.warning("%s applied: %s", source, ", ".join(applied))
    if later:
        log.warning(
            "%s: %s not applied: taken only from this node's config file, when it starts (a "
            "stored config cannot change it, at a restart either)",
            source,
            ", ".join(later),
        )
    if not applied and not later:
        log.info("%s changes nothing here", source)


def hot_log_level() -> dict[str, Callable[[Any], None]]:
    """The setting every process applies while running: its log level."""
    return {"log.level": lambda level: logging.getLogger().setLevel(level.upper())}


def log_env_overrides(config_class: type) -> None:
    """Say which settings the environment gave over the config file (the same ``FS3_*`` names
    serve ``fs3 admin``, so one exported for it would otherwise change a daemon silently)."""
    names = overriding_variables(config_class)
    if names:  # INFO: a unit's environment file sets some on purpose
        log.info("config from the environment, over the config file: %s", " ".join(names))


def run(
    service: str,
    config_class: type[C],
    argv: list[str],
    args_parser: argparse.ArgumentParser,
    serve: Callable[..., Awaitable[int]],
) -> int:
    """Run one daemon to completion and return its exit status (see the module docstring)."""
    ensure_std_fds()
    args = args_parser.parse_args(argv)
    try:
        cfg = apply_overrides(load_config(config_class, args.config), args)
    except FS3Error as e:
        sys.stderr.write(f"fs3 {service}: {e.message}\n")
        return 2
    if args.port_file and (problem := port_file_problem(args.port_file)):
        sys.stderr.write(f"fs3 {service}: {problem}\n")
        return 2
    from fs3.log import setup_logging

    log_cfg = cfg.log  # type: ignore[attr-defined]
    try:
        setup_logging(log_cfg, service)
    except OSError as e:
        sys.stderr.write(f"fs3 {service}: cannot open log file {log_cfg.file}: {e.strerror}\n")
        return 2
    log_env_overrides(config_class)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is a dependency; plain asyncio still works without it
        runner = asyncio.run

    async def serving() -> int:
        global _signals
        stack_dump_on_signal()
        main = asyncio.current_task()
        assert main is not None
        signals = _signals = StopSignals(main)
        watching = asyncio.get_running_loop().create_task(watch_open_files())
        try:
            return await serve(cfg, port_file=args.port_file)
        except asyncio.CancelledError:
            if not signals.requested.is_set() or signals.serving:
                raise
            main.uncancel()
            log.info("stopped before it served (%s)", signals.by)
            return 0
        finally:
            watching.cancel()
            signals.remove()
            _signals = None
            # The stop is not over: the loop, its executors and the log are still to be closed.
            # asyncio's removal put back SIGINT's KeyboardInterrupt and SIGTERM's default, so a
            # second stop signal in that window cut the stop short (exit 130, or killed): ignored
            # from then on, as a second one during the stop is (see below).
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)

    try:
        return runner(serving())
    except FS3Error as e:
        message = e.message
        if e.code == StatusCode.UNAUTHENTICATED:
            # daemons authenticate with the cluster secret alone: theirs is not the cluster's
            secret = getattr(cfg, "cluster_secret_file", "") or "none set: the built-in development secret"
            message += f" (cluster_secret_file: {secret}): give it the file mgmtd has"
        if log_cfg.file:  # otherwise the log is standard error, where the line goes anyway
            log.error("%s failed to start: %s", service, message)
        sys.stderr.write(f"fs3 {service}: {message}\n")
        # a config the daemon found wrong only once it ran (a store path, a target directory, a
        # secret): the units do not start it again for 2 (RestartPreventExitStatus), starting
        # cannot help
        return 2 if e.code in (StatusCode.CONFIG_INVALID, StatusCode.UNAUTHENTICATED) else 1
    except KeyboardInterrupt:
        return 130
    # The stop signals stay ignored: the stop is over, and a second Ctrl-C that came once their
    # handlers were put back ended the process by SIGINT (KeyboardInterrupt on the way to exit)
    # instead of with this status. Each daemon process runs this once, then exits.
