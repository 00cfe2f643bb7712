"""The data plane's declaration (#35): the committed generated modules are the ``.proto``'s, from a grpcio-tools both
locks' protobuf and grpcio accept; every reason code has its status; the client's answers are the store's values
field for field; and the client loads nothing of the server or the store."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from kagent_memory_governed.errors import Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import values, wire
from kagent_memory_governed.store import values as store_values

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "kagent_memory_governed" / "service"
PROTO = (SERVICE / "data_plane.proto").read_text()
SCALARS = {
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT64: "int64",
}


def _declared() -> dict[str, set[tuple[str, int, str, str]]]:
    """Each message of the .proto text: (field, number, label, type)."""
    text = re.sub(r"//[^\n]*", "", PROTO)
    text = re.sub(r"^\s*oneof \w+ \{([^{}]*)\}", r"\1", text, flags=re.MULTILINE)  # a oneof's fields are its message's
    messages = {}
    for name, body in re.findall(r"^message (\w+) \{([^{}]*)\}", text, re.MULTILINE):
        fields = re.findall(r"^\s*(optional |repeated )?([\w.]+) (\w+) = (\d+);", body, re.MULTILINE)
        messages[name] = {(field, int(number), label.strip(), kind) for label, kind, field, number in fields}
    return messages


def _generated() -> dict[str, set[tuple[str, int, str, str]]]:
    messages = {}
    for name, message in pb.DESCRIPTOR.message_types_by_name.items():
        fields = set()
        for field in message.fields:
            kind = field.message_type.full_name if field.message_type else SCALARS[field.type]
            kind = kind.removeprefix(f"{pb.DESCRIPTOR.package}.")
            label = "repeated" if field.is_repeated else ""
            if field.has_presence and not field.message_type:
                label = "optional"
            fields.add((field.name, field.number, label, kind))
        messages[name] = fields
    return messages


def test_the_committed_descriptor_is_the_protos() -> None:
    package = re.search(r"^package ([\w.]+);", PROTO, re.M)
    assert package is not None
    assert pb.DESCRIPTOR.package == "governed_memory.v1" == package[1]
    assert _generated() == _declared()
    [service] = pb.DESCRIPTOR.services_by_name.values()
    methods = {
        (m.name, m.client_streaming, m.input_type.name, m.server_streaming, m.output_type.name) for m in service.methods
    }
    declared = re.findall(r"rpc (\w+)\((stream )?(\w+)\) returns \((stream )?(\w+)\);", PROTO)
    assert service.name == "DataPlane"
    assert methods == {(name, bool(up), ask, bool(down), reply) for name, up, ask, down, reply in declared}
    assert ("Exchange", True, "Call", True, "Answer") in methods


def test_no_request_names_a_principal_a_room_or_an_agent() -> None:
    named = {field for name, fields in _declared().items() if name.endswith("Request") for field, *_ in fields}
    assert not {field for field in named if re.search(r"principal|user|room|agent|scope|generation|gen$", field)}


def test_the_policy_answer_is_the_policy_field_for_field() -> None:
    assert [field.name for field in pb.PolicyReply.DESCRIPTOR.fields] == list(Policy.model_fields)


def _pinned(lock: Path, name: str) -> tuple[int, ...]:
    [version] = re.findall(rf"^{name}==([\d.]+)$", lock.read_text(), re.MULTILINE)
    return tuple(int(part) for part in version.split("."))


@pytest.mark.parametrize("lock", sorted((ROOT / "locks").glob("kagent-adk-*.txt")), ids=lambda path: path.stem)
def test_the_generated_code_runs_on_the_protobuf_and_grpcio_of_every_lock(lock: Path) -> None:
    gencode = re.search(r"^# Protobuf Python Version: ([\d.]+)$", (SERVICE / "data_plane_pb2.py").read_text(), re.M)
    generated = re.search(
        r"^GRPC_GENERATED_VERSION = '([\d.]+)'$", (SERVICE / "data_plane_pb2_grpc.py").read_text(), re.M
    )
    assert gencode and generated
    protobuf = _pinned(lock, "protobuf")
    gencode_version = tuple(int(part) for part in gencode[1].split("."))
    assert protobuf[0] == gencode_version[0] and protobuf >= gencode_version  # protobuf runs older gencode of its major
    assert _pinned(lock, "grpcio") >= tuple(int(part) for part in generated[1].split("."))


def test_the_clients_token_bound_is_the_verifiers() -> None:
    from kagent_memory_governed.assertion import MAX_TOKEN_BYTES

    assert wire.MAX_TOKEN_CHARS == MAX_TOKEN_BYTES


def test_every_reason_code_travels_with_its_status_and_nothing_else_is_one() -> None:
    assert set(wire.STATUS) == set(Reason)
    assert grpc.StatusCode.OK not in wire.STATUS.values() and grpc.StatusCode.UNKNOWN not in wire.STATUS.values()
    assert wire.reason_of(grpc.StatusCode.FAILED_PRECONDITION, "consent_stale") is Reason.CONSENT_STALE
    assert wire.reason_of(grpc.StatusCode.INTERNAL, "consent_stale") is None  # a code with another status
    assert wire.reason_of(grpc.StatusCode.FAILED_PRECONDITION, "consent_stale ") is None
    assert wire.reason_of(grpc.StatusCode.UNAVAILABLE, None) is None


@pytest.mark.parametrize("name", ["Hit", "Turn"])
def test_the_client_answers_the_stores_own_values(name: str) -> None:
    assert getattr(values, name) is getattr(store_values, name)  # one class: a search answers the same either way


def test_the_client_imports_nothing_of_the_server_or_the_store() -> None:
    tree = ast.parse((SERVICE / "remote.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {
        name for name in imported if name and re.match(r"kagent_memory_governed\.(store|keys|service\.server)", name)
    }


_LOADED = """
import importlib.util, sys, types
root = types.ModuleType("kagent_memory_governed")  # its package __init__ bypassed: {bypass}
root.__path__ = [{package!r}]
if {bypass}:
    sys.modules["kagent_memory_governed"] = root
import kagent_memory_governed.service.remote
print(" ".join(sorted(name for name in sys.modules)))
"""


def _loaded(bypass: bool) -> set[str]:
    code = _LOADED.format(bypass=bypass, package=str(ROOT / "kagent_memory_governed"))
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(answer.stdout.split())


HEAVY = re.compile(
    r"(sqlalchemy|asyncpg|alembic|kagent_memory_governed\.(store|keys|migrations|service\.server))(\.|$)"
)


def test_loading_the_client_loads_no_database_code() -> None:
    assert not {name for name in _loaded(bypass=True) if HEAVY.match(name)}


def test_importing_the_client_through_the_package_loads_no_database_code() -> None:
    assert not {name for name in _loaded(bypass=False) if HEAVY.match(name)}


def test_an_embedding_read_off_the_wire_is_the_message_s_own_single_precision_values() -> None:
    """``messages.embedding`` reads a ``Vector``'s packed floats without a list in between: the same values as the
    list, NaN and infinities kept for the policy to refuse, and an empty list for an empty message."""
    import numpy

    from kagent_memory_governed.service import messages

    rng = numpy.random.default_rng(5)
    for values_ in ([*rng.standard_normal(768)], [float("nan"), float("inf"), -0.0, 3.4e38] * 192, [1.0]):
        read = messages.embedding(pb.Vector(values=values_))
        expected = numpy.asarray(values_, dtype=numpy.float32)
        assert isinstance(read, numpy.ndarray) and read.dtype == numpy.float32
        assert read.tobytes() == expected.tobytes()
    assert messages.embedding(pb.Vector()) == []
    unpacked = pb.Vector()
    unpacked.ParseFromString(b"".join(b"\x0d" + numpy.float32(v).tobytes() for v in (1.5, -2.0)))  # one tag a float
    read = messages.embedding(unpacked)
    assert isinstance(read, numpy.ndarray)
    assert read.tolist() == [1.5, -2.0]  # a sender's unpacked floats: re-encoded packed


def test_a_timestamp_on_the_wire_is_the_one_protobuf_would_write() -> None:
    from datetime import UTC, datetime, timedelta

    from google.protobuf.timestamp_pb2 import Timestamp

    from kagent_memory_governed.service import messages

    start = datetime(1971, 1, 1, tzinfo=UTC)
    for step in range(0, 2_000_000_000, 9_876_543):
        moment = start + timedelta(seconds=step, microseconds=step % 1_000_000)
        for given in (moment, moment.replace(tzinfo=None)):  # a naive time is taken as UTC, as FromDatetime does
            expected = Timestamp()
            expected.FromDatetime(given)
            assert messages.timestamp(given) == expected
