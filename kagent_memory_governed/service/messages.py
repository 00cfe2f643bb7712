"""What the data plane's service reads off a request and writes into a reply, at the wire's own cost: embeddings from
a ``Vector``'s packed bytes, identifiers bounded, hits with their times in integer arithmetic."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import grpc
import numpy
from google.protobuf.timestamp_pb2 import Timestamp

from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import wire
from kagent_memory_governed.service.values import Embedding
from kagent_memory_governed.store import Hit


def embedding(vector: pb.Vector) -> Embedding:
    """A ``Vector``'s values for the store, which takes arrays and lists, not containers: the single-precision array
    they are on the wire, read from the message's own packed bytes (field 1, a length, little-endian floats) without
    a list of 768 Python floats in between (protobuf writes repeated floats packed); an empty list for none."""
    raw = vector.SerializeToString()
    length, shift, at = 0, 0, 1
    while raw[:1] == b"\x0a" and at < len(raw) and shift < 35:
        byte = raw[at]
        length, shift, at = length | (byte & 0x7F) << shift, shift + 7, at + 1
        if not byte & 0x80:
            if at + length == len(raw) and length % 4 == 0:
                return numpy.frombuffer(raw, dtype="<f4", offset=at)
            break
    return list(vector.values)


def identifier(value: str) -> str:
    if not 1 <= len(value) <= wire.MAX_ID_CHARS:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return value


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp(moment: datetime) -> Timestamp:
    """``Timestamp.FromDatetime``'s value (a naive time taken as UTC), in integer arithmetic: a third of its cost."""
    since = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)) - EPOCH
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def hit(hit: Hit) -> pb.Hit:
    entry = hit.entry_id if isinstance(hit.entry_id, uuid.UUID) else uuid.UUID(str(hit.entry_id))
    return pb.Hit(
        entry_id=str(entry),
        text=hit.text,
        score=hit.score,
        created_at=timestamp(hit.created_at),
        expires_at=timestamp(hit.expires_at),
    )


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata; a second ``authorization`` or ``x-memory-scope`` is refused, never chosen among."""
    found: dict[str, str] = {}
    for item in context.invocation_metadata() or ():
        name, value = item[0], item[1]
        if not isinstance(name, str) or not isinstance(value, str):
            continue  # binary (``-bin``) metadata names nothing this service reads
        name = name.lower()
        if name in found and name in (wire.AUTHORIZATION, wire.SCOPE):
            raise GovernedMemoryError(Reason.BAD_IDENTITY if name == wire.AUTHORIZATION else Reason.BAD_ASSERTION)
        found[name] = value
    return found


def credentials(call: pb.Call) -> dict[str, str]:
    """A message's credentials as a unary call's metadata would name them (an empty field: none)."""
    found = {wire.AUTHORIZATION: call.authorization, wire.SCOPE: call.scope}
    return {name: value for name, value in found.items() if value}


def operation(name: str, allowed: frozenset[Operation]) -> Operation:
    try:
        operation = Operation(name)
    except ValueError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if operation not in allowed:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return operation
