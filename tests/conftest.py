"""A real PostgreSQL with pgvector for every store test.

``KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL`` (a ``postgresql+asyncpg://`` URL) points the suite at an
existing database, such as kagent's own; its ``governed_memory`` tables are truncated between tests.
Unset: one embedded PostgreSQL 18 + pgvector server per test session.
"""

from __future__ import annotations

import asyncio
import os

# kagent-adk reads these when it builds an app; the runtime tests never reach a controller.
os.environ.setdefault("KAGENT_URL", "http://controller.invalid")
os.environ.setdefault("KAGENT_NAMESPACE", "kagent")
os.environ.setdefault("KAGENT_NAME", "helper")
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg
import freezegun
import pytest
from service import REMOTE
from support import KEY_STORE, bound_to, make_key, private_directory

if TYPE_CHECKING:
    from cluster import Cluster, Key
    from controller import FakeController
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from service import Service

    from kagent_memory_governed.adk.runtime import Runtime
    from kagent_memory_governed.testing import CountingEmbedder

# Each test process (each xdist worker) keeps its entry keys apart, never in the user's data directory: two
# processes erasing scopes of the same name in their own databases must not destroy each other's keys. In this
# process the fixtures hand it down (``governed_key_store``); the processes a test starts (the CLI, ``serve``) read
# it from their environment, as an operator sets it. Set, not defaulted: a worker inherits the environment of the
# process that started it, this setting included.
os.environ[KEY_STORE] = f"file://{private_directory('keys')}"

from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge, CountingEmbedder
from kagent_memory_governed.testing.plugin import empty_tables

# pytest's own clock (``--durations``, the report's times) stays real under a frozen clock: freezegun replaces the
# time functions of every loaded module but those it ignores, and tests freeze time as they are collected
freezegun.configure(extend_ignore_list=["_pytest.timing"])

KEYS = Path(urlsplit(os.environ[KEY_STORE]).path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules holding a long test first, each whole and in its own order (a module's fixtures are set up once
    a worker): under ``--dist worksteal`` (./dev) the worker left alone at the end runs a short test, not a chaos
    run, while the other waits."""
    long = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long)


# The suite stands on the package's own pytest plugin (kagent_memory_governed.testing.plugin).


@pytest.fixture(scope="session")
def governed_key_store() -> LocalKeyStore:
    """The session store's key store (the plugin's fixture, overridden): this process's own."""
    return LocalKeyStore(KEYS)


@pytest.fixture(scope="session")
def key_store(governed_key_store: LocalKeyStore) -> LocalKeyStore:
    """For a test's own ``Store`` over ``database_url``: the key store bound to that database."""
    return governed_key_store


@pytest.fixture(scope="session")
def database_url(governed_database_url: str) -> str:
    bound_to(governed_database_url, KEYS)  # the session store's keys
    return governed_database_url


@pytest.fixture(scope="session")
def store(governed_store: Store) -> Store:
    return governed_store


@pytest.fixture
def bridge(governed_private_key: Ed25519PrivateKey) -> Bridge:
    """The bridge double signs with the key the installed runtime trusts, and can sign anything else too. In remote
    mode each test has a control room of its own: the service keeps what it read of a scope a while, which a test's
    emptied tables would leave behind (a database gone back in time, to the service)."""
    if REMOTE:
        import uuid

        from kagent_memory_governed.testing.bridge import HOMESERVER

        return Bridge(private_key=governed_private_key, room=f"!room{uuid.uuid4().hex[:12]}:{HOMESERVER}")
    return Bridge(private_key=governed_private_key)


@pytest.fixture(scope="session")
def embedder(governed_embedder: CountingEmbedder) -> CountingEmbedder:
    return governed_embedder


@pytest.fixture(scope="session")
def runtime(request: pytest.FixtureRequest, governed_store: Store) -> Runtime:
    """Governed memory installed into this test process, once: kagent-adk's own classes are replaced. Its store is
    in-process, or, with ``KAGENT_GOVERNED_MEMORY_TEST_SERVICE=on`` (remote mode), the memory service as a process
    of its own (``memory_service``), reached as an agent pod reaches it. Either way over the session's database,
    named here so that every test using the runtime has its tables emptied after it (``_clean_tables``)."""
    if not REMOTE:
        runtime: Runtime = request.getfixturevalue("governed_runtime")
        return runtime
    from kagent_memory_governed import install
    from kagent_memory_governed.settings import Settings
    from kagent_memory_governed.testing.bridge import HOMESERVER

    service, token = request.getfixturevalue("memory_service"), request.getfixturevalue("pod_token")
    signer = request.getfixturevalue("governed_signer")
    settings = Settings(
        bridge_public_key=signer.public_pem,
        bridge_issuer=signer.issuer,
        homeserver=HOMESERVER,
        service_url=service.data,
        service_token=token,
        key_store=None,  # what this process's own tests use (KEY_STORE above); never the runtime's
    )
    installed = install(settings=settings, embedder=request.getfixturevalue("governed_embedder"))
    assert installed.remote, "remote mode asked for, and the runtime holds a store of its own"
    return installed


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Key]]:
    """An API server's keys and issuer discovery (``cluster.py``), for the service's workload identity."""
    from cluster import rsa_key, serving

    key = rsa_key()
    with serving(tmp_path_factory.mktemp("cluster")) as state:
        state.keys = [key]
        yield state, key


@pytest.fixture(scope="session")
async def service_embeds_with_the_suites_embedder(governed_embedder: CountingEmbedder) -> AsyncIterator[None]:
    """Through the service, the service embeds, calling the provider on loopback in this process
    (``testing.embedding_server``): its answers are the suite's ``CountingEmbedder``'s, run on this session's loop, so
    a test counts, gates and fails the service's embeddings as it does the runtime's in process."""
    from kagent_memory_governed.testing.embedder import embedding_server

    loop, server = asyncio.get_running_loop(), embedding_server()

    def batch(texts: list[str]) -> list[list[float]]:
        if loop.is_running():  # an async test awaits the service: its loop runs the embedder (a gate may hold it)
            return asyncio.run_coroutine_threadsafe(governed_embedder(texts), loop).result(60)
        return asyncio.run(governed_embedder(texts))  # a synchronous test holds this thread: a loop of its own

    server.batch = batch
    yield
    server.batch = None


@pytest.fixture(scope="session")
def memory_service(
    tmp_path_factory: pytest.TempPathFactory,
    database_url: str,
    governed_private_key: Ed25519PrivateKey,
    kube: tuple[Cluster, Key],
    store: Store,
    service_embeds_with_the_suites_embedder: None,
) -> Iterator[Service]:
    """``kagent-memory-governed serve`` over the suite's database and key store, for the session (remote mode)."""
    from service import running

    with running(
        tmp_path_factory.mktemp("service"), Bridge(private_key=governed_private_key), database_url, kube[0]
    ) as s:
        yield s


@pytest.fixture(scope="session")
def pod_token(tmp_path_factory: pytest.TempPathFactory, kube: tuple[Cluster, Key]) -> Iterator[Path]:
    """This process's projected token as the agent ``kagent/helper``, rotated while the session runs."""
    from service import rotated

    with rotated(tmp_path_factory.mktemp("pod") / "token", kube[1]) as path:
        yield path


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch) -> FakeController:
    """A recording stand-in for kagent's controller, used by every app built with ``local=False``."""
    import types

    import httpx
    import kagent.adk._a2a as a2a
    from controller import FakeController

    fake = FakeController()
    real = httpx.AsyncClient

    def client(**kwargs: Any) -> httpx.AsyncClient:
        return real(transport=httpx.MockTransport(fake), **kwargs)

    monkeypatch.setattr(a2a, "httpx", types.SimpleNamespace(AsyncClient=client))
    return fake


@pytest.fixture(scope="session")
def metric_reader() -> InMemoryMetricReader:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


@pytest.fixture(scope="session")
def span_exporter() -> InMemorySpanExporter:
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
    if "governed_database_url" in request.fixturenames:  # the test touched the database, and so its key store
        await empty_tables(request.getfixturevalue("governed_database_url"), LocalKeyStore(KEYS))
        if "governed_store" in request.fixturenames:  # what it keeps of those keyrings goes with them
            request.getfixturevalue("governed_store").drop_kept_keyrings()


@pytest.fixture
def key() -> ScopeKey:
    return make_key()


@pytest.fixture
def new_key() -> Callable[..., ScopeKey]:
    return make_key
