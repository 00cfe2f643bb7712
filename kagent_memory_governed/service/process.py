"""``kagent-memory-governed serve``: the governed memory service in a process of its own (ADR 0001, R43).

It alone holds the database URL and the key-store credential, and serves:
- the data plane (``governed_memory.v1.DataPlane``, gRPC) on ``KAGENT_GOVERNED_MEMORY_DATA_PLANE_ADDRESS``, for
  agent runtimes: each call names its agent by its workload identity (``identity.WorkloadIdentity``) and acts on
  the scope token it carries for that agent (``server.DataPlane``);
- the bridge's control API ``/memory/v1`` and ``/memory/ready`` on ``KAGENT_GOVERNED_MEMORY_CONTROL_ADDRESS``, for
  every agent it serves: a control token's audience names the agent (among ``KAGENT_GOVERNED_MEMORY_IDENTITY_AGENTS``
  when that table is set), and the token is then verified for that agent in full.
Both over TLS with the service's certificate (``KAGENT_GOVERNED_MEMORY_TLS_CERT``, ``_TLS_KEY``), plaintext only on
loopback addresses. Replicas coordinate through PostgreSQL only. A bad configuration is one line and exit 78 before
anything is served; a store that is not ready, the same.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kagent_memory_governed import control, health, metering, redaction
from kagent_memory_governed.assertion import Trust
from kagent_memory_governed.embedding import Embedders, load_table
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId
from kagent_memory_governed.service import server, wire
from kagent_memory_governed.service.identity import WorkloadIdentity, agent_table
from kagent_memory_governed.settings import ENV_PREFIX, Settings
from kagent_memory_governed.store import Store

EXIT_CONFIG = 78  # EX_CONFIG, as the agent server exits on a store that is not ready


@dataclass(frozen=True)
class Addresses:
    data_plane: tuple[str, int]
    control: tuple[str, int]


def addresses(settings: Settings) -> Addresses:
    """Both listening addresses, ``host:port``; ``ConfigurationError`` naming the setting, never its value."""

    def parsed(name: str, value: str) -> tuple[str, int]:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigurationError(f"{ENV_PREFIX}{name}: not host:port", code="invalid")
        return host.strip("[]"), int(port)

    return Addresses(
        parsed("DATA_PLANE_ADDRESS", settings.data_plane_address), parsed("CONTROL_ADDRESS", settings.control_address)
    )


def served_agents(settings: Settings) -> frozenset[AgentId] | None:
    """The agents of ``KAGENT_GOVERNED_MEMORY_IDENTITY_AGENTS`` (``None``: every agent a token names)."""
    table = agent_table(_pairs(settings.identity_agents) if settings.identity_agents else None)
    return None if table is None else frozenset(table.values())


def _pairs(text: str) -> list[tuple[str, str]]:
    pairs = [entry.strip().partition("=") for entry in text.split(",") if entry.strip()]
    if not pairs or any(not account or not sep or not agent for account, sep, agent in pairs):
        raise ConfigurationError(f"{ENV_PREFIX}IDENTITY_AGENTS: <ns>/<service account>=<ns>/<agent>,...")
    return [(account.strip(), agent.strip()) for account, _, agent in pairs]


def bridge(settings: Settings) -> tuple[Ed25519PublicKey, str, str]:
    """The bridge's key and issuer and the local homeserver, which every token is verified against."""
    key, issuer, homeserver = settings.bridge_key(), settings.bridge_issuer, settings.homeserver
    if not issuer or not homeserver:
        raise ConfigurationError(f"serve needs {ENV_PREFIX}BRIDGE_ISSUER and {ENV_PREFIX}HOMESERVER", code="missing")
    return key, issuer, homeserver


def trusts(settings: Settings, served: frozenset[AgentId] | None) -> Callable[[object], Trust]:
    """The control plane's ``Trust`` for a token: the agent its audience names, if this service serves it."""
    key, issuer, homeserver = bridge(settings)

    def trust(token: object) -> Trust:
        if not token:
            raise GovernedMemoryError(Reason.NO_ASSERTION)
        audience = (wire.claims_unverified(token) or {}).get("aud")
        if not isinstance(audience, str) or "#" not in audience:
            raise GovernedMemoryError(Reason.BAD_ASSERTION)
        try:
            agent = AgentId.parse(audience.partition("#")[0])
        except GovernedMemoryError:
            raise GovernedMemoryError(Reason.BAD_ASSERTION) from None
        if served is not None and agent not in served:
            raise GovernedMemoryError(Reason.BAD_ASSERTION)
        return Trust(key, issuer, agent, homeserver)

    return trust


def _tls(settings: Settings, where: Addresses) -> server.ServerTLS | None:
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigurationError(f"{ENV_PREFIX}TLS_CERT and {ENV_PREFIX}TLS_KEY go together", code="missing")
    if settings.tls_cert is None or settings.tls_key is None:
        if not all(wire.is_loopback(host) for host in (where.data_plane[0], where.control[0])):
            raise ConfigurationError(f"serve needs {ENV_PREFIX}TLS_CERT and _TLS_KEY off loopback", code="missing")
        return None
    try:
        return server.ServerTLS(settings.tls_cert.read_bytes(), settings.tls_key.read_bytes())
    except OSError:
        raise ConfigurationError(f"{ENV_PREFIX}TLS_CERT or _TLS_KEY: unreadable", code="unreadable") from None


async def serve(settings: Settings, store: Store) -> None:
    """Serve both planes over ``store`` until SIGTERM or SIGINT; ``ConfigurationError`` before anything is served."""
    from fastapi import FastAPI

    where = addresses(settings)
    tls = _tls(settings, where)
    served = served_agents(settings)
    trust = trusts(settings, served)
    if not settings.identity_issuer:
        raise ConfigurationError(f"serve needs {ENV_PREFIX}IDENTITY_ISSUER", code="missing")
    embedders = Embedders(load_table(settings.embeddings)) if settings.embeddings is not None else None
    identity = WorkloadIdentity(
        issuer=settings.identity_issuer,
        audience=settings.identity_audience,
        api_server=settings.identity_api_server,
        ca_file=settings.identity_ca,
        token_file=settings.identity_token,
        agents=_pairs(settings.identity_agents) if settings.identity_agents else None,
    )
    try:
        await store.check_ready()  # refused: one line and exit 78 (``main``), nothing served
        key, issuer, homeserver = bridge(settings)
        plane = server.DataPlane(
            store, identity, public_key=key, issuer=issuer, homeserver=homeserver, embedders=embedders
        )
        host, port = where.data_plane
        grpc_server, _ = server.build(plane, f"[{host}]:{port}" if ":" in host else f"{host}:{port}", tls=tls)
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
        app.add_middleware(redaction.MemoryWorkMiddleware)
        control.mount(app, store, trust)
        health.mount(app, store)
        host, port = where.control
        certificate = str(settings.tls_cert) if tls else None
        private_key = str(settings.tls_key) if tls else None
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            ssl_certfile=certificate,
            ssl_keyfile=private_key,
        )
        http = _Server(config)
        _, replication = await store.replication()
        try:
            await grpc_server.start()
            sys.stderr.write(f"kagent-memory-governed: serving; replication: {replication}\n")
            if embedders is None:  # the previous release's runtimes embed themselves; this release's are refused
                sys.stderr.write(
                    f"kagent-memory-governed: no {ENV_PREFIX}EMBEDDINGS: embedding_failed (not_configured)\n"
                )
            sys.stderr.flush()
            await http.serve()  # returns on SIGTERM or SIGINT (``_Server``)
        finally:
            await grpc_server.stop(grace=5)
    finally:
        await identity.aclose()
        if embedders is not None:
            await embedders.aclose()


class _Server(uvicorn.Server):
    """uvicorn's server, ended by SIGTERM or SIGINT without raising the signal again once it has stopped (uvicorn's
    own does, which would end the process before the data plane is stopped and the store closed)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def main(settings: Settings) -> int:
    """``serve``: exit 78 with one line on a bad configuration or a store not ready; 0 when stopped."""
    from kagent_memory_governed.embedded import database_url, key_store

    try:
        metering.export_from_environment()
        keys = key_store(settings)
        store = Store.connect(database_url(settings), settings.load_policy(), keys=keys)
    except ConfigurationError as error:
        sys.stderr.write(f"kagent-memory-governed: not serving: {error}\n")
        return EXIT_CONFIG
    try:
        asyncio.run(_serving(settings, store))
    except ConfigurationError as error:
        sys.stderr.write(f"kagent-memory-governed: not serving: {error}\n")
        return EXIT_CONFIG
    except GovernedMemoryError as refused:
        sys.stderr.write(f"kagent-memory-governed: not serving: {refused.explained()}\n")
        return EXIT_CONFIG
    return 0


async def _serving(settings: Settings, store: Store) -> None:
    try:
        await serve(settings, store)
    finally:
        await store.close()
