from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[StatusCode]
    UNKNOWN: _ClassVar[StatusCode]
    INVALID_ARGUMENT: _ClassVar[StatusCode]
    DEADLINE_EXCEEDED: _ClassVar[StatusCode]
    NOT_FOUND: _ClassVar[StatusCode]
    ALREADY_EXISTS: _ClassVar[StatusCode]
    PERMISSION_DENIED: _ClassVar[StatusCode]
    UNAUTHENTICATED: _ClassVar[StatusCode]
    RESOURCE_EXHAUSTED: _ClassVar[StatusCode]
    FAILED_PRECONDITION: _ClassVar[StatusCode]
    ABORTED: _ClassVar[StatusCode]
    UNAVAILABLE: _ClassVar[StatusCode]
    INTERNAL: _ClassVar[StatusCode]
    NOT_IMPLEMENTED: _ClassVar[StatusCode]
    CANCELLED: _ClassVar[StatusCode]
    CONFIG_INVALID: _ClassVar[StatusCode]
    SESSION_LOST: _ClassVar[StatusCode]
    RPC_MALFORMED_FRAME: _ClassVar[StatusCode]
    RPC_UNKNOWN_SERVICE: _ClassVar[StatusCode]
    RPC_UNKNOWN_METHOD: _ClassVar[StatusCode]
    RPC_BAD_MESSAGE: _ClassVar[StatusCode]
    RPC_CONNECTION_CLOSED: _ClassVar[StatusCode]
    RPC_FRAME_TOO_LARGE: _ClassVar[StatusCode]
    RPC_AUTH_FAILED: _ClassVar[StatusCode]
    RPC_CONNECT_FAILED: _ClassVar[StatusCode]
    KV_CONFLICT: _ClassVar[StatusCode]
    KV_KEY_TOO_LARGE: _ClassVar[StatusCode]
    KV_VALUE_TOO_LARGE: _ClassVar[StatusCode]
    KV_TXN_TOO_LARGE: _ClassVar[StatusCode]
    KV_RETRY_LIMIT: _ClassVar[StatusCode]
    KV_TXN_CLOSED: _ClassVar[StatusCode]
    KV_STORE_FAILED: _ClassVar[StatusCode]
    KV_STORE_FULL: _ClassVar[StatusCode]
    META_NOT_DIRECTORY: _ClassVar[StatusCode]
    META_IS_DIRECTORY: _ClassVar[StatusCode]
    META_NOT_EMPTY: _ClassVar[StatusCode]
    META_NAME_TOO_LONG: _ClassVar[StatusCode]
    META_INVALID_NAME: _ClassVar[StatusCode]
    META_TOO_MANY_SYMLINKS: _ClassVar[StatusCode]
    META_TOO_MANY_LINKS: _ClassVar[StatusCode]
    META_NOT_PERMITTED: _ClassVar[StatusCode]
    META_BAD_HANDLE: _ClassVar[StatusCode]
    META_NO_XATTR: _ClassVar[StatusCode]
    META_XATTR_RANGE: _ClassVar[StatusCode]
    META_CROSS_DEVICE: _ClassVar[StatusCode]
    META_FILE_TOO_LARGE: _ClassVar[StatusCode]
    META_BUSY: _ClassVar[StatusCode]
    META_READ_ONLY: _ClassVar[StatusCode]
    META_NOT_SUPPORTED: _ClassVar[StatusCode]
    META_TOO_BIG: _ClassVar[StatusCode]
    META_STALE: _ClassVar[StatusCode]
    META_NO_SUCH_DEVICE: _ClassVar[StatusCode]
    MGMTD_NOT_PRIMARY: _ClassVar[StatusCode]
    MGMTD_UNKNOWN_NODE: _ClassVar[StatusCode]
    MGMTD_NODE_DISABLED: _ClassVar[StatusCode]
    MGMTD_STALE_HEARTBEAT: _ClassVar[StatusCode]
    MGMTD_UNKNOWN_TARGET: _ClassVar[StatusCode]
    MGMTD_UNKNOWN_CHAIN: _ClassVar[StatusCode]
    MGMTD_INVALID_CHAIN: _ClassVar[StatusCode]
    MGMTD_UNKNOWN_CHAIN_TABLE: _ClassVar[StatusCode]
    MGMTD_NOT_INITIALIZED: _ClassVar[StatusCode]
    MGMTD_LEASE_LOST: _ClassVar[StatusCode]
    STORAGE_CHAIN_VERSION_MISMATCH: _ClassVar[StatusCode]
    STORAGE_NOT_HEAD: _ClassVar[StatusCode]
    STORAGE_TARGET_NOT_SERVING: _ClassVar[StatusCode]
    STORAGE_TARGET_OFFLINE: _ClassVar[StatusCode]
    STORAGE_CHUNK_NOT_FOUND: _ClassVar[StatusCode]
    STORAGE_CHECKSUM_MISMATCH: _ClassVar[StatusCode]
    STORAGE_NO_SPACE: _ClassVar[StatusCode]
    STORAGE_IO_ERROR: _ClassVar[StatusCode]
    STORAGE_ROUTING_STALE: _ClassVar[StatusCode]
    STORAGE_CHUNK_TOO_LARGE: _ClassVar[StatusCode]
    STORAGE_CHUNK_VERSION_MISMATCH: _ClassVar[StatusCode]
    STORAGE_SPACE_KEPT: _ClassVar[StatusCode]
    STORAGE_CAPABILITY: _ClassVar[StatusCode]

class NodeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_TYPE_UNSPECIFIED: _ClassVar[NodeType]
    NODE_MGMTD: _ClassVar[NodeType]
    NODE_META: _ClassVar[NodeType]
    NODE_STORAGE: _ClassVar[NodeType]
    NODE_CLIENT: _ClassVar[NodeType]

class PublicTargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUBLIC_STATE_INVALID: _ClassVar[PublicTargetState]
    SERVING: _ClassVar[PublicTargetState]
    SYNCING: _ClassVar[PublicTargetState]
    WAITING: _ClassVar[PublicTargetState]
    LASTSRV: _ClassVar[PublicTargetState]
    OFFLINE: _ClassVar[PublicTargetState]

class LocalTargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCAL_STATE_INVALID: _ClassVar[LocalTargetState]
    UPTODATE: _ClassVar[LocalTargetState]
    ONLINE: _ClassVar[LocalTargetState]
    LOCAL_OFFLINE: _ClassVar[LocalTargetState]
OK: StatusCode
UNKNOWN: StatusCode
INVALID_ARGUMENT: StatusCode
DEADLINE_EXCEEDED: StatusCode
NOT_FOUND: StatusCode
ALREADY_EXISTS: StatusCode
PERMISSION_DENIED: StatusCode
UNAUTHENTICATED: StatusCode
RESOURCE_EXHAUSTED: StatusCode
FAILED_PRECONDITION: StatusCode
ABORTED: StatusCode
UNAVAILABLE: StatusCode
INTERNAL: StatusCode
NOT_IMPLEMENTED: StatusCode
CANCELLED: StatusCode
CONFIG_INVALID: StatusCode
SESSION_LOST: StatusCode
RPC_MALFORMED_FRAME: StatusCode
RPC_UNKNOWN_SERVICE: StatusCode
RPC_UNKNOWN_METHOD: StatusCode
RPC_BAD_MESSAGE: StatusCode
RPC_CONNECTION_CLOSED: StatusCode
RPC_FRAME_TOO_LARGE: StatusCode
RPC_AUTH_FAILED: StatusCode
RPC_CONNECT_FAILED: StatusCode
KV_CONFLICT: StatusCode
KV_KEY_TOO_LARGE: StatusCode
KV_VALUE_TOO_LARGE: StatusCode
KV_TXN_TOO_LARGE: StatusCode
KV_RETRY_LIMIT: StatusCode
KV_TXN_CLOSED: StatusCode
KV_STORE_FAILED: StatusCode
KV_STORE_FULL: StatusCode
META_NOT_DIRECTORY: StatusCode
META_IS_DIRECTORY: StatusCode
META_NOT_EMPTY: StatusCode
META_NAME_TOO_LONG: StatusCode
META_INVALID_NAME: StatusCode
META_TOO_MANY_SYMLINKS: StatusCode
META_TOO_MANY_LINKS: StatusCode
META_NOT_PERMITTED: StatusCode
META_BAD_HANDLE: StatusCode
META_NO_XATTR: StatusCode
META_XATTR_RANGE: StatusCode
META_CROSS_DEVICE: StatusCode
META_FILE_TOO_LARGE: StatusCode
META_BUSY: StatusCode
META_READ_ONLY: StatusCode
META_NOT_SUPPORTED: StatusCode
META_TOO_BIG: StatusCode
META_STALE: StatusCode
META_NO_SUCH_DEVICE: StatusCode
MGMTD_NOT_PRIMARY: StatusCode
MGMTD_UNKNOWN_NODE: StatusCode
MGMTD_NODE_DISABLED: StatusCode
MGMTD_STALE_HEARTBEAT: StatusCode
MGMTD_UNKNOWN_TARGET: StatusCode
MGMTD_UNKNOWN_CHAIN: StatusCode
MGMTD_INVALID_CHAIN: StatusCode
MGMTD_UNKNOWN_CHAIN_TABLE: StatusCode
MGMTD_NOT_INITIALIZED: StatusCode
MGMTD_LEASE_LOST: StatusCode
STORAGE_CHAIN_VERSION_MISMATCH: StatusCode
STORAGE_NOT_HEAD: StatusCode
STORAGE_TARGET_NOT_SERVING: StatusCode
STORAGE_TARGET_OFFLINE: StatusCode
STORAGE_CHUNK_NOT_FOUND: StatusCode
STORAGE_CHECKSUM_MISMATCH: StatusCode
STORAGE_NO_SPACE: StatusCode
STORAGE_IO_ERROR: StatusCode
STORAGE_ROUTING_STALE: StatusCode
STORAGE_CHUNK_TOO_LARGE: StatusCode
STORAGE_CHUNK_VERSION_MISMATCH: StatusCode
STORAGE_SPACE_KEPT: StatusCode
STORAGE_CAPABILITY: StatusCode
NODE_TYPE_UNSPECIFIED: NodeType
NODE_MGMTD: NodeType
NODE_META: NodeType
NODE_STORAGE: NodeType
NODE_CLIENT: NodeType
PUBLIC_STATE_INVALID: PublicTargetState
SERVING: PublicTargetState
SYNCING: PublicTargetState
WAITING: PublicTargetState
LASTSRV: PublicTargetState
OFFLINE: PublicTargetState
LOCAL_STATE_INVALID: LocalTargetState
UPTODATE: LocalTargetState
ONLINE: LocalTargetState
LOCAL_OFFLINE: LocalTargetState

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class NodeId(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class TargetId(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ChainId(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("host", "port", "transport")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    transport: str
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., transport: _Optional[str] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ("uid", "gid", "groups", "token")
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    uid: int
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    token: str
    def __init__(self, uid: _Optional[int] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., token: _Optional[str] = ...) -> None: ...
