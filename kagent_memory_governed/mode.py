"""Which store an agent runtime runs (R43): the governed memory service's, or one of its own.

- **service**: ``KAGENT_GOVERNED_MEMORY_SERVICE_URL`` is set. The runtime reaches memory through the service's data
  plane only (``service.remote.RemoteStore``) and holds no database or key-store setting (``Settings`` refuses one).
- **in-process**: unset. The runtime runs the ``Store`` itself and holds the database URL and the key store of every
  scope of the agent: the default for local runs, the demo and tests; inside a Kubernetes pod only with
  ``KAGENT_GOVERNED_MEMORY_IN_PROCESS=true``.

``doctor`` prints ``describe``; ``install`` and the console script's upstream commands call ``connect``. Every
door (activation, the CLI, ``serve``, ``doctor``) reads the settings through ``load`` or ``check``: the settings
themselves know no store and no key store, so the URLs are checked here, by the parts that will use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.settings import ENV_PREFIX, Settings, in_kubernetes_pod

if TYPE_CHECKING:
    from kagent_memory_governed.service.remote import RemoteStore
    from kagent_memory_governed.store import Store


def check(settings: Settings) -> Settings:
    """``settings`` whose database and key store URLs parse as their stores will parse them
    (``store.connection.parse``, ``keys.check_url``); else a ``ConfigurationError`` naming the setting and the
    problem, never a value. Loads the store's URL grammar only when a database URL is set."""
    if settings.database_url is not None:
        from kagent_memory_governed.store.connection import parse

        parse(settings.database_url.get_secret_value())
    if settings.key_store is not None:
        from kagent_memory_governed.keys import check_url

        try:
            check_url(settings.key_store)
        except ValueError as refused:
            raise ConfigurationError(str(refused)) from None
    return settings


def load() -> Settings:
    """``Settings.load`` and then ``check``, refusing as ``Settings.load`` does: ``invalid settings: ...``."""
    settings = Settings.load()
    try:
        return check(settings)
    except ConfigurationError as refused:
        raise ConfigurationError(f"invalid settings: {refused}", code=refused.code) from None


def refuse_in_process_in_pod(settings: Settings) -> None:
    """Inside a Kubernetes pod, the in-process store only when asked for: ``ConfigurationError`` (``missing``)."""
    if settings.service_url is None and in_kubernetes_pod() and not settings.in_process:
        raise ConfigurationError(
            f"{ENV_PREFIX}SERVICE_URL is not set; inside a Kubernetes pod the in-process store, which holds every"
            f" scope's credentials, is used only with {ENV_PREFIX}IN_PROCESS=true",
            code="missing",
        )


def connect(settings: Settings) -> Store | RemoteStore:
    """The runtime's store from ``settings``: the service's data plane, or the in-process store."""
    if settings.service_url is not None:
        from kagent_memory_governed.service.remote import RemoteStore

        return RemoteStore.connect(settings.service_url, token_file=settings.service_token, ca_file=settings.service_ca)
    refuse_in_process_in_pod(settings)
    from kagent_memory_governed.embedded import database_url, key_store
    from kagent_memory_governed.store import Store

    return Store.connect(database_url(settings), settings.load_policy(), keys=key_store(settings))


def describe(settings: Settings) -> str:
    """The mode in one content-free line."""
    if settings.service_url is not None:
        return "memory service (this process holds no database or key-store credential)"
    holder = "this pod" if in_kubernetes_pod() else "this process"
    return f"in-process store ({holder} holds the database URL and key store of every scope)"
