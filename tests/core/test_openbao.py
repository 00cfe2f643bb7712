"""The OpenBao key store against what a real server does (issue #33): soft-deleted versions, a moved mount, a
token without a capability, mount settings, the binding; and against a hostile server on loopback that answers
200 with what OpenBao never sends (a key store we do not trust, not a mock of OpenBao)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
import urllib.error
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openbao import Served, api, mount_kv2, served
from support import facts

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import EntryKey, OpenBaoKeyStore
from kagent_memory_governed.keys.http import MAX_ANSWER
from kagent_memory_governed.keys.keyring import Binding, b64
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store


@pytest.fixture(scope="module")
def openbao() -> Iterator[Served]:
    """A real OpenBao server with a KV v2 mount, on loopback, for this module (``tests/openbao.py``)."""
    with served() as server:
        yield server


def _key(generation: int = 1) -> EntryKey:
    return EntryKey(os.urandom(32), os.urandom(16), generation)


async def _refused(call: Awaitable[object]) -> str | None:
    """The cause of the ``key_unavailable`` ``call`` raises, checked content-free and without a chained error."""
    with pytest.raises(GovernedMemoryError) as refused:
        await call
    error = refused.value
    assert (error.reason, str(error)) == (Reason.KEY_UNAVAILABLE, "key_unavailable")
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)  # no other traceback
    assert error.cause is None or (len(error.cause) <= 32 and error.cause.replace("_", "").isalpha())
    return error.cause


def _mount(bao: Served, **config: object) -> str:
    """A KV version 2 mount of its own (so a test may move, configure or bind it), with ``config`` set."""
    name = f"kmg-{secrets.token_hex(4)}"
    mount_kv2(bao.address, bao.token, name)
    if config:
        api(bao.address, bao.token, "POST", f"/v1/{name}/config", config)
    return name


def _versions(bao: Served, mount: str, scope: uuid.UUID) -> dict[str, dict[str, Any]]:
    metadata = api(bao.address, bao.token, "GET", f"/v1/{mount}/metadata/{scope}")
    versions: dict[str, dict[str, Any]] = metadata["data"]["versions"]
    return versions


# finding 1: a soft-deleted version (``bao kv delete``, or a mount's ``delete_version_after``) can be undeleted


async def test_a_soft_deleted_current_version_holding_a_key_is_not_destroyed(openbao: Served) -> None:
    """Before, the 404 of a deleted current version read as "no keys" and only older versions were checked."""
    keys = OpenBaoKeyStore(openbao.address, openbao.mount, openbao.token)
    scope, entry = uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {entry: _key()})  # version 1, the only one
    api(openbao.address, openbao.token, "DELETE", f"/v1/kmg/data/{scope}")  # ``bao kv delete``
    assert await keys.fetch(scope) == {}  # it no longer reads back...
    assert not await keys.destroyed(scope, entries=[entry])  # ...but it can be undeleted


async def test_an_erasure_destroys_a_soft_deleted_current_version_so_undelete_returns_no_erased_key(
    openbao: Served,
) -> None:
    """Before, ``destroy`` destroyed only versions older than the deleted current one, ``destroyed`` answered
    true, and ``undelete`` gave back every erased key."""
    keys = OpenBaoKeyStore(openbao.address, openbao.mount, openbao.token)
    scope, erased, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {erased: _key()})
    await keys.store(scope, {other: _key()})  # version 2 holds both
    api(openbao.address, openbao.token, "POST", f"/v1/kmg/delete/{scope}", {"versions": [2]})
    await keys.destroy(scope, entries=[erased])
    assert await keys.destroyed(scope, entries=[erased])
    versions = _versions(openbao, "kmg", scope)
    assert versions["1"]["destroyed"] and versions["2"]["destroyed"]  # the deleted current one too
    api(openbao.address, openbao.token, "POST", f"/v1/kmg/undelete/{scope}", {"versions": [1, 2]})
    assert erased not in await keys.fetch(scope)
    for version in (1, 2):
        with pytest.raises(urllib.error.HTTPError) as gone:
            api(openbao.address, openbao.token, "GET", f"/v1/kmg/data/{scope}?version={version}")
        assert gone.value.code == 404
    assert await keys.destroyed(scope, entries=[erased])
    # the deleted version could not be read: its other key is lost with it (an entry lost, never leaked)
    assert await keys.fetch(scope) == {}
    kept = {uuid.uuid4(): _key()}
    await keys.store(scope, kept)
    assert await keys.fetch(scope) == kept


async def test_an_erasure_over_a_mount_that_prunes_and_soft_deletes_versions_is_verified(
    openbao: Served,
) -> None:
    """Tolerated settings: ``max_versions`` prunes versions (their data is gone: nothing to undelete), and
    ``delete_version_after`` sets a deletion time on every version (readable until then)."""
    mount = _mount(openbao, max_versions=2, delete_version_after="1h")
    keys = OpenBaoKeyStore(openbao.address, mount, openbao.token)
    await keys.check()
    scope, entries = uuid.uuid4(), [uuid.uuid4() for _ in range(4)]
    for entry in entries:
        await keys.store(scope, {entry: _key()})
    assert set(_versions(openbao, mount, scope)) == {"3", "4"}  # 1 and 2 pruned
    api(openbao.address, openbao.token, "POST", f"/v1/{mount}/undelete/{scope}", {"versions": [1, 2]})
    assert not await keys.destroyed(scope, entries=entries[:1])  # still in versions 3 and 4
    await keys.destroy(scope, entries=entries[:1])
    assert await keys.destroyed(scope, entries=entries[:1])
    assert set(await keys.fetch(scope)) == set(entries[1:])


# finding 2: "no such secret" is not "no such mount"


async def test_a_moved_mount_is_mount_missing_never_an_empty_keyring_nor_a_verified_erasure(
    openbao: Served,
) -> None:
    """Before, the 404 of a path nothing is mounted at read as "no such secret": ``fetch`` answered an empty
    keyring and ``destroyed`` true while the keys sat at the new path."""
    mount = _mount(openbao)
    keys = OpenBaoKeyStore(openbao.address, mount, openbao.token)
    scope, entry = uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {entry: _key()})
    moved = api(openbao.address, openbao.token, "POST", "/v1/sys/remount", {"from": mount, "to": f"{mount}-moved"})
    deadline = time.monotonic() + 30
    while True:  # the server moves it in the background: ask until it says done
        status = api(openbao.address, openbao.token, "GET", f"/v1/sys/remount/status/{moved['migration_id']}")
        if status["data"]["migration_info"]["status"] == "success":
            break
        assert time.monotonic() < deadline
    assert await _refused(keys.fetch(scope)) == "mount_missing"
    assert await _refused(keys.destroy(scope, entries=[entry])) == "mount_missing"
    assert await _refused(keys.destroyed(scope, entries=[entry])) == "mount_missing"
    assert await _refused(keys.store(scope, {uuid.uuid4(): _key()})) == "mount_missing"
    assert await _refused(keys.check()) == "mount_missing"
    assert await _refused(keys.bound()) == "mount_missing"
    # a KV version 1 mount at the old path answers 404 for every secret, as KV version 2 does for a missing one
    api(openbao.address, openbao.token, "POST", f"/v1/sys/mounts/{mount}", {"type": "kv", "options": {"version": "1"}})
    assert await _refused(keys.fetch(scope)) == "mount_missing"
    assert await _refused(keys.destroyed(scope, entries=[entry])) == "mount_missing"
    assert entry.hex in api(openbao.address, openbao.token, "GET", f"/v1/{mount}-moved/data/{scope}")["data"]["data"]


# findings 9 and mount configuration: ``check`` refuses a token or a mount the store cannot erase with


_FULL = {
    "data/*": ["create", "read", "update", "patch"],
    "metadata/*": ["read"],
    "destroy/*": ["update"],
    "config": ["read"],
}


def _token(bao: Served, rules: dict[str, list[str]], *, default_policy: bool = True) -> str:
    name = f"kmg-{secrets.token_hex(4)}"
    policy = "\n".join(f'path "kmg/{path}" {{ capabilities = {list(caps)!r} }}' for path, caps in rules.items())
    api(bao.address, bao.token, "PUT", f"/v1/sys/policies/acl/{name}", {"policy": policy.replace("'", '"')})
    created = api(
        bao.address,
        bao.token,
        "POST",
        "/v1/auth/token/create",
        {"policies": [name], "no_default_policy": not default_policy},
    )
    token: str = created["auth"]["client_token"]
    return token


@pytest.mark.parametrize(
    ("rules", "cause"),
    [
        ({"data/*": ["read"], "metadata/*": ["read"], "config": ["read"]}, "missing_create_data"),  # read-only
        ({**_FULL, "destroy/*": []}, "missing_update_destroy"),
        ({k: v for k, v in _FULL.items() if k != "destroy/*"}, "missing_update_destroy"),
        ({**_FULL, "data/*": ["create", "read", "update"]}, "missing_patch_data"),
        ({**_FULL, "metadata/*": ["list"]}, "missing_read_metadata"),
        ({**_FULL, "config": ["deny"]}, "missing_read_config"),
        ({**_FULL, "data/binding": ["deny"]}, "missing_create_binding"),
    ],
    ids=["read_only", "destroy_empty", "no_destroy", "no_patch", "no_metadata", "no_config", "no_binding"],
)
async def test_check_refuses_a_token_that_cannot_do_what_the_store_does_naming_the_capability(
    openbao: Served, rules: dict[str, list[str]], cause: str
) -> None:
    """Before, ``check`` read the mount's config and passed for a read-only token, or one that cannot destroy."""
    token = _token(openbao, rules)
    assert await _refused(OpenBaoKeyStore(openbao.address, "kmg", token).check()) == cause
    assert token not in cause


async def test_check_passes_a_token_with_exactly_the_documented_policy_and_refuses_one_that_cannot_ask(
    openbao: Served,
) -> None:
    keys = OpenBaoKeyStore(openbao.address, "kmg", _token(openbao, _FULL))
    await keys.check()
    scope, entry = uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {entry: _key()})
    await keys.store(scope, {uuid.uuid4(): _key()})
    await keys.destroy(scope, entries=[entry])
    assert await keys.destroyed(scope, entries=[entry])
    unasked = OpenBaoKeyStore(openbao.address, "kmg", _token(openbao, _FULL, default_policy=False))
    assert await _refused(unasked.check()) == "capabilities_denied"  # ``sys/capabilities-self`` is in ``default``


async def test_check_refuses_a_mount_that_requires_check_and_set(openbao: Served) -> None:
    """A key is added by a patch without check-and-set: every save would be refused. Before, ``check`` passed."""
    keys = OpenBaoKeyStore(openbao.address, _mount(openbao, cas_required=True), openbao.token)
    assert await _refused(keys.check()) == "cas_required"
    await OpenBaoKeyStore(openbao.address, _mount(openbao, max_versions=1), openbao.token).check()


# finding 6 (the constructor): files that cannot be used are refused content-free


def test_a_token_or_ca_file_that_cannot_be_used_is_refused_content_free(tmp_path: Path) -> None:
    """Before, a CA file that is missing or holds no certificate raised ``FileNotFoundError`` or ``SSLError``
    (with its path and OpenSSL's text), and a token file that is not UTF-8 ``UnicodeDecodeError``."""
    (tmp_path / "token").write_bytes(b"\xff\xfe not text")
    (tmp_path / "ca.pem").write_text("not a certificate")

    def refused(**arguments: object) -> str | None:
        settings = {"address": "https://127.0.0.1:8200", "mount": "kmg", "token": "t"} | arguments
        with pytest.raises(GovernedMemoryError) as error:
            OpenBaoKeyStore(**settings)  # type: ignore[arg-type]
        assert error.value.__cause__ is None and (error.value.__context__ is None or error.value.__suppress_context__)
        assert str(tmp_path) not in repr(error.value) + str(error.value)
        return error.value.cause

    assert refused(token=f"@{tmp_path / 'missing'}") == "token_unreadable"
    assert refused(token=f"@{tmp_path / 'token'}") == "token_unreadable"
    assert refused(token="two\nlines") == "token_malformed"
    assert refused(ca_file=tmp_path / "missing.pem") == "ca_unreadable"
    assert refused(ca_file=tmp_path) == "ca_unreadable"
    assert refused(ca_file=tmp_path / "ca.pem") == "ca_not_a_certificate"


# the binding


async def test_a_key_store_records_the_first_binding_and_never_overwrites_it(openbao: Served) -> None:
    mount = _mount(openbao)
    keys = OpenBaoKeyStore(openbao.address, mount, openbao.token)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert await keys.bound() is None
    binding = await keys.bind(first)
    assert isinstance(binding, Binding) and binding.database == first
    assert await keys.bind(second) == binding  # the first writer's, whatever the database
    assert await OpenBaoKeyStore(openbao.address, mount, openbao.token).bound() == binding
    other = _mount(openbao)
    racing = [OpenBaoKeyStore(openbao.address, other, openbao.token).bind(uuid.uuid4()) for _ in range(8)]
    assert len(set(await asyncio.gather(*racing))) == 1  # one of them recorded; every one returns it
    # a deleted binding is not "never bound": neither read as absent nor written over
    api(openbao.address, openbao.token, "DELETE", f"/v1/{mount}/data/binding")
    assert await _refused(keys.bound()) == "binding_deleted"
    assert await _refused(keys.bind(second)) == "binding_deleted"


# finding 6 (answers): a key store that answers 200 with what OpenBao never sends


Respond = Callable[[str, str, bytes], bytes]
Hostile = Callable[[Respond], Awaitable[str]]  # serves ``respond`` on loopback: its address
_ENTRY, _SCOPE = uuid.uuid4(), uuid.uuid4()
_HELD = b64(_key().pack()).encode()


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    """A server on loopback that reads each request and writes the raw answer ``respond(method, path, body)``
    makes, then keeps the connection for the next request until the client hangs up (so an answer longer than
    it says it is, is never finished)."""
    servers: list[asyncio.Server] = []

    async def handle(respond: Respond, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                length = next(int(line[15:]) for line in lines if line.lower().startswith("content-length:"))
                writer.write(respond(method, path, await reader.readexactly(length)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(respond: Respond) -> str:
        server = await asyncio.start_server(lambda r, w: handle(respond, r, w), "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield serve
    for server in servers:
        server.close()


def _answer(body: bytes, *, status: int = 200, head: bytes | None = None) -> bytes:
    head = b"Content-Length: %d\r\n" % len(body) if head is None else head
    return b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n%s\r\n%s" % (status, head, body)


def _kind(method: str, path: str) -> str:
    """What a request asks for, as the hostile server's routes name it."""
    if path == "/v1/sys/capabilities-self":
        return "capabilities"
    part = path.split("/")[3]
    if part == "data":
        if path.endswith("/binding"):
            return "binding" if method == "GET" else "bind"
        return {"GET": "read", "POST": "write", "PATCH": "patch"}[method]
    return part  # config, metadata, destroy


def _plausible(method: str, path: str, body: bytes) -> bytes:
    """What OpenBao would answer (the store works against it); a test replaces one of these."""
    kind = _kind(method, path)
    if kind == "capabilities":
        return _answer(json.dumps({"data": {p: ["root"] for p in json.loads(body)["paths"]}}).encode())
    return {
        "config": _answer(b'{"data": {"cas_required": false, "delete_version_after": "0s", "max_versions": 0}}'),
        "read": _answer(b'{"data": {"data": {"%s": "%s"}, "metadata": {"version": 1}}}' % (_ENTRY.hex.encode(), _HELD)),
        "write": _answer(b'{"data": {"version": 2}}'),
        "bind": _answer(b'{"data": {"version": 1}}'),
        "patch": _answer(b'{"data": {"version": 2}}'),
        "metadata": _answer(b'{"data": {"versions": {"1": {"destroyed": false}}}}'),
        "destroy": _answer(b"", status=204),
        "binding": _answer(
            b'{"data": {"data": {"key_store": "%s", "database": "%s"}, "metadata": {"version": 1}}}'
            % (uuid.uuid4().hex.encode(), uuid.uuid4().hex.encode())
        ),
    }[kind]


_OPERATIONS: dict[str, Callable[[OpenBaoKeyStore], Awaitable[object]]] = {
    "fetch": lambda keys: keys.fetch(_SCOPE),
    "store": lambda keys: keys.store(_SCOPE, {uuid.uuid4(): _key()}),
    "destroy": lambda keys: keys.destroy(_SCOPE, entries=[_ENTRY]),
    "destroyed": lambda keys: keys.destroyed(_SCOPE, entries=[_ENTRY]),
    "check": lambda keys: keys.check(),
    "bound": lambda keys: keys.bound(),
    "bind": lambda keys: keys.bind(uuid.uuid4()),
}
_VERSION = b'{"data": {"data": {}, "metadata": {"version": %s}}}'
_HUGE = b"Content-Length: %d\r\n" % (1 << 30)


async def test_the_hostile_server_answers_as_openbao_would_unless_told_otherwise(hostile: Hostile) -> None:
    keys = OpenBaoKeyStore(await hostile(_plausible), "kmg", "token")
    for operation in _OPERATIONS.values():
        await operation(keys)


_FIELDS = b'{"data": {"data": %s, "metadata": {"version": 1}}}'
_ID = _ENTRY.hex.encode()
_BAD: dict[str, tuple[str, str, bytes]] = {  # what OpenBao never answers: the operation, the request, the answer
    "no_data": ("fetch", "read", _answer(b"{}")),
    "data_null": ("fetch", "read", _answer(b'{"data": null}')),
    "data_a_list": ("fetch", "read", _answer(b'{"data": []}')),
    "version_text": ("fetch", "read", _answer(_VERSION % b'"2"')),
    "version_true": ("fetch", "read", _answer(_VERSION % b"true")),
    "version_zero": ("fetch", "read", _answer(_VERSION % b"0")),
    "version_negative": ("fetch", "read", _answer(_VERSION % b"-1")),
    "fields_a_list": ("fetch", "read", _answer(_FIELDS % b"[]")),
    "field_not_an_id": ("fetch", "read", _answer(_FIELDS % b'{"not an id": "AAAA"}')),
    "key_a_number": ("fetch", "read", _answer(_FIELDS % b'{"%s": 5}' % _ID)),
    "key_not_base64": ("fetch", "read", _answer(_FIELDS % b'{"%s": "\\u00e9"}' % _ID)),
    "key_too_short": ("fetch", "read", _answer(_FIELDS % b'{"%s": "AAAA"}' % _ID)),
    "deleted_flag_text": (
        "fetch",
        "read",
        _answer(b'{"data": {"metadata": {"version": 1, "destroyed": "no"}}}', status=404),
    ),
    "not_an_object": ("fetch", "read", _answer(b"[1, 2]")),
    "not_utf8": ("fetch", "read", _answer(b"\xff\xfe\x00not json")),
    "nested": ("fetch", "read", _answer(b"[" * 5_000)),  # past the parser's depth (the recursion limit, 1,000)
    "too_large": ("fetch", "read", _answer(b"x" * (MAX_ANSWER + 1))),
    "too_large_unfinished": ("fetch", "read", _answer(b"x" * (MAX_ANSWER + 1), head=_HUGE)),
    "announced_too_large": ("fetch", "read", _answer(b"", head=_HUGE)),  # not one byte of it is read
    "chunked_too_large": (
        "fetch",
        "read",
        _answer(b"%x\r\n%s\r\n" % (MAX_ANSWER + 1, b"x" * (MAX_ANSWER + 1)), head=b"Transfer-Encoding: chunked\r\n"),
    ),
    "head_too_large": (
        "fetch",
        "read",
        _answer(b"{}", head=b"X-Padding: %s\r\nContent-Length: 2\r\n" % (b"x" * 20_000)),
    ),
    "patch_not_json": ("store", "patch", _answer(b"<html>not json</html>")),
    "write_no_version": ("destroy", "write", _answer(b'{"data": {}}')),
    "versions_a_list": ("destroyed", "metadata", _answer(b'{"data": {"versions": []}}')),
    "version_not_a_number": (
        "destroyed",
        "metadata",
        _answer(b'{"data": {"versions": {"one": {"destroyed": false}}}}'),
    ),
    "destroyed_text": ("destroyed", "metadata", _answer(b'{"data": {"versions": {"1": {"destroyed": "no"}}}}')),
    "version_a_list": ("destroyed", "metadata", _answer(b'{"data": {"versions": {"1": []}}}')),
    "metadata_null": ("destroyed", "metadata", _answer(b'{"data": null}')),
    "config_a_list": ("check", "config", _answer(b'{"data": []}')),
    "config_flag_text": (
        "check",
        "config",
        _answer(b'{"data": {"cas_required": "false", "delete_version_after": "0s", "max_versions": 0}}'),
    ),
    "capability_not_a_list": ("check", "capabilities", _answer(b'{"data": {"kmg/config": "root"}}')),
    "capabilities_a_list": ("check", "capabilities", _answer(b'{"data": []}')),
    "binding_not_text": ("bound", "binding", _answer(_FIELDS % b'{"key_store": 5, "database": "x"}')),
    "binding_not_uuids": ("bound", "binding", _answer(_FIELDS % b'{"key_store": "zz", "database": "zz"}')),
    "binding_half": ("bound", "binding", _answer(_FIELDS % b'{"key_store": "%s"}' % _ID)),
    "binding_null": ("bound", "binding", _answer(_FIELDS % b"null")),
}


@pytest.mark.parametrize("case", list(_BAD))
async def test_an_answer_of_the_wrong_shape_encoding_or_size_is_bad_response(hostile: Hostile, case: str) -> None:
    """Before, such answers raised ``TypeError``, ``KeyError`` or ``ValueError`` out of the store, read an
    unbounded body, or waited for one to finish."""
    operation, kind, answer = _BAD[case]

    def respond(method: str, path: str, body: bytes) -> bytes:
        return answer if _kind(method, path) == kind else _plausible(method, path, body)

    keys = OpenBaoKeyStore(await hostile(respond), "kmg", "token")
    started = time.monotonic()
    assert await _refused(_OPERATIONS[operation](keys)) == "bad_response"
    assert time.monotonic() - started < 5  # refused as it came, not after the exchange's timeout


# the erasure over it (store/erasure.py): verified only when the server can give back none of the keys


async def test_an_erasure_over_a_soft_deleted_keyring_is_verified_only_once_undelete_brings_nothing_back(
    openbao: Served, database_url: str, store: Store, key: ScopeKey
) -> None:
    """Before, ``forget_all`` answered verified while the deleted version, undeleted, gave back every key."""
    keys = OpenBaoKeyStore(openbao.address, openbao.mount, openbao.token)
    over = Store.connect(database_url, Policy(), keys=keys)
    try:
        generation = (await over.grant(key, purpose="assist", policy_version="v1")).generation
        written = await over.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        api(openbao.address, openbao.token, "DELETE", f"/v1/kmg/data/{key.scope_id}")  # ``bao kv delete``
        await over.forget_all(key)
        status = await over.status(key)
        assert status.last_erasure is not None
        assert (status.last_erasure.result, status.entries) == (Erasure.VERIFIED, 0)
        versions = [int(v) for v in _versions(openbao, "kmg", key.scope_id)]
        api(openbao.address, openbao.token, "POST", f"/v1/kmg/undelete/{key.scope_id}", {"versions": versions})
        assert not set(written) & set(await keys.fetch(key.scope_id))
        assert await keys.destroyed(key.scope_id, entries=written)
    finally:
        await over.close()
