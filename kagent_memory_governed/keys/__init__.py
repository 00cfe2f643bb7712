"""Where the keys of memory content live: outside the memory database, one keyring a scope (R42).

Every entry is sealed under a key of its own (``store/sealing.py``): its text and its embedding are stored in
PostgreSQL only as authenticated ciphertext. The entry's key lives here, in the scope's keyring, never in the
memory database nor in its WAL, replicas, dumps or backups. Erasing destroys keys: one entry's for ``forget``,
every key written before the erasure's fence for ``forget-all``, ``off`` and ``offboard``, an expired entry's
for ``sweep``. A copy of the database taken at any time is then ciphertext without a key.

    KeyStore                   what the store needs from a key store (a Protocol)
     ├── LocalKeyStore          the embedded default: a directory beside the embedded database, for local runs
     │                          and tests; keyrings sealed under a local key-encryption key that ``rotate`` replaces
     └── OpenBaoKeyStore        OpenBao (or HashiCorp Vault) KV version 2: one secret a scope, older versions
                                destroyed by every erasure; the server's barrier key is the key-encryption key

A keyring also records the scope's last erasure (``Fence``: its generation, and whether consent stands
withdrawn), so a database that comes back from before it is recognized and brought forward (``store/reconcile.py``).

A keyring slot also holds the fact's digest (``EntryKey.token``), so that a fact equal to a live entry is
recognized without any fact-derived value in the memory database. A lost key store is a loss of memory, never a
leak: without it, nothing in the database can be read back.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.keys.keyring import FENCE, Binding, EntryKey, Fence, Keyring, KeyStore, entry_keys, fence_of
from kagent_memory_governed.keys.local import LocalKeyStore
from kagent_memory_governed.keys.openbao import OpenBaoKeyStore

if TYPE_CHECKING:
    from kagent_memory_governed.settings import Settings

_SCHEMES = ("file", "openbao+https", "openbao+http")
SETTING = "KAGENT_GOVERNED_MEMORY_KEY_STORE"
_TOKEN = re.compile(r"[\x21-\x7e]+")


def check_url(url: str) -> None:
    """Refuse a key store URL this package cannot use, naming the setting, never the value:
    ``file:///absolute/path`` or ``openbao+https://host[:port]/<kv v2 mount>`` (``openbao+http`` to a loopback
    address only)."""
    name = SETTING
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"{name}: not file:// or openbao+https://")
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/") or parts.query:
            raise ValueError(f"{name}: file:// needs an absolute path")
        return
    if not parts.hostname or not parts.path.strip("/") or parts.query or parts.username or parts.password:
        raise ValueError(f"{name}: openbao+https://host[:port]/<mount> without credentials or query")
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise ValueError(f"{name}: the port is not a number") from None
    if parts.scheme == "openbao+http" and not _loopback(parts.hostname):
        raise ValueError(f"{name}: plain http only to a loopback address; use openbao+https")


def configured(settings: Settings) -> KeyStore:
    """The key store the settings name (``KAGENT_GOVERNED_MEMORY_KEY_STORE``). Unset, the embedded default beside
    the embedded database (``<data dir>/keys``): only with the embedded database (never beside one named by
    ``KAGENT_GOVERNED_MEMORY_DATABASE_URL``), and inside a Kubernetes pod only with
    ``KAGENT_GOVERNED_MEMORY_EMBEDDED=true``. Refuses, with a ``ConfigurationError`` naming the setting and a
    ``code``, never a value: a ``file://`` store inside a database's data directory (``inside_database``), an
    OpenBao store without a token (``missing``), a token file that cannot be read or holds no token
    (``token_unreadable``, ``token_empty``), a token that no HTTP header can carry (``token_invalid``), and a CA
    bundle that cannot be read or holds no PEM certificate (``ca_unreadable``, ``ca_not_a_certificate``)."""
    from kagent_memory_governed.settings import refuse_embedded_in_pod

    url = settings.key_store
    if not url:
        if settings.database_url is not None:  # an operator's database: its keys go where the operator says
            raise ConfigurationError(
                f"{SETTING} is not set: the embedded key store serves the embedded database only; beside"
                " KAGENT_GOVERNED_MEMORY_DATABASE_URL set file:///path explicitly for a local key store, or an"
                " OpenBao URL (openbao+https://host:8200/<mount>)",
                code="missing",
            )
        refuse_embedded_in_pod(settings, SETTING, "the embedded key store")
        return LocalKeyStore(settings.data_dir / "keys")
    parts = urlsplit(url)
    if parts.scheme == "file":
        root = Path(parts.path)
        _outside_databases(root, settings)
        return LocalKeyStore(root)
    token = _checked_token(settings)
    if settings.key_store_ca is not None:
        _check_ca(settings.key_store_ca)
    address = f"{parts.scheme.removeprefix('openbao+')}://{parts.netloc}"
    return OpenBaoKeyStore(address, parts.path, token, ca_file=settings.key_store_ca)


def _checked_token(settings: Settings) -> str:
    """The token setting as given (``@/path`` stays a path: the store reads it again when the server refuses the
    token), once its token is readable and fit for a header."""
    name = f"{SETTING}_TOKEN"
    setting = settings.key_store_token.get_secret_value() if settings.key_store_token else ""
    if not setting:
        raise ConfigurationError(f"governed memory needs {name}", code="missing")
    token = setting
    if setting.startswith("@"):
        try:
            token = Path(setting[1:]).read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise ConfigurationError(f"{name}: the token file is not readable", code="token_unreadable") from None
        if not token:
            raise ConfigurationError(f"{name}: the token file holds no token", code="token_empty")
    if not _TOKEN.fullmatch(token):  # a newline or a space would break (or split) the request's header
        raise ConfigurationError(f"{name}: not a token (visible ASCII, no spaces)", code="token_invalid")
    return setting


def _check_ca(path: Path) -> None:
    name = f"{SETTING}_CA"
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ConfigurationError(f"{name}: not a readable file", code="ca_unreadable")
    try:
        ssl.create_default_context(cafile=str(path))  # as the store loads it
    except (ssl.SSLError, ValueError):  # before OSError: SSLError is one
        raise ConfigurationError(f"{name}: holds no PEM certificate", code="ca_not_a_certificate") from None
    except OSError:
        raise ConfigurationError(f"{name}: not a readable file", code="ca_unreadable") from None


def _outside_databases(root: Path, settings: Settings) -> None:
    """Refuse a ``file://`` key store inside a database's data directory: every base backup would carry the keys."""
    from kagent_memory_governed.embedded import data_directory

    directories = [data_directory(settings)]
    if settings.database_url is not None:  # a local server's socket directory is often its data directory
        directories += _socket_data_directories(settings.database_url.get_secret_value())
    where = root.resolve()
    for directory in directories:
        if where.is_relative_to(directory.resolve()):
            raise ConfigurationError(
                f"{SETTING}: inside a database's data directory, whose every base backup would carry the keys",
                code="inside_database",
            )


def _socket_data_directories(url: str) -> list[Path]:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        hosts = make_url(url).query.get("host", ())
    except ArgumentError:
        return []
    found = [Path(host) for host in ([hosts] if isinstance(hosts, str) else hosts) if host.startswith("/")]
    return [directory for directory in found if (directory / "PG_VERSION").is_file()]  # initdb writes it


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = [
    "FENCE",
    "Binding",
    "EntryKey",
    "Fence",
    "KeyStore",
    "Keyring",
    "LocalKeyStore",
    "OpenBaoKeyStore",
    "check_url",
    "configured",
    "entry_keys",
    "fence_of",
]
