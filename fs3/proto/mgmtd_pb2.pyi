from fs3.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_REGISTERED: _ClassVar[NodeStatus]
    NODE_STATUS_ACTIVE: _ClassVar[NodeStatus]
    NODE_STATUS_FAILED: _ClassVar[NodeStatus]
    NODE_STATUS_DISABLED: _ClassVar[NodeStatus]

class ChainUpdateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHAIN_UPDATE_UNSPECIFIED: _ClassVar[ChainUpdateMode]
    CHAIN_UPDATE_ADD: _ClassVar[ChainUpdateMode]
    CHAIN_UPDATE_REMOVE: _ClassVar[ChainUpdateMode]
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_REGISTERED: NodeStatus
NODE_STATUS_ACTIVE: NodeStatus
NODE_STATUS_FAILED: NodeStatus
NODE_STATUS_DISABLED: NodeStatus
CHAIN_UPDATE_UNSPECIFIED: ChainUpdateMode
CHAIN_UPDATE_ADD: ChainUpdateMode
CHAIN_UPDATE_REMOVE: ChainUpdateMode

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "type", "endpoints", "hostname", "disabled", "tags", "status", "pid", "last_heartbeat_age_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    type: _common_pb2.NodeType
    endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Endpoint]
    hostname: str
    disabled: bool
    tags: _containers.RepeatedScalarFieldContainer[str]
    status: NodeStatus
    pid: int
    last_heartbeat_age_s: float
    def __init__(self, node_id: _Optional[int] = ..., type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., endpoints: _Optional[_Iterable[_Union[_common_pb2.Endpoint, _Mapping]]] = ..., hostname: _Optional[str] = ..., disabled: _Optional[bool] = ..., tags: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., pid: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ...) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("target_id", "node_id", "disk_index", "chain_id", "public_state", "local_state", "used_bytes", "low_space")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOW_SPACE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: int
    disk_index: int
    chain_id: int
    public_state: _common_pb2.PublicTargetState
    local_state: _common_pb2.LocalTargetState
    used_bytes: int
    low_space: bool
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[int] = ..., disk_index: _Optional[int] = ..., chain_id: _Optional[int] = ..., public_state: _Optional[_Union[_common_pb2.PublicTargetState, str]] = ..., local_state: _Optional[_Union[_common_pb2.LocalTargetState, str]] = ..., used_bytes: _Optional[int] = ..., low_space: _Optional[bool] = ...) -> None: ...

class ChainTarget(_message.Message):
    __slots__ = ("target_id", "public_state")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    public_state: _common_pb2.PublicTargetState
    def __init__(self, target_id: _Optional[int] = ..., public_state: _Optional[_Union[_common_pb2.PublicTargetState, str]] = ...) -> None: ...

class DrainingTarget(_message.Message):
    __slots__ = ("target_id", "remove", "since_version", "force")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    remove: bool
    since_version: int
    force: bool
    def __init__(self, target_id: _Optional[int] = ..., remove: _Optional[bool] = ..., since_version: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class ChainInfo(_message.Message):
    __slots__ = ("chain_id", "version", "targets", "preferred_order", "draining")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_ORDER_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    version: int
    targets: _containers.RepeatedCompositeFieldContainer[ChainTarget]
    preferred_order: _containers.RepeatedScalarFieldContainer[int]
    draining: _containers.RepeatedCompositeFieldContainer[DrainingTarget]
    def __init__(self, chain_id: _Optional[int] = ..., version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[ChainTarget, _Mapping]]] = ..., preferred_order: _Optional[_Iterable[int]] = ..., draining: _Optional[_Iterable[_Union[DrainingTarget, _Mapping]]] = ...) -> None: ...

class ChainTable(_message.Message):
    __slots__ = ("table_id", "version", "chain_ids", "description")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    version: int
    chain_ids: _containers.RepeatedScalarFieldContainer[int]
    description: str
    def __init__(self, table_id: _Optional[int] = ..., version: _Optional[int] = ..., chain_ids: _Optional[_Iterable[int]] = ..., description: _Optional[str] = ...) -> None: ...

class RoutingInfo(_message.Message):
    __slots__ = ("version", "bootstrapping", "nodes", "targets", "chains", "chain_tables")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAPPING_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLES_FIELD_NUMBER: _ClassVar[int]
    version: int
    bootstrapping: bool
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    chains: _containers.RepeatedCompositeFieldContainer[ChainInfo]
    chain_tables: _containers.RepeatedCompositeFieldContainer[ChainTable]
    def __init__(self, version: _Optional[int] = ..., bootstrapping: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ..., chains: _Optional[_Iterable[_Union[ChainInfo, _Mapping]]] = ..., chain_tables: _Optional[_Iterable[_Union[ChainTable, _Mapping]]] = ...) -> None: ...

class ConfigInfo(_message.Message):
    __slots__ = ("node_type", "version", "content", "description")
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    node_type: _common_pb2.NodeType
    version: int
    content: str
    description: str
    def __init__(self, node_type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., version: _Optional[int] = ..., content: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ClientSession(_message.Message):
    __slots__ = ("client_id", "description", "hostname", "pid", "uid", "type", "started_at", "extended_at")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_AT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    description: str
    hostname: str
    pid: int
    uid: int
    type: _common_pb2.NodeType
    started_at: float
    extended_at: float
    def __init__(self, client_id: _Optional[str] = ..., description: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., started_at: _Optional[float] = ..., extended_at: _Optional[float] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("uid", "name", "gid", "groups", "admin", "root", "token_count", "token_expires_in_s", "tokens")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    uid: int
    name: str
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    admin: bool
    root: bool
    token_count: int
    token_expires_in_s: float
    tokens: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, uid: _Optional[int] = ..., name: _Optional[str] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., admin: _Optional[bool] = ..., root: _Optional[bool] = ..., token_count: _Optional[int] = ..., token_expires_in_s: _Optional[float] = ..., tokens: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("created_at", "expires_at")
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    created_at: float
    expires_at: float
    def __init__(self, created_at: _Optional[float] = ..., expires_at: _Optional[float] = ...) -> None: ...

class MgmtdLease(_message.Message):
    __slots__ = ("node_id", "address", "epoch", "expires_at", "acquired_at", "renewals")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_FIELD_NUMBER: _ClassVar[int]
    RENEWALS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    address: str
    epoch: int
    expires_at: float
    acquired_at: float
    renewals: int
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., epoch: _Optional[int] = ..., expires_at: _Optional[float] = ..., acquired_at: _Optional[float] = ..., renewals: _Optional[int] = ...) -> None: ...

class StoredToken(_message.Message):
    __slots__ = ("digest", "created_at", "expires_at")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    digest: bytes
    created_at: float
    expires_at: float
    def __init__(self, digest: _Optional[bytes] = ..., created_at: _Optional[float] = ..., expires_at: _Optional[float] = ...) -> None: ...

class StoredUser(_message.Message):
    __slots__ = ("user", "tokens")
    USER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    user: User
    tokens: _containers.RepeatedCompositeFieldContainer[StoredToken]
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., tokens: _Optional[_Iterable[_Union[StoredToken, _Mapping]]] = ...) -> None: ...

class ClusterRecord(_message.Message):
    __slots__ = ("cluster_id", "created_at")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    created_at: float
    def __init__(self, cluster_id: _Optional[str] = ..., created_at: _Optional[float] = ...) -> None: ...

class FileSystemRecord(_message.Message):
    __slots__ = ("file_system_id", "node_id", "store", "claimed_at")
    FILE_SYSTEM_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_FIELD_NUMBER: _ClassVar[int]
    file_system_id: str
    node_id: int
    store: str
    claimed_at: float
    def __init__(self, file_system_id: _Optional[str] = ..., node_id: _Optional[int] = ..., store: _Optional[str] = ..., claimed_at: _Optional[float] = ...) -> None: ...

class GetPrimaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPrimaryReply(_message.Message):
    __slots__ = ("node_id", "address", "is_self", "self_node_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_SELF_FIELD_NUMBER: _ClassVar[int]
    SELF_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    address: str
    is_self: bool
    self_node_id: int
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., is_self: _Optional[bool] = ..., self_node_id: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "type", "endpoints", "hostname")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    type: _common_pb2.NodeType
    endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Endpoint]
    hostname: str
    def __init__(self, node_id: _Optional[int] = ..., type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., endpoints: _Optional[_Iterable[_Union[_common_pb2.Endpoint, _Mapping]]] = ..., hostname: _Optional[str] = ...) -> None: ...

class RegisterNodeReply(_message.Message):
    __slots__ = ("routing_version",)
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    def __init__(self, routing_version: _Optional[int] = ...) -> None: ...

class ClaimFileSystemRequest(_message.Message):
    __slots__ = ("node_id", "file_system_id", "store")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_SYSTEM_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    file_system_id: str
    store: str
    def __init__(self, node_id: _Optional[int] = ..., file_system_id: _Optional[str] = ..., store: _Optional[str] = ...) -> None: ...

class ClaimFileSystemReply(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: FileSystemRecord
    def __init__(self, recorded: _Optional[_Union[FileSystemRecord, _Mapping]] = ...) -> None: ...

class UnregisterNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class SetNodeEnabledRequest(_message.Message):
    __slots__ = ("node_id", "enabled", "force")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    enabled: bool
    force: bool
    def __init__(self, node_id: _Optional[int] = ..., enabled: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class TargetHeartbeat(_message.Message):
    __slots__ = ("target_id", "local_state", "chain_version", "used_bytes", "low_space", "disk_index")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOW_SPACE_FIELD_NUMBER: _ClassVar[int]
    DISK_INDEX_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    local_state: _common_pb2.LocalTargetState
    chain_version: int
    used_bytes: int
    low_space: bool
    disk_index: int
    def __init__(self, target_id: _Optional[int] = ..., local_state: _Optional[_Union[_common_pb2.LocalTargetState, str]] = ..., chain_version: _Optional[int] = ..., used_bytes: _Optional[int] = ..., low_space: _Optional[bool] = ..., disk_index: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "type", "incarnation", "sequence", "endpoints", "hostname", "pid", "targets", "config_version", "routing_version")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    type: _common_pb2.NodeType
    incarnation: int
    sequence: int
    endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Endpoint]
    hostname: str
    pid: int
    targets: _containers.RepeatedCompositeFieldContainer[TargetHeartbeat]
    config_version: int
    routing_version: int
    def __init__(self, node_id: _Optional[int] = ..., type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., incarnation: _Optional[int] = ..., sequence: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[_common_pb2.Endpoint, _Mapping]]] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[TargetHeartbeat, _Mapping]]] = ..., config_version: _Optional[int] = ..., routing_version: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("routing_version", "config", "heartbeat_timeout_s", "fence_s")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    FENCE_S_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    config: ConfigInfo
    heartbeat_timeout_s: float
    fence_s: float
    def __init__(self, routing_version: _Optional[int] = ..., config: _Optional[_Union[ConfigInfo, _Mapping]] = ..., heartbeat_timeout_s: _Optional[float] = ..., fence_s: _Optional[float] = ...) -> None: ...

class GetRoutingInfoRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class GetRoutingInfoReply(_message.Message):
    __slots__ = ("info", "version")
    INFO_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    info: RoutingInfo
    version: int
    def __init__(self, info: _Optional[_Union[RoutingInfo, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class ExtendClientSessionRequest(_message.Message):
    __slots__ = ("session", "config_version", "renewing")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    RENEWING_FIELD_NUMBER: _ClassVar[int]
    session: ClientSession
    config_version: int
    renewing: bool
    def __init__(self, session: _Optional[_Union[ClientSession, _Mapping]] = ..., config_version: _Optional[int] = ..., renewing: _Optional[bool] = ...) -> None: ...

class ExtendClientSessionReply(_message.Message):
    __slots__ = ("routing_version", "config", "session_timeout_s", "session_lost")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SESSION_LOST_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    config: ConfigInfo
    session_timeout_s: float
    session_lost: bool
    def __init__(self, routing_version: _Optional[int] = ..., config: _Optional[_Union[ConfigInfo, _Mapping]] = ..., session_timeout_s: _Optional[float] = ..., session_lost: _Optional[bool] = ...) -> None: ...

class EndClientSessionRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    def __init__(self, client_id: _Optional[str] = ...) -> None: ...

class ListClientSessionsRequest(_message.Message):
    __slots__ = ("start_after", "limit")
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start_after: str
    limit: int
    def __init__(self, start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListClientSessionsReply(_message.Message):
    __slots__ = ("sessions", "more", "partial", "listening_s", "session_timeout_s")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    LISTENING_S_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[ClientSession]
    more: bool
    partial: bool
    listening_s: float
    session_timeout_s: float
    def __init__(self, sessions: _Optional[_Iterable[_Union[ClientSession, _Mapping]]] = ..., more: _Optional[bool] = ..., partial: _Optional[bool] = ..., listening_s: _Optional[float] = ..., session_timeout_s: _Optional[float] = ...) -> None: ...

class InitClusterRequest(_message.Message):
    __slots__ = ("cluster_id", "admin_name", "admin_uid", "admin_gid")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ADMIN_NAME_FIELD_NUMBER: _ClassVar[int]
    ADMIN_UID_FIELD_NUMBER: _ClassVar[int]
    ADMIN_GID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    admin_name: str
    admin_uid: int
    admin_gid: int
    def __init__(self, cluster_id: _Optional[str] = ..., admin_name: _Optional[str] = ..., admin_uid: _Optional[int] = ..., admin_gid: _Optional[int] = ...) -> None: ...

class InitClusterReply(_message.Message):
    __slots__ = ("admin_token", "admin_uid")
    ADMIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ADMIN_UID_FIELD_NUMBER: _ClassVar[int]
    admin_token: str
    admin_uid: int
    def __init__(self, admin_token: _Optional[str] = ..., admin_uid: _Optional[int] = ...) -> None: ...

class TargetSpec(_message.Message):
    __slots__ = ("target_id", "node_id", "disk_index")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_INDEX_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: int
    disk_index: int
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[int] = ..., disk_index: _Optional[int] = ...) -> None: ...

class CreateTargetsRequest(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetSpec]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetSpec, _Mapping]]] = ...) -> None: ...

class RemoveTargetRequest(_message.Message):
    __slots__ = ("target_id",)
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    def __init__(self, target_id: _Optional[int] = ...) -> None: ...

class OfflineTargetRequest(_message.Message):
    __slots__ = ("target_id", "force")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    force: bool
    def __init__(self, target_id: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class ChainSpec(_message.Message):
    __slots__ = ("chain_id", "target_ids")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chain_id: _Optional[int] = ..., target_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UploadChainsRequest(_message.Message):
    __slots__ = ("chains", "set_preferred_order")
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    SET_PREFERRED_ORDER_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[ChainSpec]
    set_preferred_order: bool
    def __init__(self, chains: _Optional[_Iterable[_Union[ChainSpec, _Mapping]]] = ..., set_preferred_order: _Optional[bool] = ...) -> None: ...

class UploadChainTableRequest(_message.Message):
    __slots__ = ("table_id", "chain_ids", "description")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    chain_ids: _containers.RepeatedScalarFieldContainer[int]
    description: str
    def __init__(self, table_id: _Optional[int] = ..., chain_ids: _Optional[_Iterable[int]] = ..., description: _Optional[str] = ...) -> None: ...

class UploadChainTableReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class UpdateChainRequest(_message.Message):
    __slots__ = ("chain_id", "target_id", "mode", "force")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    target_id: int
    mode: ChainUpdateMode
    force: bool
    def __init__(self, chain_id: _Optional[int] = ..., target_id: _Optional[int] = ..., mode: _Optional[_Union[ChainUpdateMode, str]] = ..., force: _Optional[bool] = ...) -> None: ...

class RotateLastSrvRequest(_message.Message):
    __slots__ = ("chain_id",)
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    def __init__(self, chain_id: _Optional[int] = ...) -> None: ...

class SetPreferredOrderRequest(_message.Message):
    __slots__ = ("chain_id", "target_ids")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chain_id: _Optional[int] = ..., target_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RotateAsPreferredOrderRequest(_message.Message):
    __slots__ = ("chain_id",)
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    def __init__(self, chain_id: _Optional[int] = ...) -> None: ...

class ChainReply(_message.Message):
    __slots__ = ("chain",)
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    chain: ChainInfo
    def __init__(self, chain: _Optional[_Union[ChainInfo, _Mapping]] = ...) -> None: ...

class AddUserRequest(_message.Message):
    __slots__ = ("uid", "name", "gid", "groups", "admin", "root")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    uid: int
    name: str
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    admin: bool
    root: bool
    def __init__(self, uid: _Optional[int] = ..., name: _Optional[str] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., admin: _Optional[bool] = ..., root: _Optional[bool] = ...) -> None: ...

class UserTokenReply(_message.Message):
    __slots__ = ("user", "token")
    USER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    user: User
    token: str
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class RemoveUserRequest(_message.Message):
    __slots__ = ("uid",)
    UID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    def __init__(self, uid: _Optional[int] = ...) -> None: ...

class SetUserRequest(_message.Message):
    __slots__ = ("uid", "name", "gid", "set_groups", "groups", "admin", "root")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SET_GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    uid: int
    name: str
    gid: int
    set_groups: bool
    groups: _containers.RepeatedScalarFieldContainer[int]
    admin: bool
    root: bool
    def __init__(self, uid: _Optional[int] = ..., name: _Optional[str] = ..., gid: _Optional[int] = ..., set_groups: _Optional[bool] = ..., groups: _Optional[_Iterable[int]] = ..., admin: _Optional[bool] = ..., root: _Optional[bool] = ...) -> None: ...

class IssueTokenRequest(_message.Message):
    __slots__ = ("uid", "ttl_s", "invalidate_existing")
    UID_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    INVALIDATE_EXISTING_FIELD_NUMBER: _ClassVar[int]
    uid: int
    ttl_s: float
    invalidate_existing: bool
    def __init__(self, uid: _Optional[int] = ..., ttl_s: _Optional[float] = ..., invalidate_existing: _Optional[bool] = ...) -> None: ...

class GetUserRequest(_message.Message):
    __slots__ = ("uid",)
    UID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    def __init__(self, uid: _Optional[int] = ...) -> None: ...

class UserReply(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListUsersReply(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class VerifyTokenRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class ListTargetsRequest(_message.Message):
    __slots__ = ("chain_id",)
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    def __init__(self, chain_id: _Optional[int] = ...) -> None: ...

class ListTargetsReply(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ...) -> None: ...

class ListChainsRequest(_message.Message):
    __slots__ = ("table_id", "table_version")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    table_version: int
    def __init__(self, table_id: _Optional[int] = ..., table_version: _Optional[int] = ...) -> None: ...

class ListChainsReply(_message.Message):
    __slots__ = ("chains",)
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[ChainInfo]
    def __init__(self, chains: _Optional[_Iterable[_Union[ChainInfo, _Mapping]]] = ...) -> None: ...

class ListChainTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListChainTablesReply(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[ChainTable]
    def __init__(self, tables: _Optional[_Iterable[_Union[ChainTable, _Mapping]]] = ...) -> None: ...

class SetConfigRequest(_message.Message):
    __slots__ = ("node_type", "content", "description")
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    node_type: _common_pb2.NodeType
    content: str
    description: str
    def __init__(self, node_type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., content: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class SetConfigReply(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ("node_type", "version")
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    node_type: _common_pb2.NodeType
    version: int
    def __init__(self, node_type: _Optional[_Union[_common_pb2.NodeType, str]] = ..., version: _Optional[int] = ...) -> None: ...

class GetConfigReply(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: ConfigInfo
    def __init__(self, config: _Optional[_Union[ConfigInfo, _Mapping]] = ...) -> None: ...

class MgmtdEmpty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
