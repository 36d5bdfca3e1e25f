"""Who a request acts as, and the POSIX checks every operation makes (owner/group/other with
supplementary groups, the sticky bit, root), plus name validation.

The rules are Linux's ``generic_permission``: root may read and write anything and search any
directory, but executes a file only when some execute bit is set; everyone else is checked against
the owner bits if they own the inode, else the group bits if the inode's group is among theirs, else
the other bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fs3.errors import FS3Error, StatusCode, quote_name
from fs3.proto import meta_pb2

R_OK, W_OK, X_OK = 4, 2, 1
S_ISUID, S_ISGID, S_ISVTX = 0o4000, 0o2000, 0o1000
S_IXGRP = 0o010
MODE_MASK = 0o7777

NAME_MAX = 255
PATH_MAX = 4096


@dataclass(frozen=True, slots=True)
class Credentials:
    """The authenticated identity of a caller: uid, primary gid and supplementary groups."""

    uid: int
    gid: int
    groups: frozenset[int] = field(default_factory=frozenset)

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


ROOT = Credentials(0, 0)


def allowed(inode: meta_pb2.Inode, cred: Credentials, want: int) -> bool:
    """Whether ``cred`` may access ``inode`` for ``want`` (an OR of R_OK, W_OK, X_OK)."""
    mode = inode.mode
    if cred.uid == 0:
        if not want & X_OK or inode.type == meta_pb2.INODE_DIRECTORY:
            return True
        return bool(mode & 0o111)
    if cred.uid == inode.uid:
        bits = (mode >> 6) & 7
    elif cred.in_group(inode.gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


def kill_suid_sgid(mode: int, in_group: bool) -> int:
    """``mode`` less the bits Linux (6.2 on: ``setattr_should_drop_suidgid``) clears when someone
    without CAP_FSETID writes or truncates a file, and when anyone chowns a non-directory:
    S_ISUID, and S_ISGID when the group may execute or the caller is not ``in_group`` (a member
    of the file's group, or root). A member's write leaves a setgid bit without S_IXGRP (which
    grants nothing: it marks mandatory locking)."""
    return mode & ~(S_ISUID | (S_ISGID if mode & S_IXGRP or not in_group else 0))


def check(inode: meta_pb2.Inode, cred: Credentials, want: int) -> None:
    """Raise PERMISSION_DENIED (EACCES) unless :func:`allowed`."""
    if not allowed(inode, cred, want):
        raise FS3Error(
            StatusCode.PERMISSION_DENIED,
            f"uid {cred.uid} lacks {_want_str(want)} permission on inode {inode.id}",
        )


def check_owner(inode: meta_pb2.Inode, cred: Credentials, what: str) -> None:
    """Raise META_NOT_PERMITTED (EPERM) unless the caller owns ``inode`` or is root."""
    if cred.uid != 0 and cred.uid != inode.uid:
        raise FS3Error(StatusCode.META_NOT_PERMITTED, f"only the owner or root may {what}")


def check_sticky(parent: meta_pb2.Inode, child: meta_pb2.Inode, cred: Credentials) -> None:
    """In a sticky directory only the entry's owner, the directory's owner or root may remove or
    rename an entry (EPERM)."""
    if parent.mode & S_ISVTX and cred.uid not in (0, parent.uid, child.uid):
        raise FS3Error(
            StatusCode.META_NOT_PERMITTED,
            f"sticky directory {parent.id}: uid {cred.uid} owns neither it nor the entry",
        )


def _want_str(want: int) -> str:
    return "".join(c for bit, c in ((R_OK, "r"), (W_OK, "w"), (X_OK, "x")) if want & bit)


def check_name(name: bytes) -> None:
    """A directory entry name: 1..255 bytes, no '/', no NUL, not '.' or '..'."""
    if len(name) > NAME_MAX:
        raise FS3Error(StatusCode.META_NAME_TOO_LONG, f"name of {len(name)} bytes exceeds {NAME_MAX}")
    if not name or name in (b".", b"..") or b"/" in name or b"\0" in name:
        raise FS3Error(StatusCode.META_INVALID_NAME, f"invalid name {quote_name(name)}")


def access_of_flags(flags: int) -> int:
    """The access an open(2) ``flags`` value asks for (O_TRUNC implies write)."""
    acc = flags & 3
    want = {0: R_OK, 1: W_OK, 2: R_OK | W_OK}.get(acc, R_OK | W_OK)
    if flags & 0o1000:  # O_TRUNC
        want |= W_OK
    return want
