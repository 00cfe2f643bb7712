"""pytest fixtures for agents with governed memory (entry point ``governed_memory`` in ``pytest11``).

Nothing happens unless a test asks for a fixture: importing this module imports nothing heavy and no
fixture is autouse. Every fixture follows the application clock, so ``freeze_time(..., real_asyncio=True)``
governs expiry, rate limits and token lifetimes alike.

- ``governed_database_url``: ``KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL``, or an embedded PostgreSQL 18
  with pgvector in a private directory for the session;
- ``governed_key_store``: the key store bound to it (session; override it to choose one);
- ``governed_store``: the ``Store`` over both, migrated (session);
- ``governed_private_key`` and ``governed_signer``: a fresh bridge key and a ``ScopeSigner`` with it;
- ``governed_embedder``: the deterministic offline embedder, counting calls; ``governed_model``: a
  ``ScriptedModel`` per test;
- ``governed_runtime``: governed memory installed in this process, trusting ``governed_signer``;
- ``governed_agent_config``: the Agent's kagent config (a dict); override it with your agent's;
- ``governed_agent``: upstream's real ``KAgentApp`` for that config, served over ASGI, with a control
  client for a fresh subject in a fresh room; the store's tables are emptied after the test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import httpx
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kagent_memory_governed.adk.runtime import Runtime
    from kagent_memory_governed.bridge import AsyncControlClient, ScopeSigner
    from kagent_memory_governed.keys import KeyStore
    from kagent_memory_governed.store import Store
    from kagent_memory_governed.testing import CountingEmbedder, ScriptedModel

_DATABASE = "KAGENT_GOVERNED_MEMORY_TEST_DATABASE_URL"
_TABLES = ("entries", "ledger", "turns", "scopes", "replays", "buckets", "usage")


@pytest.fixture(scope="session")
def governed_database_url() -> Iterator[str]:
    configured = os.environ.get(_DATABASE)
    if configured:
        yield configured
        return
    import shutil
    import tempfile
    from pathlib import Path

    from kagent_memory_governed.embedded import start

    # outside pytest's own temporary tree, which another pytest session of this user may clean up
    directory = Path(tempfile.mkdtemp(prefix="kagent-memory-governed-pg-"))
    try:
        yield start(directory / "pg")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def governed_key_store() -> Iterator[KeyStore]:
    """The key store of ``governed_store``: a key store serves the one database it is bound to, so the one the
    settings name (``KAGENT_GOVERNED_MEMORY_KEY_STORE``) beside a database the environment names, and for the
    session's throw-away embedded database a throw-away one beside it (never the user's, bound to another
    database). A suite overrides this fixture to choose its own."""
    import shutil
    import tempfile
    from pathlib import Path

    from kagent_memory_governed.keys import LocalKeyStore

    if os.environ.get("KAGENT_GOVERNED_MEMORY_KEY_STORE") or os.environ.get(_DATABASE):
        from kagent_memory_governed.embedded import key_store
        from kagent_memory_governed.settings import Settings

        yield key_store(Settings.load())
        return
    throwaway = Path(tempfile.mkdtemp(prefix="kagent-memory-governed-keys-"))
    try:
        yield LocalKeyStore(throwaway)
    finally:
        shutil.rmtree(throwaway, ignore_errors=True)


@pytest.fixture(scope="session")
async def governed_store(governed_database_url: str, governed_key_store: KeyStore) -> AsyncIterator[Store]:
    from kagent_memory_governed.policy import Policy
    from kagent_memory_governed.store import Store

    store = Store.connect(governed_database_url, Policy(), keys=governed_key_store, pool_size=10, max_overflow=20)
    try:
        await store.migrate()
        yield store
    finally:
        await store.close()


async def empty_tables(database_url: str, keys: KeyStore | None = None) -> None:
    """Remove every row of the governed store's tables and, for a local key store (``keys``), every scope's keyring
    with them (between tests; never in production). Emptied alone, the tables would be a database gone back in
    time behind the key store's record of each scope's last erasure, which the store brings forward: a scope a
    later test reuses would start disabled. An OpenBao key store is left as it is: use fresh scopes with one."""
    import shutil

    import asyncpg

    from kagent_memory_governed.keys import LocalKeyStore
    from kagent_memory_governed.schema import SCHEMA

    if isinstance(keys, LocalKeyStore):
        shutil.rmtree(keys.root / "scopes", ignore_errors=True)  # its layout: ``scopes/<scope id>``

    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f"TRUNCATE {', '.join(f'{SCHEMA}.{table}' for table in _TABLES)}")
    except asyncpg.InvalidSchemaNameError:  # never migrated (a test that asked for the URL only): nothing to empty
        pass
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def governed_private_key() -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="session")
def governed_signer(governed_private_key: Ed25519PrivateKey) -> ScopeSigner:
    from kagent_memory_governed.bridge import ScopeSigner
    from kagent_memory_governed.testing.bridge import AGENT, ISSUER

    return ScopeSigner(governed_private_key, ISSUER, AGENT)


@pytest.fixture(scope="session")
def governed_embedder() -> CountingEmbedder:
    from kagent_memory_governed.testing import CountingEmbedder

    return CountingEmbedder()


@pytest.fixture
def governed_model() -> ScriptedModel:
    from kagent_memory_governed.testing import ScriptedModel

    return ScriptedModel()


@pytest.fixture(scope="session")
def governed_runtime(
    governed_store: Store, governed_signer: ScopeSigner, governed_embedder: CountingEmbedder
) -> Runtime:
    namespace, name = governed_signer.agent.split("/")
    for variable, value in (("KAGENT_URL", "http://controller.invalid"), ("KAGENT_NAMESPACE", namespace)):
        os.environ.setdefault(variable, value)
    os.environ.setdefault("KAGENT_NAME", name)
    from kagent_memory_governed.adk.runtime import install
    from kagent_memory_governed.settings import Settings
    from kagent_memory_governed.testing.bridge import HOMESERVER

    settings = Settings(
        bridge_public_key=governed_signer.public_pem, bridge_issuer=governed_signer.issuer, homeserver=HOMESERVER
    )
    return install(settings=settings, store=governed_store, embedder=governed_embedder)


@pytest.fixture
def governed_agent_config() -> dict[str, Any]:
    from kagent_memory_governed.testing import CONFIG

    return CONFIG


@dataclass
class GovernedAgent:
    """An agent under test: its HTTP app, its scripted model, and the bridge's view of one subject."""

    http: httpx.AsyncClient
    model: ScriptedModel
    memory: AsyncControlClient

    async def send(self, text: str, *, context_id: str | None = None, scope: bool = True) -> str:
        """One A2A ``message/send`` as the subject (memory-free with ``scope=False``); the answer as text."""
        from kagent_memory_governed.testing import A2AClient, reply_text

        headers = self.memory.headers()
        if not scope:
            del headers["X-Memory-Scope"]
        return reply_text(await A2AClient(self.http).send_as(headers, text, context_id=context_id))


@pytest.fixture
async def governed_agent(
    governed_runtime: Runtime,
    governed_signer: ScopeSigner,
    governed_model: ScriptedModel,
    governed_agent_config: dict[str, Any],
    governed_database_url: str,
    governed_store: Store,
) -> AsyncIterator[GovernedAgent]:
    import httpx

    from kagent_memory_governed.bridge import AsyncControlClient, Subject
    from kagent_memory_governed.testing import build_app
    from kagent_memory_governed.testing.bridge import HOMESERVER

    app = build_app(governed_model, config=governed_agent_config)
    subject = Subject(f"@user{uuid.uuid4().hex[:8]}:{HOMESERVER}", f"!room{uuid.uuid4().hex[:12]}:{HOMESERVER}")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
            yield GovernedAgent(http, governed_model, AsyncControlClient(http, governed_signer, subject))
        await governed_runtime.service.drain()
    finally:
        await empty_tables(governed_database_url, governed_store.key_store)
        governed_store.drop_kept_keyrings()
