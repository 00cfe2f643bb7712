"""Where the keys of memory content live: outside the memory database, one keyring a scope (R42).

Every entry is sealed under a key of its own (``store/entry_format.py``): its text and its embedding are stored in
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
from pathlib import Path
from urllib.parse import urlsplit

from kagent_memory_governed.keys.keyring import (
    FENCE,
    SETTING,
    Binding,
    EntryKey,
    Fence,
    Keyring,
    KeyStore,
    entry_keys,
    fence_of,
)
from kagent_memory_governed.keys.local import LocalKeyStore
from kagent_memory_governed.keys.openbao import OpenBaoKeyStore

_SCHEMES = ("file", "openbao+https", "openbao+http")


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


def from_url(url: str, *, token: str | None = None, ca_file: Path | None = None) -> KeyStore:
    """The key store ``url`` names (``check_url``'s forms), each parsing its own: ``LocalKeyStore.from_url`` for
    ``file://``, ``OpenBaoKeyStore.from_url`` with ``token`` (a token, or ``@/path`` to a file kept renewed) and
    ``ca_file`` for ``openbao+https://``. Refuses as ``check_url`` does (``ValueError`` naming the setting, never a
    value), and a token or CA as ``OpenBaoKeyStore.from_url`` does (``ConfigurationError`` with a ``code``)."""
    check_url(url)
    if urlsplit(url).scheme == "file":
        return LocalKeyStore.from_url(url)
    return OpenBaoKeyStore.from_url(url, token=token, ca_file=ca_file)


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
    "SETTING",
    "check_url",
    "from_url",
    "entry_keys",
    "fence_of",
]
