"""OpenBao (or HashiCorp Vault) KV version 2 as the key store: one secret a scope; an erasure destroys every
version of it that may hold an erased key, and is verified only when the server can give back none of them,
from any version it keeps (soft-deleted ones included: they can be undeleted); the server's barrier key is the
key-encryption key. An answer of the wrong shape, a missing mount or a token without a capability the store
uses is ``key_unavailable`` with a content-free cause, never an empty keyring.

KV v2 settings (``<mount>/config``, read by ``check``). Refused: ``cas_required=true`` (cause ``cas_required``:
a key is added by a patch without check-and-set, so every save would be refused); a path that is not a KV
version 2 mount is ``mount_missing``. Tolerated: any ``max_versions`` (a version the server prunes loses its
data and cannot be undeleted); any ``delete_version_after`` (a version it soft-deletes is, like one deleted by
hand, taken to hold every key it held: an erasure destroys it, and ``destroyed`` is false while one is kept;
once a scope's current version is soft-deleted its keys no longer read back, so its entries are lost, never
leaked); ``metadata_cas_required`` (the store writes no metadata). A scope secret's own metadata settings are
not checked: ``cas_required`` set on one secret refuses that scope's saves (``status_400``)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from kagent_memory_governed.errors import Cause, GovernedMemoryError, http_cause
from kagent_memory_governed.keys.http import Client, check_ca, check_token
from kagent_memory_governed.keys.keyring import (
    Binding,
    EntryKey,
    Fence,
    Keyring,
    b64,
    covered,
    entry_id,
    fenced,
    unavailable,
    unb64,
)

_BINDING = "binding"  # the secret that records the binding; scope secrets are named by UUID, never so
_PROBE = "00000000-0000-4000-8000-000000000000"  # a scope's name, for asking what the token may do there
# what the store does at each kind of path (``check`` asks the server whether the token may)
_NEEDS = {
    "data": ("create", "read", "update", "patch"),
    "metadata": ("read",),
    "destroy": ("update",),
    "config": ("read",),
    "binding": ("create", "read"),
}


class OpenBaoKeyStore:
    """Keyrings in an OpenBao (or HashiCorp Vault) KV version 2 mount: the secret ``<mount>/data/<scope id>`` has
    one field a key (the entry id, hex: its generation, key and token, base64url). A key is added with a JSON merge
    patch (the server serializes patches of one secret, so concurrent saves never lose one). An erasure writes the
    keyring without the erased keys (check-and-set on the version it read; a current version that is soft-deleted
    cannot be read, so it counts as holding them and the keyring written holds none of its keys) and then
    **destroys every earlier version** of the secret. ``destroyed`` asks the server's metadata for every version it
    keeps, the current one included, and is false while any of them holds a covered key or cannot be read. The
    server stores secrets sealed under its barrier key: that is the key-encryption key, rotated with
    ``bao operator rotate`` (``sys/rotate``) without rewriting any secret or entry. ``<mount>/data/binding``
    records the binding (``bind``, ``bound``).

    The token needs ``create``, ``read``, ``update`` and ``patch`` on ``<mount>/data/*``, ``read`` on
    ``<mount>/metadata/*`` and on ``<mount>/config``, ``update`` on ``<mount>/destroy/*``, and ``update`` on
    ``sys/capabilities-self`` (in OpenBao's ``default`` policy), where ``check`` asks for the rest. A missing one
    is refused as ``missing_<capability>_<kind>``, e.g. ``missing_update_destroy``; a token file (``@/path``) is
    read again when the server refuses the token, so an agent that renews it needs no restart."""

    def __init__(self, address: str, mount: str, token: str, *, ca_file: Path | None = None, pool: int = 8) -> None:
        self._mount = mount.strip("/")
        self._http = Client(address, token, ca_file=ca_file, pool=pool)

    @classmethod
    def from_url(cls, url: str, *, token: str | None, ca_file: Path | None = None) -> OpenBaoKeyStore:
        """The store at ``openbao+https://host[:port]/<mount>`` (``keys.check_url``), with ``token`` as set: a
        token, or ``@/path`` to a file an agent keeps renewed (read again when the server refuses the token). Refuses
        (``ConfigurationError`` naming the setting, with a ``code``, never a value) no token (``missing``), a token
        file that cannot be read or holds none (``token_unreadable``, ``token_empty``), a token no HTTP header can
        carry (``token_invalid``), and a CA bundle that cannot be read or holds no PEM certificate
        (``ca_unreadable``, ``ca_not_a_certificate``)."""
        parts = urlsplit(url)
        check_token(token or "")
        if ca_file is not None:
            check_ca(ca_file)
        address = f"{parts.scheme.removeprefix('openbao+')}://{parts.netloc}"
        return cls(address, parts.path, token or "", ca_file=ca_file)

    def _at(self, kind: str, name: uuid.UUID | str) -> str:
        return f"/v1/{quote(self._mount)}/{kind}/{name}"

    # what the server keeps

    async def _config(self) -> bool:
        """Confirm that the mount is KV version 2 (its config answers); whether it requires check-and-set. The one
        way to tell "no such secret" from "no such mount": a KV version 1 mount there answers 404 like a missing
        secret, an unmounted path 404 as well."""
        status, answer = await self._http.call("GET", f"/v1/{quote(self._mount)}/config")
        if status == 404:
            raise unavailable(Cause.MOUNT_MISSING)
        if status != 200:
            raise unavailable(http_cause("status_", status))
        data = _object(answer.get("data"))
        _count(data.get("max_versions"))
        if not isinstance(data.get("delete_version_after"), str):
            raise _bad()
        return _flag(data.get("cas_required"))

    async def _read(self, name: uuid.UUID | str, version: int | None = None) -> tuple[int, dict[str, Any] | None]:
        """A version of a secret (the current one by default): its number (0: no such secret, or that version's
        data is gone) and its fields; ``{}`` if destroyed, ``None`` if deleted and not destroyed (it can be
        undeleted, so it cannot be said to hold nothing)."""
        query = "" if version is None else f"?version={version}"
        status, answer = await self._http.call("GET", self._at("data", name) + query)
        if status == 200:
            data = _object(answer.get("data"))
            return _version(data.get("metadata")), _object(data.get("data"))
        if status != 404:
            raise unavailable(http_cause("status_", status))
        if answer.get("data") is None:  # no such secret or version here, unless there is no such mount
            await self._config()
            return 0, {}
        metadata = _object(_object(answer["data"]).get("metadata"))  # the secret is there; this version is deleted
        return _version(metadata), {} if _flag(metadata.get("destroyed")) else None

    async def _versions(self, scope: uuid.UUID) -> dict[int, bool]:
        """Every version of the scope's secret the server keeps (pruned ones it no longer does), and whether each
        is destroyed; none if there is no such secret (the mount confirmed)."""
        status, answer = await self._http.call("GET", self._at("metadata", scope))
        if status == 404:
            await self._config()
            return {}
        if status != 200:
            raise unavailable(http_cause("status_", status))
        versions = _object(_object(answer.get("data")).get("versions"))
        if not all(isinstance(v, str) and v.isascii() and v.isdigit() for v in versions):
            raise _bad()
        return {int(v): _flag(_object(state).get("destroyed")) for v, state in versions.items()}

    # the keyring

    async def fetch(self, scope: uuid.UUID) -> Keyring:
        return _keyring((await self._read(scope))[1] or {})  # soft-deleted: its keys no longer read back

    async def store(self, scope: uuid.UUID, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        fields = {entry.hex: b64(key.pack()) for entry, key in keys.items()}
        for _ in range(8):
            status, _answer = await self._http.call("PATCH", self._at("data", scope), {"data": fields}, merge=True)
            if status in (200, 204):
                return
            if status != 404:
                raise unavailable(http_cause("status_", status))
            # no secret yet, or its current version deleted: create a version, unless another writer just did
            version, _ = await self._read(scope)
            status, _answer = await self._http.call(
                "POST", self._at("data", scope), {"options": {"cas": version}, "data": fields}
            )
            if status in (200, 204):
                return
            if status != 400:  # 400: the check-and-set lost a race; patch what the other writer created
                raise unavailable(http_cause("status_", status))
        raise unavailable(Cause.CONTENDED)

    async def destroy(
        self,
        scope: uuid.UUID,
        *,
        entries: Collection[uuid.UUID] = (),
        before: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        for _ in range(8):
            version, fields = await self._read(scope)
            if not version and fence is None:
                return  # no secret: nothing to destroy (the mount confirmed)
            keyring = None if fields is None else _keyring(fields)
            fresh = version
            kept = fenced({e: k for e, k in (keyring or {}).items() if not covered(e, k, entries, before)}, fence)
            if keyring is None or kept != keyring:
                status, answer = await self._http.call(
                    "POST",
                    self._at("data", scope),
                    {"options": {"cas": version}, "data": {e.hex: b64(k.pack()) for e, k in kept.items()}},
                )
                if status == 400:
                    continue  # a key was added meanwhile: read again, keep it
                if status != 200:
                    raise unavailable(http_cause("status_", status))
                fresh = _version(answer.get("data"))
            await self._destroy_below(scope, fresh)
            return
        raise unavailable(Cause.CONTENDED)

    async def _destroy_below(self, scope: uuid.UUID, fresh: int) -> None:
        """Destroy every version older than ``fresh`` (the keyring without the covered keys), deleted or not; those
        written since derive from it, and a concurrent save's key is in them."""
        doomed = sorted(v for v, gone in (await self._versions(scope)).items() if v < fresh and not gone)
        if doomed:
            status, _ = await self._http.call("POST", self._at("destroy", scope), {"versions": doomed})
            if status not in (200, 204):
                raise unavailable(http_cause("status_", status))

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        # what the server can still give back (R45): every version it keeps, the current one included
        for version, gone in sorted((await self._versions(scope)).items()):
            if gone:
                continue
            fields = (await self._read(scope, version))[1]
            if fields is None or any(covered(e, k, entries, before) for e, k in _keyring(fields).items()):
                return False
        return True

    # the binding

    async def bound(self) -> Binding | None:
        version, fields = await self._read(_BINDING)
        if not version:
            return None  # never bound (the mount confirmed)
        if not fields:
            raise unavailable(Cause.BINDING_DELETED)  # once bound: a deleted binding is not "never bound"
        try:
            return Binding(uuid.UUID(hex=fields["key_store"]), uuid.UUID(hex=fields["database"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise _bad() from None

    async def bind(self, database: uuid.UUID) -> Binding:
        fresh = Binding(uuid.uuid4(), database)
        record = {"key_store": fresh.key_store.hex, "database": database.hex}
        for _ in range(3):
            body = {"options": {"cas": 0}, "data": record}  # check-and-set 0: only if none is recorded
            status, _ = await self._http.call("POST", self._at("data", _BINDING), body)
            if status in (200, 204):
                return fresh
            if status != 400:
                raise unavailable(http_cause("status_", status))
            recorded = await self.bound()  # 400: one is recorded already (perhaps ours, on a retried request)
            if recorded is not None:
                return recorded
        raise unavailable(Cause.CONTENDED)

    # the server

    async def check(self) -> None:
        await self._capabilities()
        if await self._config():
            raise unavailable(Cause.CAS_REQUIRED)

    async def _capabilities(self) -> None:
        """Refuse ``missing_<capability>_<kind>`` unless the token may do, at every kind of path the store uses,
        what the store does there (``sys/capabilities-self``)."""
        base = self._mount
        paths = {
            "data": f"{base}/data/{_PROBE}",
            "metadata": f"{base}/metadata/{_PROBE}",
            "destroy": f"{base}/destroy/{_PROBE}",
            "config": f"{base}/config",
            "binding": f"{base}/data/{_BINDING}",
        }
        try:
            status, answer = await self._http.call("POST", "/v1/sys/capabilities-self", {"paths": list(paths.values())})
        except GovernedMemoryError as refused:
            if refused.cause is Cause.PERMISSION_DENIED:
                raise unavailable(Cause.CAPABILITIES_DENIED) from None
            raise
        if status != 200:
            raise unavailable(http_cause("status_", status))
        granted = _object(answer.get("data"))
        for kind, path in paths.items():
            held = granted.get(path)
            if not isinstance(held, list) or not all(isinstance(c, str) for c in held):
                raise _bad()
            if "root" in held:
                continue
            for capability in _NEEDS[kind]:
                if capability not in held or "deny" in held:
                    raise unavailable(Cause(f"missing_{capability}_{kind}"))  # each a Cause (test_causes)

    async def close(self) -> None:
        await self._http.close()

    async def rotate(self) -> None:
        """Rotate the server's barrier key (``sys/rotate``; the token needs ``sudo`` there): secrets written from
        now on are sealed under the new key, earlier ones stay readable, nothing is rewritten."""
        status, _ = await self._http.call("POST", "/v1/sys/rotate", {})
        if status not in (200, 204):
            raise unavailable(http_cause("status_", status))


def _keyring(fields: dict[str, Any]) -> Keyring:
    """The keyring a version's fields hold; ``bad_response`` if one is not an entry id with its key."""
    try:
        return {entry_id(name): EntryKey.unpack(unb64(value)) for name, value in fields.items()}
    except (ValueError, TypeError, AttributeError):
        raise _bad() from None


def _object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad()
    return value


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad()
    return value


def _version(metadata: object) -> int:
    """The version number in a version's metadata: a whole number from 1."""
    number = _count(_object(metadata).get("version"))
    if not number:
        raise _bad()
    return number


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad()
    return value


def _bad() -> GovernedMemoryError:
    return unavailable(Cause.BAD_RESPONSE)
