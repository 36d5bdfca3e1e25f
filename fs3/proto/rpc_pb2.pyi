from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceId(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_SYSTEM: _ClassVar[ServiceId]
    SERVICE_META: _ClassVar[ServiceId]
    SERVICE_STORAGE: _ClassVar[ServiceId]
SERVICE_SYSTEM: ServiceId
SERVICE_META: ServiceId
SERVICE_STORAGE: ServiceId

class ClientHello(_message.Message):
    __slots__ = ("version", "nonce", "identity", "token")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: bytes
    identity: str
    token: str
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[bytes] = ..., identity: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class ServerHello(_message.Message):
    __slots__ = ("version", "nonce", "proof", "identity")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: bytes
    proof: bytes
    identity: str
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[bytes] = ..., proof: _Optional[bytes] = ..., identity: _Optional[str] = ...) -> None: ...

class ClientProof(_message.Message):
    __slots__ = ("proof",)
    PROOF_FIELD_NUMBER: _ClassVar[int]
    proof: bytes
    def __init__(self, proof: _Optional[bytes] = ...) -> None: ...

class AuthOk(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("identity", "server_time_ns")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    identity: str
    server_time_ns: int
    def __init__(self, identity: _Optional[str] = ..., server_time_ns: _Optional[int] = ...) -> None: ...

class EchoRequest(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class EchoResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class SinkRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SinkResponse(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class SourceRequest(_message.Message):
    __slots__ = ("length",)
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    length: int
    def __init__(self, length: _Optional[int] = ...) -> None: ...

class SourceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
