"""``fs3 umount MOUNTPOINT [--force]``: unmount an fs3 mount, or get rid of one that is stuck.

Without ``--force`` it unmounts as ``fusermount3 -u`` (or ``umount`` as root) does: the mount
process then flushes what its open files buffered and exits; a mount some process still uses
(a file open there, a working directory) is refused as busy. With ``--force`` it first aborts
the mount's FUSE connection through fusectl (``/sys/fs/fuse/connections/N/abort``), which ends
every request waiting on it (a mount process stuck, or stopped, does not answer), and then
unmounts, lazily where busy: the way out of a mount that hangs every command touching it. What a
stuck mount had buffered and not written is lost, as with any forced unmount.

Whether something is mounted, and what, is read from the mount table, never by a stat of the
mount point (which never returns on a stuck mount). Only fs3 mounts (``fuse.fs3``) are touched,
and only by root or the user who mounted them (another user is told whose mount it is).
Exit status: 0 unmounted, 1 not unmounted (the reason on standard error), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys

from fs3.cli.fuse_mounts import (
    FS3_MOUNT_TYPE,
    abort,
    fuse_connections,
    is_mounted,
    mount_device,
    mount_owner,
    mount_type,
    resolved,
    unmount,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fs3 umount",
        description="Unmount an fs3 mount; with --force, abort its FUSE connection first (a stuck mount).",
    )
    p.add_argument("mountpoint", help="where the fs3 file system is mounted")
    p.add_argument(
        "--force",
        action="store_true",
        help="abort the mount's FUSE connection first (fusectl), then unmount lazily if busy: "
        "for a mount that does not answer; what it buffered is lost",
    )
    return p


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid with no account here."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    where = resolved(args.mountpoint)
    fstype = mount_type(where)
    if fstype is None:
        what = "is not a mount point" if os.path.lexists(where) else "does not exist"
        sys.stderr.write(f"fs3 umount: {where} {what}\n")
        return 1
    if fstype != FS3_MOUNT_TYPE:
        sys.stderr.write(f"fs3 umount: {where} is not an fs3 mount ({fstype}); not touched\n")
        return 1
    owner = mount_owner(where)
    if owner is not None and os.geteuid() not in (0, owner):
        # fusermount3 would refuse it too, with "entry ... not found in /etc/mtab"
        sys.stderr.write(
            f"fs3 umount: {where} was mounted by {user_name(owner)}; only that user or root can unmount it\n"
        )
        return 1
    device = mount_device(where)
    if args.force:
        conns, why = fuse_connections()
        if conns is None:
            sys.stderr.write(f"fs3 umount: cannot abort the FUSE connection: {why}\n")
            return 1
        abort(where)
        error = unmount(where, device)
    else:
        error = unmount(where, device, lazy=False)  # a busy mount is reported, not detached
    if is_mounted(where) and mount_device(where) == device:
        hint = "" if args.force else "; close what uses it, or use --force for a mount that does not answer"
        sys.stderr.write(f"fs3 umount: {where} is still mounted: {error or 'no reason given'}{hint}\n")
        return 1
    return 0
