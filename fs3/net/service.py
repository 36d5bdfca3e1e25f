"""Service definitions: what a service is called on the wire and which messages its methods take.

A :class:`ServiceDef` is shared by both sides. The server registers handlers for it
(:meth:`fs3.net.server.RpcServer.add_service`); the client calls its methods
(:meth:`fs3.net.client.RpcClient.call`)::

    META = ServiceDef(1, "meta", {
        1: ("Stat", meta_pb2.StatRequest, meta_pb2.StatResponse),
        2: ("Create", meta_pb2.CreateRequest, meta_pb2.CreateResponse),
    })

    async def stat(request, payload, ctx) -> meta_pb2.StatResponse: ...

    server.add_service(META, {"Stat": stat, "Create": create})
    response, payload = await client.call(address, META["Stat"], meta_pb2.StatRequest(...))

Service ids are wire protocol, like status codes: never reuse one. Id 0 is the built-in system
service (:mod:`fs3.net.system`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from google.protobuf.message import Message

from fs3.net.transport import Buffer

MAX_SERVICE_ID = 0xFFFF
MAX_METHOD_ID = 0xFFFF


@dataclass(frozen=True, slots=True)
class Method:
    """One method of a service: its ids, name and message classes."""

    service_id: int
    id: int
    name: str
    request: type[Message]
    response: type[Message]
    service_name: str = ""

    @property
    def full_name(self) -> str:
        """``service.Method``, for logs."""
        return f"{self.service_name}.{self.name}"


class ServiceDef:
    """A service: an id, a name, and its methods by id (each with request and response classes)."""

    def __init__(
        self,
        id: int,
        name: str,
        methods: Mapping[int, tuple[str, type[Message], type[Message]]],
    ) -> None:
        if not 0 <= id <= MAX_SERVICE_ID:
            raise ValueError(f"service id {id} out of range")
        self.id = id
        self.name = name
        self._by_id: dict[int, Method] = {}
        self._by_name: dict[str, Method] = {}
        for mid, (mname, req, resp) in methods.items():
            if not 0 <= mid <= MAX_METHOD_ID:
                raise ValueError(f"{name}.{mname}: method id {mid} out of range")
            if mname in self._by_name:
                raise ValueError(f"{name}: method name {mname} used twice")
            if not (issubclass(req, Message) and issubclass(resp, Message)):
                raise TypeError(f"{name}.{mname}: request and response must be protobuf message classes")
            m = Method(id, mid, mname, req, resp, name)
            self._by_id[mid] = m
            self._by_name[mname] = m

    def __getitem__(self, name: str) -> Method:
        """The method called ``name`` (KeyError if there is none)."""
        return self._by_name[name]

    def method(self, method_id: int) -> Method | None:
        """The method with ``method_id``, or None."""
        return self._by_id.get(method_id)

    def __iter__(self) -> Iterator[Method]:
        return iter(self._by_id.values())

    def __repr__(self) -> str:
        return f"ServiceDef({self.id}, {self.name!r}, methods={sorted(self._by_name)})"


@dataclass(slots=True)
class CallContext:
    """What a handler knows about the call it serves.

    ``peer`` is the caller's address, ``identity`` the name it authenticated as, ``deadline`` the
    time (``loop.time()`` clock) after which the caller no longer waits, or None. ``user`` is None
    for a peer that proved the cluster secret (a cluster member: a service, a trusted mount), and
    for a *user connection* (a client that authenticated with a user token, ``token``) the
    ``mgmtd_pb2.User`` the token belongs to: its calls may act only as that user. ``closed`` says
    whether the caller's connection has ended (the caller can no longer have the reply, and may
    have gone on without it).
    """

    peer: str
    identity: str
    request_id: int
    method: Method
    deadline: float | None
    user: Any = None
    token: str = ""
    closed: Callable[[], bool] = lambda: False

    def remaining(self, now: float) -> float | None:
        """Seconds left before the caller's deadline, given ``now`` = ``loop.time()``."""
        return None if self.deadline is None else self.deadline - now


HandlerResult: TypeAlias = (
    Message | tuple[Message, Buffer | None] | tuple[Message, Buffer | None, Callable[[], None]]
)
Handler: TypeAlias = Callable[[Any, memoryview | None, CallContext], Awaitable[HandlerResult]]
"""``async def handler(request, payload, ctx) -> response | (response, payload) | (response,
payload, done)``.

``payload`` is the request's raw payload (a view valid until the handler returns; copy what you
keep) or None. Raise :class:`fs3.errors.FS3Error` to fail the call with its code; any other
exception fails it with INTERNAL and is logged. A returned payload must stay unchanged until sent;
``done``, if returned, is called once it has been sent or will not be (the reply failed), so that
the handler's caller can reuse its memory; it may never be called if the connection closes first.
"""


INLINE_ATTR = "__fs3_inline__"
_F = TypeVar("_F")


def inline(handler: _F) -> _F:
    """Mark a handler to start inline, in the receive path, instead of in a task of its own.

    Inline handlers save a task per call (worth it for small, hot calls) but run outside any task
    until their first ``await`` that suspends, so before that point they must not use
    ``asyncio.timeout``, ``asyncio.current_task`` or set context variables. After it they are
    ordinary tasks.
    """
    setattr(handler, INLINE_ATTR, True)
    return handler
