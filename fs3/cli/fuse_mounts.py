"""FUSE mount points seen from outside: is something mounted, does it answer, abort, unmount; and
fusectl, the kernel's per-connection controls (``/sys/fs/fuse/connections``).

Mounted-ness comes from ``/proc/self/mountinfo`` and never from a stat of the mount point: a FUSE
server that does not answer would hang the caller, which is exactly the situation these helpers
exist to get out of.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

FUSECTL = "/sys/fs/fuse/connections"
FS3_MOUNT_TYPE = "fuse.fs3"  # what /proc/self/mountinfo calls an fs3 mount
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """A mountinfo path field as the path it names: the kernel writes space, tab, newline and
    backslash as octal escapes (``\\040``, ``\\011``, ``\\012``, ``\\134``)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mountinfo_entry(path: str) -> tuple[int, int, str, int | None] | None:
    """(major, minor, file system type, ``user_id``) of what is mounted at ``path``, from
    /proc/self/mountinfo; None if nothing (the topmost mount when several are stacked). ``user_id``
    is the uid a FUSE mount was made by (its super option), None for other file systems.

    Read from the mount table rather than by ``os.path.ismount``, which stats the mount point and
    would hang on a FUSE server that does not answer."""
    target = os.path.normpath(os.path.abspath(path))
    found = None
    try:
        # a path not in UTF-8 reads as the str os.fsdecode makes of it (the same escapes)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 4 and _unescape(parts[4]) == target:
                    major, minor = parts[2].split(":")
                    # optional fields end at " - ", then: fs type, source, super options
                    sep = parts.index("-") if "-" in parts else len(parts)
                    fstype = parts[sep + 1] if sep + 1 < len(parts) else ""
                    supers = parts[sep + 3].split(",") if sep + 3 < len(parts) else []
                    owner = next(
                        (int(o[8:]) for o in supers if o[8:].isdigit() and o.startswith("user_id=")), None
                    )
                    found = (int(major), int(minor), fstype, owner)
    except OSError:
        return None
    return found


def mount_type(path: str) -> str | None:
    """The file system type mounted at ``path`` (``fuse.fs3`` for an fs3 mount), or None."""
    entry = _mountinfo_entry(path)
    return entry[2] if entry is not None else None


def mount_device(path: str) -> tuple[int, int] | None:
    """(major, minor) of the file system mounted at ``path``, or None; for a FUSE mount the minor
    names its connection under :data:`FUSECTL`."""
    entry = _mountinfo_entry(path)
    return entry[:2] if entry is not None else None


def mount_owner(path: str) -> int | None:
    """The uid that made the FUSE mount at ``path`` (only it and root may unmount it), or None."""
    entry = _mountinfo_entry(path)
    return entry[3] if entry is not None else None


def fuse_connections() -> tuple[Path | None, str]:
    """fusectl's directory, ``(Path(FUSECTL), "")``, mounting fusectl there first if nothing has;
    ``(None, why)`` where that cannot be done.

    systemd mounts fusectl at boot (sys-fs-fuse-connections.mount), but containers, minimal
    systems and CI machines often have the directory with nothing mounted on it; without fusectl a
    FUSE connection keeps the kernel's default of 12 background requests (readahead, async direct
    I/O) and a stuck connection cannot be aborted. Mounting it changes no FUSE mount."""
    if mount_type(FUSECTL) == "fusectl":
        return Path(FUSECTL), ""
    if not os.path.isdir(FUSECTL):
        return None, f"{FUSECTL} does not exist (is the fuse kernel module loaded?)"
    if os.geteuid() != 0:
        return None, f"fusectl is not mounted at {FUSECTL}; as root: mount -t fusectl fusectl {FUSECTL}"
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc: no find_library subprocess
    if libc.mount(b"fusectl", FUSECTL.encode(), b"fusectl", 0, None) != 0:
        err = ctypes.get_errno()
        if mount_type(FUSECTL) != "fusectl":  # EBUSY: another process mounted it meanwhile
            return None, f"cannot mount fusectl at {FUSECTL}: {os.strerror(err)}"
    return Path(FUSECTL), ""


def resolved(path: str, _hops: int = 40) -> str:
    """``path`` made absolute with its symlinks resolved, without a stat of ``path`` itself, nor
    of what a symlink there names: a stat of a stuck FUSE mount point never returns, and one of a
    mount whose meta is down waits out its timeout (a readlink of a directory does not reach its
    server)."""
    # absolute, with any '..' left for realpath, which takes it after the symlink before it, as
    # the kernel does (abspath dropped 'link/..' as text)
    full = os.path.join(os.getcwd(), path).rstrip("/") or "/"
    while os.path.basename(full) == "." and full != "/":
        full = os.path.dirname(full).rstrip("/") or "/"
    parent, name = os.path.split(full)
    if name in ("", ".."):  # the root, or a parent of something: not a mount point to spare
        return os.path.realpath(full)
    where = os.path.join(os.path.realpath(parent), name)
    try:
        target = os.readlink(where)
    except OSError:  # not a symlink (EINVAL), or gone
        return where
    if _hops == 0:  # a loop: as realpath leaves it
        return os.path.realpath(where)
    return resolved(os.path.join(os.path.dirname(where), target), _hops - 1)


def is_mounted(path: str) -> bool:
    return bool(path) and _mountinfo_entry(path) is not None


def mounted_over(path: str, *, fuse_only: bool = False) -> str | None:
    """Why ``path`` cannot take a new mount, or None: something is mounted there already (a new
    mount would be stacked on it, hiding it until unmounted); with ``fuse_only``, a FUSE file
    system only (a bind or volume mount point, as containers give, takes a FUSE mount on top by
    design). Read from the mount table, so a dead or hung FUSE mount there is found without
    touching it."""
    fstype = mount_type(path) if path else None
    if fstype is None or fuse_only and not fstype.startswith("fuse"):
        return None
    return f"{path} is already a mount point ({fstype or 'unknown type'})"


# exits with the errno of a stat and a statfs of argv[1] (0 if both succeed); the statfs is a request
# to the server whatever the kernel has cached, and needs no permission on the directory itself
# (an open of it did: a root directory of mode 0311 was "not answering" to other users)
_STAT_ERRNO = (
    "import os, sys\ntry:\n os.stat(sys.argv[1])\n os.statvfs(sys.argv[1])\n"
    "except OSError as e:\n sys.exit(e.errno or 1)"
)


def answers(path: str, timeout_s: float) -> bool:
    """Whether a stat and a statfs of ``path`` succeed within ``timeout_s``: the statfs reaches a
    FUSE server whatever the kernel has cached (a stat alone was answered from the cache for up
    to attr_timeout_s after the server died). Done by a child process, so that a
    server that never answers leaves a stuck child behind rather than a stuck ``fs3 local``."""
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", _STAT_ERRNO, path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        return child.wait(timeout_s) == 0
    except subprocess.TimeoutExpired:
        child.kill()
        return False


def dead(path: str, timeout_s: float = 5.0) -> bool:
    """Whether the FUSE mount at ``path`` has nobody serving it: a stat or a statfs of it fails
    with ENOTCONN, twice, as after its server died (killed, out of memory) or its connection was
    aborted. A mount that answers, or does not answer within ``timeout_s`` (a server alive but
    stuck), is not dead; nor is one whose server, stopping, ended the probe's request with ENOTCONN
    (an fs3 mount does so to requests in flight at its exit, not to later ones). Asked by child
    processes, as :func:`answers` does."""
    for _ in range(2):
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", _STAT_ERRNO, path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if child.wait(timeout_s) != errno.ENOTCONN:
                return False
        except subprocess.TimeoutExpired:
            child.kill()  # (a child stuck where a kill does not reach is left behind)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(1.0)
            return False
    return True


def abort(path: str) -> None:
    """Abort the FUSE connection mounted at ``path`` (a server stuck in the kernel cannot be
    killed otherwise); needs fusectl (:func:`fuse_connections`), else does nothing."""
    dev = _mountinfo_entry(path)
    if dev is None:
        return
    conns, _ = fuse_connections()
    if conns is None:
        return
    try:
        (conns / str(dev[1]) / "abort").write_text("1\n")
    except OSError:
        pass


def unmount(mount: str, device: tuple[int, int] | None = None, lazy: bool = True) -> str:
    """Unmount ``mount`` if it is still mounted: normally, else (``lazy``) lazily (detached now,
    finished by the kernel when the last user leaves), so that the daemons behind it can stop.
    With ``device`` (:func:`mount_device`), only while that file system is the one mounted there:
    not another one mounted meanwhile. Returns the last command's error output ("" if none)."""
    error = "neither fusermount3 nor umount is installed"
    cmds = [["fusermount3", "-u", mount], ["umount", mount]]
    if lazy:
        cmds.append(["fusermount3", "-u", "-z", mount])
    for cmd in cmds:
        if not is_mounted(mount) or device is not None and mount_device(mount) != device:
            return ""
        if shutil.which(cmd[0]):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                error = f"{' '.join(cmd)} timed out"
                continue
            error = r.stderr.strip() if r.returncode else ""
    return error
