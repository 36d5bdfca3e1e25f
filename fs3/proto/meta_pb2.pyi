from fs3.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetaMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    META_METHOD_UNSPECIFIED: _ClassVar[MetaMethod]
    METHOD_META_STAT_FS: _ClassVar[MetaMethod]
    METHOD_META_STAT: _ClassVar[MetaMethod]
    METHOD_META_CREATE: _ClassVar[MetaMethod]
    METHOD_META_MKDIR: _ClassVar[MetaMethod]
    METHOD_META_SYMLINK: _ClassVar[MetaMethod]
    METHOD_META_LINK: _ClassVar[MetaMethod]
    METHOD_META_UNLINK: _ClassVar[MetaMethod]
    METHOD_META_OPEN: _ClassVar[MetaMethod]
    METHOD_META_SYNC: _ClassVar[MetaMethod]
    METHOD_META_CLOSE: _ClassVar[MetaMethod]
    METHOD_META_RENAME: _ClassVar[MetaMethod]
    METHOD_META_READDIR: _ClassVar[MetaMethod]
    METHOD_META_LOOKUP: _ClassVar[MetaMethod]
    METHOD_META_READLINK: _ClassVar[MetaMethod]
    METHOD_META_SETATTR: _ClassVar[MetaMethod]
    METHOD_META_PRUNE_SESSION: _ClassVar[MetaMethod]
    METHOD_META_RMDIR: _ClassVar[MetaMethod]
    METHOD_META_MKNOD: _ClassVar[MetaMethod]
    METHOD_META_BATCH_STAT: _ClassVar[MetaMethod]
    METHOD_META_GETXATTR: _ClassVar[MetaMethod]
    METHOD_META_SETXATTR: _ClassVar[MetaMethod]
    METHOD_META_LISTXATTR: _ClassVar[MetaMethod]
    METHOD_META_REMOVEXATTR: _ClassVar[MetaMethod]
    METHOD_META_FALLOCATE: _ClassVar[MetaMethod]
    METHOD_META_LOOKUP_PATH: _ClassVar[MetaMethod]
    METHOD_META_SET_LAYOUT: _ClassVar[MetaMethod]
    METHOD_META_CAPABILITY: _ClassVar[MetaMethod]
    METHOD_META_END_READ_SESSIONS: _ClassVar[MetaMethod]
    METHOD_META_RESTORE_READ_SESSIONS: _ClassVar[MetaMethod]
    METHOD_META_SETTLE_REQUEST: _ClassVar[MetaMethod]

class InodeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INODE_TYPE_UNSPECIFIED: _ClassVar[InodeType]
    INODE_FILE: _ClassVar[InodeType]
    INODE_DIRECTORY: _ClassVar[InodeType]
    INODE_SYMLINK: _ClassVar[InodeType]
    INODE_FIFO: _ClassVar[InodeType]
    INODE_SOCKET: _ClassVar[InodeType]
    INODE_CHAR_DEVICE: _ClassVar[InodeType]
    INODE_BLOCK_DEVICE: _ClassVar[InodeType]

class SetattrField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETATTR_NONE: _ClassVar[SetattrField]
    SETATTR_MODE: _ClassVar[SetattrField]
    SETATTR_UID: _ClassVar[SetattrField]
    SETATTR_GID: _ClassVar[SetattrField]
    SETATTR_SIZE: _ClassVar[SetattrField]
    SETATTR_ATIME: _ClassVar[SetattrField]
    SETATTR_MTIME: _ClassVar[SetattrField]
    SETATTR_ATIME_NOW: _ClassVar[SetattrField]
    SETATTR_MTIME_NOW: _ClassVar[SetattrField]
    SETATTR_CTIME: _ClassVar[SetattrField]
META_METHOD_UNSPECIFIED: MetaMethod
METHOD_META_STAT_FS: MetaMethod
METHOD_META_STAT: MetaMethod
METHOD_META_CREATE: MetaMethod
METHOD_META_MKDIR: MetaMethod
METHOD_META_SYMLINK: MetaMethod
METHOD_META_LINK: MetaMethod
METHOD_META_UNLINK: MetaMethod
METHOD_META_OPEN: MetaMethod
METHOD_META_SYNC: MetaMethod
METHOD_META_CLOSE: MetaMethod
METHOD_META_RENAME: MetaMethod
METHOD_META_READDIR: MetaMethod
METHOD_META_LOOKUP: MetaMethod
METHOD_META_READLINK: MetaMethod
METHOD_META_SETATTR: MetaMethod
METHOD_META_PRUNE_SESSION: MetaMethod
METHOD_META_RMDIR: MetaMethod
METHOD_META_MKNOD: MetaMethod
METHOD_META_BATCH_STAT: MetaMethod
METHOD_META_GETXATTR: MetaMethod
METHOD_META_SETXATTR: MetaMethod
METHOD_META_LISTXATTR: MetaMethod
METHOD_META_REMOVEXATTR: MetaMethod
METHOD_META_FALLOCATE: MetaMethod
METHOD_META_LOOKUP_PATH: MetaMethod
METHOD_META_SET_LAYOUT: MetaMethod
METHOD_META_CAPABILITY: MetaMethod
METHOD_META_END_READ_SESSIONS: MetaMethod
METHOD_META_RESTORE_READ_SESSIONS: MetaMethod
METHOD_META_SETTLE_REQUEST: MetaMethod
INODE_TYPE_UNSPECIFIED: InodeType
INODE_FILE: InodeType
INODE_DIRECTORY: InodeType
INODE_SYMLINK: InodeType
INODE_FIFO: InodeType
INODE_SOCKET: InodeType
INODE_CHAR_DEVICE: InodeType
INODE_BLOCK_DEVICE: InodeType
SETATTR_NONE: SetattrField
SETATTR_MODE: SetattrField
SETATTR_UID: SetattrField
SETATTR_GID: SetattrField
SETATTR_SIZE: SetattrField
SETATTR_ATIME: SetattrField
SETATTR_MTIME: SetattrField
SETATTR_ATIME_NOW: SetattrField
SETATTR_MTIME_NOW: SetattrField
SETATTR_CTIME: SetattrField

class Layout(_message.Message):
    __slots__ = ("chain_table_id", "chain_table_version", "chunk_size", "stripe_count", "chains", "shuffle_algorithm", "shuffle_seed", "base_index")
    CHAIN_TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_SEED_FIELD_NUMBER: _ClassVar[int]
    BASE_INDEX_FIELD_NUMBER: _ClassVar[int]
    chain_table_id: int
    chain_table_version: int
    chunk_size: int
    stripe_count: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    shuffle_algorithm: int
    shuffle_seed: int
    base_index: int
    def __init__(self, chain_table_id: _Optional[int] = ..., chain_table_version: _Optional[int] = ..., chunk_size: _Optional[int] = ..., stripe_count: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ..., shuffle_algorithm: _Optional[int] = ..., shuffle_seed: _Optional[int] = ..., base_index: _Optional[int] = ...) -> None: ...

class Timespec(_message.Message):
    __slots__ = ("sec", "nsec")
    SEC_FIELD_NUMBER: _ClassVar[int]
    NSEC_FIELD_NUMBER: _ClassVar[int]
    sec: int
    nsec: int
    def __init__(self, sec: _Optional[int] = ..., nsec: _Optional[int] = ...) -> None: ...

class Xattr(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    value: bytes
    def __init__(self, name: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class Inode(_message.Message):
    __slots__ = ("id", "type", "mode", "uid", "gid", "nlink", "size", "rdev", "atime_ns", "mtime_ns", "ctime_ns", "layout", "symlink_target", "parent", "generation", "xattrs", "truncate_version", "trim_version", "trim_length", "write_caps_until_ns", "handle", "collecting", "truncating_length", "truncating_until_ns", "times_set_ns")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    XATTRS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRIM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRIM_LENGTH_FIELD_NUMBER: _ClassVar[int]
    WRITE_CAPS_UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    COLLECTING_FIELD_NUMBER: _ClassVar[int]
    TRUNCATING_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATING_UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    TIMES_SET_NS_FIELD_NUMBER: _ClassVar[int]
    id: int
    type: InodeType
    mode: int
    uid: int
    gid: int
    nlink: int
    size: int
    rdev: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    layout: Layout
    symlink_target: bytes
    parent: int
    generation: int
    xattrs: _containers.RepeatedCompositeFieldContainer[Xattr]
    truncate_version: int
    trim_version: int
    trim_length: int
    write_caps_until_ns: int
    handle: bytes
    collecting: bool
    truncating_length: int
    truncating_until_ns: int
    times_set_ns: int
    def __init__(self, id: _Optional[int] = ..., type: _Optional[_Union[InodeType, str]] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., nlink: _Optional[int] = ..., size: _Optional[int] = ..., rdev: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., symlink_target: _Optional[bytes] = ..., parent: _Optional[int] = ..., generation: _Optional[int] = ..., xattrs: _Optional[_Iterable[_Union[Xattr, _Mapping]]] = ..., truncate_version: _Optional[int] = ..., trim_version: _Optional[int] = ..., trim_length: _Optional[int] = ..., write_caps_until_ns: _Optional[int] = ..., handle: _Optional[bytes] = ..., collecting: _Optional[bool] = ..., truncating_length: _Optional[int] = ..., truncating_until_ns: _Optional[int] = ..., times_set_ns: _Optional[int] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("parent", "name", "inode_id", "type")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: bytes
    inode_id: int
    type: InodeType
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[bytes] = ..., inode_id: _Optional[int] = ..., type: _Optional[_Union[InodeType, str]] = ...) -> None: ...

class MetaRequestHeader(_message.Message):
    __slots__ = ("user", "client_id", "request_id", "handles")
    class HandlesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    USER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    client_id: int
    request_id: int
    handles: _containers.ScalarMap[int, bytes]
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., client_id: _Optional[int] = ..., request_id: _Optional[int] = ..., handles: _Optional[_Mapping[int, bytes]] = ...) -> None: ...

class StatFsReq(_message.Message):
    __slots__ = ("hdr",)
    HDR_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ...) -> None: ...

class StatFsRsp(_message.Message):
    __slots__ = ("capacity", "used", "free", "inodes", "block_size", "name_max", "available")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAME_MAX_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    free: int
    inodes: int
    block_size: int
    name_max: int
    available: int
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., free: _Optional[int] = ..., inodes: _Optional[int] = ..., block_size: _Optional[int] = ..., name_max: _Optional[int] = ..., available: _Optional[int] = ...) -> None: ...

class LookupReq(_message.Message):
    __slots__ = ("hdr", "parent", "name")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class LookupPathReq(_message.Message):
    __slots__ = ("hdr", "path", "follow")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    path: bytes
    follow: bool
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., path: _Optional[bytes] = ..., follow: _Optional[bool] = ...) -> None: ...

class StatReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "settled")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    settled: bool
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., settled: _Optional[bool] = ...) -> None: ...

class BatchStatReq(_message.Message):
    __slots__ = ("hdr", "inode_ids")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_IDS_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class InodeRsp(_message.Message):
    __slots__ = ("inode", "session_timeout_s", "end_queued")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    END_QUEUED_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    session_timeout_s: float
    end_queued: bool
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ..., session_timeout_s: _Optional[float] = ..., end_queued: _Optional[bool] = ...) -> None: ...

class BatchStatRsp(_message.Message):
    __slots__ = ("inodes", "errors")
    INODES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    inodes: _containers.RepeatedCompositeFieldContainer[Inode]
    errors: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, inodes: _Optional[_Iterable[_Union[Inode, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...

class CreateReq(_message.Message):
    __slots__ = ("hdr", "parent", "name", "mode", "flags", "umask", "open_session")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    UMASK_FIELD_NUMBER: _ClassVar[int]
    OPEN_SESSION_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    mode: int
    flags: int
    umask: int
    open_session: bool
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., flags: _Optional[int] = ..., umask: _Optional[int] = ..., open_session: _Optional[bool] = ...) -> None: ...

class CreateRsp(_message.Message):
    __slots__ = ("inode", "session_id", "created", "capability")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    session_id: int
    created: bool
    capability: bytes
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ..., session_id: _Optional[int] = ..., created: _Optional[bool] = ..., capability: _Optional[bytes] = ...) -> None: ...

class MkdirReq(_message.Message):
    __slots__ = ("hdr", "parent", "name", "mode", "umask")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UMASK_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    mode: int
    umask: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., umask: _Optional[int] = ...) -> None: ...

class MknodReq(_message.Message):
    __slots__ = ("hdr", "parent", "name", "mode", "rdev", "umask")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    UMASK_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    mode: int
    rdev: int
    umask: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., mode: _Optional[int] = ..., rdev: _Optional[int] = ..., umask: _Optional[int] = ...) -> None: ...

class SymlinkReq(_message.Message):
    __slots__ = ("hdr", "parent", "name", "target")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    target: bytes
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., target: _Optional[bytes] = ...) -> None: ...

class ReadlinkReq(_message.Message):
    __slots__ = ("hdr", "inode_id")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ...) -> None: ...

class ReadlinkRsp(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: bytes
    def __init__(self, target: _Optional[bytes] = ...) -> None: ...

class LinkReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "new_parent", "new_name")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    new_parent: int
    new_name: bytes
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ...) -> None: ...

class UnlinkReq(_message.Message):
    __slots__ = ("hdr", "parent", "name")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class RmdirReq(_message.Message):
    __slots__ = ("hdr", "parent", "name", "recursive")
    HDR_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    parent: int
    name: bytes
    recursive: bool
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[bytes] = ..., recursive: _Optional[bool] = ...) -> None: ...

class EmptyRsp(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RenameReq(_message.Message):
    __slots__ = ("hdr", "old_parent", "old_name", "new_parent", "new_name", "flags", "replaces")
    HDR_FIELD_NUMBER: _ClassVar[int]
    OLD_PARENT_FIELD_NUMBER: _ClassVar[int]
    OLD_NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    REPLACES_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    old_parent: int
    old_name: bytes
    new_parent: int
    new_name: bytes
    flags: int
    replaces: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., old_parent: _Optional[int] = ..., old_name: _Optional[bytes] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[bytes] = ..., flags: _Optional[int] = ..., replaces: _Optional[int] = ...) -> None: ...

class ReaddirReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "after", "limit", "with_inodes")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WITH_INODES_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    after: bytes
    limit: int
    with_inodes: bool
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., after: _Optional[bytes] = ..., limit: _Optional[int] = ..., with_inodes: _Optional[bool] = ...) -> None: ...

class ReaddirRsp(_message.Message):
    __slots__ = ("entries", "inodes", "more")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    inodes: _containers.RepeatedCompositeFieldContainer[Inode]
    more: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., inodes: _Optional[_Iterable[_Union[Inode, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class SetattrReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "fields", "mode", "uid", "gid", "size", "atime_ns", "mtime_ns", "ctime_ns", "session_id")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    fields: int
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    session_id: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., fields: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class OpenReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "flags")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    flags: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., flags: _Optional[int] = ...) -> None: ...

class OpenRsp(_message.Message):
    __slots__ = ("inode", "session_id", "capability", "session_queued")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_QUEUED_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    session_id: int
    capability: bytes
    session_queued: bool
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ..., session_id: _Optional[int] = ..., capability: _Optional[bytes] = ..., session_queued: _Optional[bool] = ...) -> None: ...

class CloseReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "session_id", "written_length", "wrote", "mtime")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    WROTE_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    session_id: int
    written_length: int
    wrote: bool
    mtime: Timespec
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., session_id: _Optional[int] = ..., written_length: _Optional[int] = ..., wrote: _Optional[bool] = ..., mtime: _Optional[_Union[Timespec, _Mapping]] = ...) -> None: ...

class SyncReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "session_id", "written_length", "wrote", "touch", "confirm", "mtime")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    WROTE_FIELD_NUMBER: _ClassVar[int]
    TOUCH_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    session_id: int
    written_length: int
    wrote: bool
    touch: bool
    confirm: bool
    mtime: Timespec
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., session_id: _Optional[int] = ..., written_length: _Optional[int] = ..., wrote: _Optional[bool] = ..., touch: _Optional[bool] = ..., confirm: _Optional[bool] = ..., mtime: _Optional[_Union[Timespec, _Mapping]] = ...) -> None: ...

class PruneSessionReq(_message.Message):
    __slots__ = ("hdr", "client_id")
    HDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    client_id: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., client_id: _Optional[int] = ...) -> None: ...

class PruneSessionRsp(_message.Message):
    __slots__ = ("pruned",)
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    pruned: int
    def __init__(self, pruned: _Optional[int] = ...) -> None: ...

class SettleRequestReq(_message.Message):
    __slots__ = ("hdr", "request_id")
    HDR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    request_id: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., request_id: _Optional[int] = ...) -> None: ...

class SettleRequestRsp(_message.Message):
    __slots__ = ("done", "response")
    DONE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    done: bool
    response: bytes
    def __init__(self, done: _Optional[bool] = ..., response: _Optional[bytes] = ...) -> None: ...

class SessionRef(_message.Message):
    __slots__ = ("inode", "session_id")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    inode: int
    session_id: int
    def __init__(self, inode: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class EndReadSessionsReq(_message.Message):
    __slots__ = ("hdr", "sessions")
    HDR_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    sessions: _containers.RepeatedCompositeFieldContainer[SessionRef]
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SessionRef, _Mapping]]] = ...) -> None: ...

class EndReadSessionsRsp(_message.Message):
    __slots__ = ("ended",)
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ended: int
    def __init__(self, ended: _Optional[int] = ...) -> None: ...

class RestoreReadSessionsReq(_message.Message):
    __slots__ = ("hdr", "inode_ids", "session_ids")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_ids: _containers.RepeatedScalarFieldContainer[int]
    session_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_ids: _Optional[_Iterable[int]] = ..., session_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RestoreReadSessionsRsp(_message.Message):
    __slots__ = ("restored", "present")
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    restored: int
    present: int
    def __init__(self, restored: _Optional[int] = ..., present: _Optional[int] = ...) -> None: ...

class GetxattrReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "name")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    name: bytes
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class GetxattrRsp(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class SetxattrReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "name", "value", "flags")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    name: bytes
    value: bytes
    flags: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., name: _Optional[bytes] = ..., value: _Optional[bytes] = ..., flags: _Optional[int] = ...) -> None: ...

class ListxattrReq(_message.Message):
    __slots__ = ("hdr", "inode_id")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ...) -> None: ...

class ListxattrRsp(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, names: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RemovexattrReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "name")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    name: bytes
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., name: _Optional[bytes] = ...) -> None: ...

class SetLayoutReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "chain_table_id", "chunk_size", "stripe_count")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_COUNT_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    chain_table_id: int
    chunk_size: int
    stripe_count: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., chain_table_id: _Optional[int] = ..., chunk_size: _Optional[int] = ..., stripe_count: _Optional[int] = ...) -> None: ...

class FallocateReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "mode", "offset", "length")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    mode: int
    offset: int
    length: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., mode: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class FileSession(_message.Message):
    __slots__ = ("inode_id", "session_id", "client_id", "write", "opened_ns", "touched_ns", "truncate_version", "stale_below", "fsetid", "uid", "in_group")
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    OPENED_NS_FIELD_NUMBER: _ClassVar[int]
    TOUCHED_NS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STALE_BELOW_FIELD_NUMBER: _ClassVar[int]
    FSETID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    IN_GROUP_FIELD_NUMBER: _ClassVar[int]
    inode_id: int
    session_id: int
    client_id: int
    write: bool
    opened_ns: int
    touched_ns: int
    truncate_version: int
    stale_below: int
    fsetid: bool
    uid: int
    in_group: bool
    def __init__(self, inode_id: _Optional[int] = ..., session_id: _Optional[int] = ..., client_id: _Optional[int] = ..., write: _Optional[bool] = ..., opened_ns: _Optional[int] = ..., touched_ns: _Optional[int] = ..., truncate_version: _Optional[int] = ..., stale_below: _Optional[int] = ..., fsetid: _Optional[bool] = ..., uid: _Optional[int] = ..., in_group: _Optional[bool] = ...) -> None: ...

class GcEntry(_message.Message):
    __slots__ = ("inode_id", "type", "queued_ns", "sweep_after_ns", "layout")
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_NS_FIELD_NUMBER: _ClassVar[int]
    SWEEP_AFTER_NS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    inode_id: int
    type: InodeType
    queued_ns: int
    sweep_after_ns: int
    layout: Layout
    def __init__(self, inode_id: _Optional[int] = ..., type: _Optional[_Union[InodeType, str]] = ..., queued_ns: _Optional[int] = ..., sweep_after_ns: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ...) -> None: ...

class IdemRecord(_message.Message):
    __slots__ = ("created_ns", "response", "request")
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    created_ns: int
    response: bytes
    request: str
    def __init__(self, created_ns: _Optional[int] = ..., response: _Optional[bytes] = ..., request: _Optional[str] = ...) -> None: ...

class CapabilityReq(_message.Message):
    __slots__ = ("hdr", "inode_id", "rights")
    HDR_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    RIGHTS_FIELD_NUMBER: _ClassVar[int]
    hdr: MetaRequestHeader
    inode_id: int
    rights: int
    def __init__(self, hdr: _Optional[_Union[MetaRequestHeader, _Mapping]] = ..., inode_id: _Optional[int] = ..., rights: _Optional[int] = ...) -> None: ...

class CapabilityRsp(_message.Message):
    __slots__ = ("capability",)
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    capability: bytes
    def __init__(self, capability: _Optional[bytes] = ...) -> None: ...
