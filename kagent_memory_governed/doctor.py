"""``kagent-memory-governed doctor``: is this process's environment governed, before any user consents?

Run inside the agent's container (``kubectl exec``), it checks what the running server relies on: the
settings and policy load, the bridge key, issuer, homeserver and agent identity are usable, the key store
is reachable and authorized, the database is reachable with the schema at head, what its replication means for
erasures (``store/replication.py``), and governed memory (never upstream's) is active in the process.
It prints check names, ``ok`` (with a note, for the replication) or ``FAILED`` and a reason code; never a setting's
value. It writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TextIO

from pydantic import ValidationError

from kagent_memory_governed import keys, mode
from kagent_memory_governed.embedded import key_store
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.keys import KeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.settings import ENV_PREFIX, Settings, problems

RUNTIME = "kagent_memory_governed.adk.runtime"  # the module that installs governed memory (``_activation``)


class Check(NamedTuple):
    """One check: its name, whether it passed, and when it did not a content-free reason code and the
    setting or policy key at fault (a name, never a value); a content-free ``note`` on what passed."""

    name: str
    ok: bool
    reason: str | None = None
    at: str | None = None
    note: str | None = None


def _policy(settings: Settings) -> tuple[Check, Policy]:
    try:
        return Check("policy", True), settings.load_policy()
    except ConfigurationError as error:  # a PolicyError's message starts with the key it names
        return Check("policy", False, "invalid_policy", str(error).split(":", 1)[0]), Policy()


def _configured(name: str, check: Callable[[], object]) -> Check:
    try:
        check()
    except ConfigurationError as error:
        return Check(name, False, error.code)
    return Check(name, True)


def _setting_named(error: ConfigurationError) -> str | None:
    # a ConfigurationError's message names settings, never values: the first one is the setting at fault
    found = re.search(rf"\b{ENV_PREFIX}[A-Z_]+", str(error))
    return found.group(0) if found else None


async def _key_store(settings: Settings) -> tuple[Check, KeyStore | None]:
    """The key store the settings name, reachable, authorized and configured (``key_unavailable``). The embedded
    default is for local runs, as the embedded database is, and is not looked at (doctor writes nothing). Any
    failure is this check's line, a reason code and never a value: no traceback (it could quote one)."""
    if not settings.key_store:
        return Check("key_store", False, "embedded_default_is_for_local_use_only"), None
    try:
        store = key_store(settings)
    except ConfigurationError as error:
        return Check("key_store", False, error.code, _setting_named(error)), None
    except GovernedMemoryError as error:
        return Check("key_store", False, error.reason.value, error.shown), None
    except Exception as error:  # a defect: its type only
        return Check("key_store", False, Reason.INTERNAL_ERROR.value, type(error).__name__), None
    try:
        await store.check()
    except Exception as error:
        with contextlib.suppress(Exception):
            await store.close()
        if isinstance(error, GovernedMemoryError):
            return Check("key_store", False, error.reason.value, error.shown), None
        return Check("key_store", False, Reason.INTERNAL_ERROR.value, type(error).__name__), None
    return Check("key_store", True), store


async def _database(settings: Settings, policy: Policy, key_store: KeyStore | None) -> tuple[Check, Check]:
    """The database line, and the replication line: its kind and what it means for erasures. A server in recovery
    (a standby) fails it, ``read_only``; any other kind passes with its note, ``unknown`` too."""
    unread = Check("replication", True, note="unknown (no database to read it from)")
    if settings.database_url is None:  # never start the embedded server from here
        return Check("database", False, "embedded_default_is_for_local_use_only"), unread
    from kagent_memory_governed.embedded import database_url
    from kagent_memory_governed.store import Store

    with tempfile.TemporaryDirectory() as scratch:  # an unusable key store is the line above: not this one's
        try:
            store = Store.connect(
                database_url(settings),
                policy,
                keys=key_store or keys.LocalKeyStore(Path(scratch)),
                pool_size=1,
                max_overflow=0,
            )
        except Exception:  # e.g. an unparsable URL; the driver's message could quote it
            return Check("database", False, "bad_database_url"), unread
        try:
            kind, line = await store.replication()
            replication = Check("replication", kind != "standby", "read_only" if kind == "standby" else None, note=line)
            await store.check_ready()
        except GovernedMemoryError as error:
            scratch_refused = key_store is None and error.reason is Reason.KEY_STORE_MISMATCH  # of no key store
            if error.reason is not Reason.KEY_UNAVAILABLE and not scratch_refused:
                return Check("database", False, error.reason.value, error.shown), replication
        finally:
            await store.close()
    return Check("database", True), replication


def _activation() -> Check:
    """Whether governed memory runs in this process. Installing it loads ``adk.runtime`` (at interpreter start, with
    the switch on): where that module was never loaded nothing is installed, and the answer needs no import of
    kagent-adk, which costs seconds."""
    if RUNTIME not in sys.modules:
        return Check("governed_memory_active", False, "not_activated")
    from kagent_memory_governed.adk.runtime import active

    runtime = active()
    if runtime is None:
        return Check("governed_memory_active", False, "not_activated")
    if not runtime.in_charge():
        return Check("governed_memory_active", False, "upstream_memory_active")
    return Check("governed_memory_active", True)


def _mode(settings: Settings) -> Check:
    """Which store this process runs (``mode``): the memory service's, holding no credential, or in-process,
    holding every scope's (docs/decisions/0001-memory-service.md); in-process inside a pod only when asked for."""
    try:
        mode.refuse_in_process_in_pod(settings)
    except ConfigurationError as error:
        return Check("mode", False, error.code, _setting_named(error))
    return Check("mode", True, note=mode.describe(settings))


async def _service(settings: Settings) -> Check:
    """The memory service answers this process's workload identity (its policy), over its TLS."""
    try:
        client = mode.connect(settings)
    except ConfigurationError as error:
        return Check("service", False, error.code, _setting_named(error))
    try:
        await client.check_ready()
    except GovernedMemoryError as error:
        return Check("service", False, error.reason.value, error.shown)
    finally:
        await client.close()
    return Check("service", True)


async def run(settings: Settings) -> list[Check]:
    """Every check, in order; content-free. Needs a database only if one is configured; through the memory
    service, only the service."""
    policy_check, policy = _policy(settings)
    if settings.remote():
        where = [await _service(settings)]
    else:
        key_check, key_store = await _key_store(settings)
        where = [key_check, *await _database(settings, policy, key_store)]
    return [
        _mode(settings),
        policy_check,
        _configured("bridge_key", settings.bridge_key),
        Check("bridge_issuer", bool(settings.bridge_issuer), None if settings.bridge_issuer else "missing"),
        Check("homeserver", bool(settings.homeserver), None if settings.homeserver else "missing"),
        _configured("agent_identity", settings.agent),
        *where,
        _activation(),
    ]


def main_report(settings: Settings | None = None, out: TextIO | None = None) -> int:
    """Print one line per check; 0 when every check passed, 1 otherwise, 2 when the settings do not load."""
    out = out or sys.stdout
    try:
        settings = mode.check(settings or Settings())
    except ValidationError as error:  # names only: a database URL may carry a password
        out.write(f"{'settings':<24} FAILED invalid_settings {problems(error)}\n")
        return 2
    except ConfigurationError as error:
        out.write(f"{'settings':<24} FAILED invalid_settings {error}\n")
        return 2
    checks = [Check("settings", True), *asyncio.run(run(settings))]
    for check in checks:
        failed = " ".join(part for part in ("FAILED", check.reason, check.at) if part)
        passed = " ".join(part for part in ("ok", check.note) if part)
        out.write(f"{check.name:<24} {passed if check.ok else failed}\n")
    return 0 if all(check.ok for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main_report())
