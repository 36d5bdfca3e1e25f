"""fs3.errors: one status-code enum for both RPC stacks, one table to errno."""

from __future__ import annotations

import errno
import pickle

import pytest

from fs3.errors import ERRNO, FS3Error, StatusCode, cut_middle, grpc_code_name, quote_name, to_errno
from fs3.proto import common_pb2


def test_python_and_proto_enums_agree():
    proto = {v.name: v.number for v in common_pb2.DESCRIPTOR.enum_types_by_name["StatusCode"].values}
    assert proto == {c.name: int(c) for c in StatusCode}


@pytest.mark.parametrize(
    "code, expected",
    [
        (StatusCode.NOT_FOUND, errno.ENOENT),
        (StatusCode.ALREADY_EXISTS, errno.EEXIST),
        (StatusCode.META_NOT_DIRECTORY, errno.ENOTDIR),
        (StatusCode.META_IS_DIRECTORY, errno.EISDIR),
        (StatusCode.META_NOT_EMPTY, errno.ENOTEMPTY),
        (StatusCode.META_NAME_TOO_LONG, errno.ENAMETOOLONG),
        (StatusCode.META_TOO_MANY_SYMLINKS, errno.ELOOP),
        (StatusCode.META_TOO_MANY_LINKS, errno.EMLINK),
        (StatusCode.PERMISSION_DENIED, errno.EACCES),
        (StatusCode.META_NOT_PERMITTED, errno.EPERM),
        (StatusCode.INVALID_ARGUMENT, errno.EINVAL),
        (StatusCode.STORAGE_NO_SPACE, errno.ENOSPC),
        (StatusCode.STORAGE_SPACE_KEPT, errno.ENOSPC),
        (StatusCode.STORAGE_CHECKSUM_MISMATCH, errno.EIO),
        (StatusCode.INTERNAL, errno.EIO),
    ],
)
def test_errno_table(code, expected):
    assert to_errno(code) == expected
    assert FS3Error(code).errno == expected


@pytest.mark.parametrize(
    "code",
    [
        StatusCode.UNAVAILABLE,
        StatusCode.ABORTED,
        StatusCode.KV_CONFLICT,
        StatusCode.KV_RETRY_LIMIT,
        StatusCode.CANCELLED,
        StatusCode.RPC_CONNECT_FAILED,  # a stat must not fail with "Connection refused"
        StatusCode.RPC_CONNECTION_CLOSED,
    ],
)
def test_transient_codes_left_after_the_clients_retries_are_eio(code):
    # Not EAGAIN (on a blocking file Python's readall() takes it as the end and returns short data),
    # not EINTR (Python re-issues the call, for ever while the cause lasts).
    assert to_errno(code) == errno.EIO
    assert FS3Error(code).errno == errno.EIO


def test_no_code_claims_a_retry_at_the_syscall_level():
    assert not {errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR} & set(ERRNO.values())
    assert to_errno(StatusCode.DEADLINE_EXCEEDED) == errno.ETIMEDOUT


def test_every_errno_in_the_table_is_a_real_errno():
    assert all(v == 0 or v in errno.errorcode for v in ERRNO.values())


def test_unknown_code_from_a_newer_peer_keeps_its_number():
    e = FS3Error(9999, "future")
    assert e.code == StatusCode.UNKNOWN
    assert "9999" in e.message
    assert to_errno(9999) == errno.EIO


def test_error_survives_pickling_with_its_code():
    e = pickle.loads(pickle.dumps(FS3Error(StatusCode.KV_CONFLICT, "x")))
    assert e.code == StatusCode.KV_CONFLICT and e.message == "x" and e.retryable


def test_grpc_mapping_names_real_grpc_codes():
    import grpc

    for code in StatusCode:
        assert hasattr(grpc.StatusCode, grpc_code_name(code))


@pytest.mark.parametrize(
    "name, shown",
    [
        (b"x", "'x'"),
        ("café".encode(), "'café'"),
        (b"caf\xe9", "'caf\\xe9'"),
        (b"a\\xe9", "'a\\\\xe9'"),  # a real backslash stays apart from an escaped byte
        (b"tab\there", "'tab\\there'"),
        (b"n" * 70, "'" + "n" * 64 + "...'"),
    ],
)
def test_quote_name(name, shown):
    assert quote_name(name) == shown


def test_cut_middle_keeps_both_ends_within_its_limit_as_utf8() -> None:
    assert cut_middle("short", 128) == "short"
    assert cut_middle("name '\udce9' is bad", 128) == "name '\\udce9' is bad"  # sendable text
    text = "why: '" + "\u00e9" * 3000 + "' is too long"
    cut = cut_middle(text, 1024)
    assert cut.startswith("why: '\u00e9") and cut.endswith("\u00e9' is too long")
    assert "bytes cut" in cut and len(cut.encode()) <= 1024


def test_a_log_file_takes_text_that_is_not_utf8(tmp_path) -> None:
    """A record holding a lone surrogate (a name's undecodable bytes) is written with backslash
    escapes, as standard error writes it: the log file's strict UTF-8 lost it ("Logging error")."""
    import logging

    from fs3.config import LogConfig
    from fs3.log import setup_logging

    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    path = tmp_path / "daemon.log"
    try:
        setup_logging(LogConfig(file=str(path), level="INFO"), "test")
        logging.getLogger("fs3.test").warning("cannot open '%s'", "a\udce9b")
        for h in root.handlers:
            h.flush()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
    assert "cannot open 'a\\udce9b'" in path.read_text(encoding="utf-8")
