from fs3.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorageMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORAGE_METHOD_UNSPECIFIED: _ClassVar[StorageMethod]
    METHOD_STORAGE_BATCH_READ: _ClassVar[StorageMethod]
    METHOD_STORAGE_WRITE: _ClassVar[StorageMethod]
    METHOD_STORAGE_UPDATE: _ClassVar[StorageMethod]
    METHOD_STORAGE_QUERY_COMMITTED: _ClassVar[StorageMethod]
    METHOD_STORAGE_QUERY_LAST_CHUNK: _ClassVar[StorageMethod]
    METHOD_STORAGE_TRUNCATE_CHUNKS: _ClassVar[StorageMethod]
    METHOD_STORAGE_REMOVE_CHUNKS: _ClassVar[StorageMethod]
    METHOD_STORAGE_SYNC_START: _ClassVar[StorageMethod]
    METHOD_STORAGE_SYNC_DONE: _ClassVar[StorageMethod]
    METHOD_STORAGE_SPACE_INFO: _ClassVar[StorageMethod]
    METHOD_STORAGE_DUMP_CHUNK_META: _ClassVar[StorageMethod]

class UpdateType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_TYPE_UNSPECIFIED: _ClassVar[UpdateType]
    UPDATE_WRITE: _ClassVar[UpdateType]
    UPDATE_REMOVE: _ClassVar[UpdateType]
    UPDATE_TRUNCATE: _ClassVar[UpdateType]
    UPDATE_EXTEND: _ClassVar[UpdateType]
    UPDATE_REPLACE: _ClassVar[UpdateType]
STORAGE_METHOD_UNSPECIFIED: StorageMethod
METHOD_STORAGE_BATCH_READ: StorageMethod
METHOD_STORAGE_WRITE: StorageMethod
METHOD_STORAGE_UPDATE: StorageMethod
METHOD_STORAGE_QUERY_COMMITTED: StorageMethod
METHOD_STORAGE_QUERY_LAST_CHUNK: StorageMethod
METHOD_STORAGE_TRUNCATE_CHUNKS: StorageMethod
METHOD_STORAGE_REMOVE_CHUNKS: StorageMethod
METHOD_STORAGE_SYNC_START: StorageMethod
METHOD_STORAGE_SYNC_DONE: StorageMethod
METHOD_STORAGE_SPACE_INFO: StorageMethod
METHOD_STORAGE_DUMP_CHUNK_META: StorageMethod
UPDATE_TYPE_UNSPECIFIED: UpdateType
UPDATE_WRITE: UpdateType
UPDATE_REMOVE: UpdateType
UPDATE_TRUNCATE: UpdateType
UPDATE_EXTEND: UpdateType
UPDATE_REPLACE: UpdateType

class ChunkKey(_message.Message):
    __slots__ = ("chain_id", "chain_version", "inode_id", "chunk_index")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    inode_id: int
    chunk_index: int
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., inode_id: _Optional[int] = ..., chunk_index: _Optional[int] = ...) -> None: ...

class RdmaBuf(_message.Message):
    __slots__ = ("addr", "rkey", "length")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    RKEY_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    addr: int
    rkey: int
    length: int
    def __init__(self, addr: _Optional[int] = ..., rkey: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class UpdateTag(_message.Message):
    __slots__ = ("client_id", "request_id", "channel", "seqnum")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    SEQNUM_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    request_id: int
    channel: int
    seqnum: int
    def __init__(self, client_id: _Optional[int] = ..., request_id: _Optional[int] = ..., channel: _Optional[int] = ..., seqnum: _Optional[int] = ...) -> None: ...

class Extent(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class UpdateIO(_message.Message):
    __slots__ = ("key", "type", "offset", "length", "chunk_size", "crc32c", "update_version", "payload_offset", "rdma", "extents")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    UPDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RDMA_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    key: ChunkKey
    type: UpdateType
    offset: int
    length: int
    chunk_size: int
    crc32c: int
    update_version: int
    payload_offset: int
    rdma: RdmaBuf
    extents: _containers.RepeatedCompositeFieldContainer[Extent]
    def __init__(self, key: _Optional[_Union[ChunkKey, _Mapping]] = ..., type: _Optional[_Union[UpdateType, str]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., chunk_size: _Optional[int] = ..., crc32c: _Optional[int] = ..., update_version: _Optional[int] = ..., payload_offset: _Optional[int] = ..., rdma: _Optional[_Union[RdmaBuf, _Mapping]] = ..., extents: _Optional[_Iterable[_Union[Extent, _Mapping]]] = ...) -> None: ...

class WriteReq(_message.Message):
    __slots__ = ("user", "tag", "io", "capability")
    USER_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    IO_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    tag: UpdateTag
    io: UpdateIO
    capability: bytes
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ..., io: _Optional[_Union[UpdateIO, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class UpdateReq(_message.Message):
    __slots__ = ("tag", "io", "syncing", "commit_chain_version", "commit", "target_id", "settle", "lost")
    TAG_FIELD_NUMBER: _ClassVar[int]
    IO_FIELD_NUMBER: _ClassVar[int]
    SYNCING_FIELD_NUMBER: _ClassVar[int]
    COMMIT_CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SETTLE_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    tag: UpdateTag
    io: UpdateIO
    syncing: bool
    commit_chain_version: int
    commit: bool
    target_id: int
    settle: bool
    lost: bool
    def __init__(self, tag: _Optional[_Union[UpdateTag, _Mapping]] = ..., io: _Optional[_Union[UpdateIO, _Mapping]] = ..., syncing: _Optional[bool] = ..., commit_chain_version: _Optional[int] = ..., commit: _Optional[bool] = ..., target_id: _Optional[int] = ..., settle: _Optional[bool] = ..., lost: _Optional[bool] = ...) -> None: ...

class IOResult(_message.Message):
    __slots__ = ("length", "committed_version", "update_version", "crc32c", "commit_chain_version")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    COMMIT_CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    length: int
    committed_version: int
    update_version: int
    crc32c: int
    commit_chain_version: int
    def __init__(self, length: _Optional[int] = ..., committed_version: _Optional[int] = ..., update_version: _Optional[int] = ..., crc32c: _Optional[int] = ..., commit_chain_version: _Optional[int] = ...) -> None: ...

class ReadIO(_message.Message):
    __slots__ = ("key", "offset", "length", "rdma", "capability")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    RDMA_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    key: ChunkKey
    offset: int
    length: int
    rdma: RdmaBuf
    capability: bytes
    def __init__(self, key: _Optional[_Union[ChunkKey, _Mapping]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., rdma: _Optional[_Union[RdmaBuf, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class BatchReadReq(_message.Message):
    __slots__ = ("user", "ios", "verify_checksum", "for_repair")
    USER_FIELD_NUMBER: _ClassVar[int]
    IOS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    FOR_REPAIR_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    ios: _containers.RepeatedCompositeFieldContainer[ReadIO]
    verify_checksum: bool
    for_repair: bool
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., ios: _Optional[_Iterable[_Union[ReadIO, _Mapping]]] = ..., verify_checksum: _Optional[bool] = ..., for_repair: _Optional[bool] = ...) -> None: ...

class ReadResult(_message.Message):
    __slots__ = ("status", "length", "payload_offset", "crc32c", "committed_version")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    length: int
    payload_offset: int
    crc32c: int
    committed_version: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., length: _Optional[int] = ..., payload_offset: _Optional[int] = ..., crc32c: _Optional[int] = ..., committed_version: _Optional[int] = ...) -> None: ...

class BatchReadRsp(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReadResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ReadResult, _Mapping]]] = ...) -> None: ...

class QueryCommittedReq(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ChunkKey
    def __init__(self, key: _Optional[_Union[ChunkKey, _Mapping]] = ...) -> None: ...

class QueryCommittedRsp(_message.Message):
    __slots__ = ("committed_version", "found")
    COMMITTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    committed_version: int
    found: bool
    def __init__(self, committed_version: _Optional[int] = ..., found: _Optional[bool] = ...) -> None: ...

class QueryLastChunkReq(_message.Message):
    __slots__ = ("user", "chain_id", "chain_version", "inode_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    chain_id: int
    chain_version: int
    inode_id: int
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., inode_id: _Optional[int] = ...) -> None: ...

class QueryLastChunkRsp(_message.Message):
    __slots__ = ("last_chunk_index", "last_chunk_length", "total_length", "chunk_count", "found")
    LAST_CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_CHUNK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    last_chunk_index: int
    last_chunk_length: int
    total_length: int
    chunk_count: int
    found: bool
    def __init__(self, last_chunk_index: _Optional[int] = ..., last_chunk_length: _Optional[int] = ..., total_length: _Optional[int] = ..., chunk_count: _Optional[int] = ..., found: _Optional[bool] = ...) -> None: ...

class TruncateChunksReq(_message.Message):
    __slots__ = ("user", "chain_id", "chain_version", "inode_id", "chunk_size", "length", "tag")
    USER_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    chain_id: int
    chain_version: int
    inode_id: int
    chunk_size: int
    length: int
    tag: UpdateTag
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., inode_id: _Optional[int] = ..., chunk_size: _Optional[int] = ..., length: _Optional[int] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ...) -> None: ...

class RemoveChunksReq(_message.Message):
    __slots__ = ("user", "chain_id", "chain_version", "inode_id", "begin_index", "end_index", "tag")
    USER_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    BEGIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    user: _common_pb2.UserInfo
    chain_id: int
    chain_version: int
    inode_id: int
    begin_index: int
    end_index: int
    tag: UpdateTag
    def __init__(self, user: _Optional[_Union[_common_pb2.UserInfo, _Mapping]] = ..., chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., inode_id: _Optional[int] = ..., begin_index: _Optional[int] = ..., end_index: _Optional[int] = ..., tag: _Optional[_Union[UpdateTag, _Mapping]] = ...) -> None: ...

class RemoveChunksRsp(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class TruncateChunksRsp(_message.Message):
    __slots__ = ("removed", "truncated")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    truncated: bool
    def __init__(self, removed: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class SyncStartReq(_message.Message):
    __slots__ = ("target_id", "chain_id", "chain_version")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    chain_id: int
    chain_version: int
    def __init__(self, target_id: _Optional[int] = ..., chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ...) -> None: ...

class SyncStartRsp(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SyncDoneReq(_message.Message):
    __slots__ = ("target_id", "chain_id", "chain_version")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    chain_id: int
    chain_version: int
    def __init__(self, target_id: _Optional[int] = ..., chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ...) -> None: ...

class SyncDoneRsp(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpaceInfoReq(_message.Message):
    __slots__ = ("target_ids",)
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, target_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TargetSpace(_message.Message):
    __slots__ = ("target_id", "capacity", "used", "free", "chunks", "device", "available", "free_total")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    FREE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    capacity: int
    used: int
    free: int
    chunks: int
    device: int
    available: int
    free_total: int
    def __init__(self, target_id: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., free: _Optional[int] = ..., chunks: _Optional[int] = ..., device: _Optional[int] = ..., available: _Optional[int] = ..., free_total: _Optional[int] = ...) -> None: ...

class SpaceInfoRsp(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[TargetSpace]
    def __init__(self, targets: _Optional[_Iterable[_Union[TargetSpace, _Mapping]]] = ...) -> None: ...

class ChunkMeta(_message.Message):
    __slots__ = ("key", "committed_version", "pending_version", "chain_version", "length", "crc32c", "chunk_size", "chunk_id", "lost", "damaged")
    KEY_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PENDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FIELD_NUMBER: _ClassVar[int]
    key: ChunkKey
    committed_version: int
    pending_version: int
    chain_version: int
    length: int
    crc32c: int
    chunk_size: int
    chunk_id: bytes
    lost: bool
    damaged: bool
    def __init__(self, key: _Optional[_Union[ChunkKey, _Mapping]] = ..., committed_version: _Optional[int] = ..., pending_version: _Optional[int] = ..., chain_version: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ..., chunk_size: _Optional[int] = ..., chunk_id: _Optional[bytes] = ..., lost: _Optional[bool] = ..., damaged: _Optional[bool] = ...) -> None: ...

class DumpChunkMetaReq(_message.Message):
    __slots__ = ("target_id", "inode_id", "after", "limit")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    inode_id: int
    after: bytes
    limit: int
    def __init__(self, target_id: _Optional[int] = ..., inode_id: _Optional[int] = ..., after: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class DumpChunkMetaRsp(_message.Message):
    __slots__ = ("chunks", "more")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkMeta]
    more: bool
    def __init__(self, chunks: _Optional[_Iterable[_Union[ChunkMeta, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...
