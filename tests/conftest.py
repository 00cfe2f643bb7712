"""A real PostgreSQL with pgvector for every store test.

``KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL`` (a ``postgresql+asyncpg://`` URL) points the suite at an
existing database, such as kagent's own; its ``governed_memory`` tables are truncated between tests.
Unset: one embedded PostgreSQL 18 + pgvector server per test session.
"""

from __future__ import annotations

import os

# kagent-adk reads these when it builds an app; the runtime tests never reach a controller.
os.environ.setdefault("KAGENT_URL", "http://controller.invalid")
os.environ.setdefault("KAGENT_NAMESPACE", "kagent")
os.environ.setdefault("KAGENT_NAME", "helper")
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from support import make_key, private_directory

from kagent_memory_governed.embedded import start
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge, CountingEmbedder


@pytest.fixture(scope="session")
def database_url() -> str:
    return os.environ.get("KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL") or start(private_directory("pg") / "pg")


@pytest.fixture(scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    governed = Store.connect(database_url, Policy(), pool_size=10, max_overflow=20)
    await governed.migrate()
    yield governed
    await governed.close()


@pytest.fixture(scope="session")
def bridge():
    return Bridge()


@pytest.fixture(scope="session")
def embedder():
    return CountingEmbedder()


@pytest.fixture(scope="session")
def runtime(store: Store, bridge, embedder):
    """Governed memory installed into this test process, once: kagent-adk's own classes are replaced."""
    from kagent_memory_governed import install
    from kagent_memory_governed.settings import Settings

    settings = Settings(bridge_public_key=bridge.public_pem, bridge_issuer=ISSUER, homeserver=HOMESERVER)
    return install(settings=settings, store=store, embedder=embedder)


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch):
    """A recording stand-in for kagent's controller, used by every app built with ``local=False``."""
    import types

    import httpx
    import kagent.adk._a2a as a2a
    from controller import FakeController

    fake = FakeController()
    real = httpx.AsyncClient

    def client(**kwargs):
        return real(transport=httpx.MockTransport(fake), **kwargs)

    monkeypatch.setattr(a2a, "httpx", types.SimpleNamespace(AsyncClient=client))
    return fake


@pytest.fixture(scope="session")
def metric_reader():
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


@pytest.fixture(scope="session")
def span_exporter():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture
async def sql(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection for checking what is really in the database."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    yield conn
    await conn.close()


@pytest.fixture(autouse=True)
async def _clean_tables(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    yield
    if "database_url" in request.fixturenames:
        conn = await asyncpg.connect(
            request.getfixturevalue("database_url").replace("postgresql+asyncpg://", "postgresql://")
        )
        await conn.execute(
            "TRUNCATE governed_memory.entries, governed_memory.ledger, governed_memory.scopes, governed_memory.replays,"
            " governed_memory.buckets, governed_memory.usage, governed_memory.turns"
        )
        await conn.close()


@pytest.fixture
def key() -> ScopeKey:
    return make_key()


@pytest.fixture
def new_key() -> Callable[..., ScopeKey]:
    return make_key
