"""The settings hold the database password and the key-store token as secrets: no ``repr`` or ``str`` of the
settings, nor of the store built from them, shows either; every consumer still gets the value it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kagent_memory_governed import embedded, keys, mode
from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store

PASSWORD = "SENTINEL-pw-4711"
TOKEN = "SENTINEL-token-0815"


@pytest.fixture
def secret_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """An operator's environment: a database URL with a password, OpenBao with a literal token."""
    url = f"postgresql+asyncpg://app:{PASSWORD}@db.example:6432/memories?sslmode=require"
    monkeypatch.setenv("KAGENT_GOVERNED_MEMORY_DATABASE_URL", url)
    monkeypatch.setenv("KAGENT_GOVERNED_MEMORY_KEY_STORE", "openbao+https://bao.example:8200/kmg")
    monkeypatch.setenv("KAGENT_GOVERNED_MEMORY_KEY_STORE_TOKEN", TOKEN)
    monkeypatch.setenv("KAGENT_GOVERNED_MEMORY_DATA_DIR", str(tmp_path))
    return url


def _shown(*objects: object) -> str:
    return "\n".join(text for o in objects for text in (repr(o), str(o), f"{o!r:>10}"))


def test_the_settings_show_neither_the_database_password_nor_the_key_store_token(secret_environment: str) -> None:
    settings = Settings.load()
    shown = _shown(settings, Settings(), settings.model_copy())
    assert "SENTINEL" not in shown
    assert "database_url=SecretStr('**********')" in repr(settings)  # present, and masked
    assert "key_store_token=SecretStr('**********')" in repr(settings)


def test_every_consumer_still_reads_the_values(secret_environment: str) -> None:
    settings = Settings.load()
    assert embedded.database_url(settings) == secret_environment  # what Store.connect is given
    assert embedded.describe(settings) == "db.example:6432/memories"
    store = embedded.key_store(settings)
    assert isinstance(store, keys.OpenBaoKeyStore)


def test_the_store_built_from_the_settings_shows_neither(secret_environment: str) -> None:
    settings = Settings.load()
    store = Store.connect(embedded.database_url(settings), Policy(), keys=embedded.key_store(settings))
    assert "SENTINEL" not in _shown(store, store.key_store, store._db, store._engine, store._engine.url)


def test_the_database_url_is_still_checked_and_refused_without_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGENT_GOVERNED_MEMORY_DATABASE_URL", f"postgres://app:{PASSWORD}@db/kagent")
    with pytest.raises(ConfigurationError) as refused:
        mode.load()  # the door checks it, as the store will parse it
    assert str(refused.value) == (
        "invalid settings: KAGENT_GOVERNED_MEMORY_DATABASE_URL: not a postgresql+asyncpg:// URL"
    )
