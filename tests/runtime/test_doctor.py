"""``doctor``: proves, content-free, that a pod's environment runs governed memory before anyone consents."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from support import KEY_STORE, key_store_of, pod_environment

from kagent_memory_governed import doctor
from kagent_memory_governed.adk import runtime as runtime_module
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge

if TYPE_CHECKING:
    from kagent_memory_governed import Runtime
    from kagent_memory_governed.store import Store

CHECKS = [
    "mode",
    "policy",
    "bridge_key",
    "bridge_issuer",
    "homeserver",
    "agent_identity",
    "key_store",
    "database",
    "replication",
    "governed_memory_active",
]


def configured(tmp_path: Path, bridge: Bridge, database_url: str | None, **overrides: Any) -> Settings:
    key = tmp_path / "bridge.pem"
    key.write_text(bridge.public_pem)
    values = dict(
        database_url=database_url,
        bridge_public_key=f"@{key}",
        bridge_issuer=ISSUER,
        homeserver=HOMESERVER,
        key_store=f"file://{key_store_of(database_url) if database_url else tmp_path / 'keys'}",  # the one it serves
    )
    return Settings(**{**values, **overrides})


def failures(checks: list[doctor.Check]) -> dict[str, str | None]:
    return {check.name: check.reason for check in checks if not check.ok}


async def test_a_configured_activated_process_on_a_migrated_database_passes_every_check(
    runtime: Runtime, store: Store, database_url: str, bridge: Bridge, tmp_path: Path
) -> None:
    checks = await doctor.run(configured(tmp_path, bridge, database_url))
    assert [check.name for check in checks] == CHECKS
    assert failures(checks) == {}


async def test_a_never_migrated_database_is_schema_missing(
    runtime: Runtime, store: Store, database_url: str, bridge: Bridge, tmp_path: Path
) -> None:
    settings = configured(tmp_path, bridge, database_url.replace("/postgres?", "/template1?"))
    assert failures(await doctor.run(settings)) == {"database": "schema_missing"}


async def test_an_unreachable_key_store_fails_its_own_line_and_the_database_still_passes(
    runtime: Runtime, store: Store, database_url: str, bridge: Bridge, tmp_path: Path
) -> None:
    from support import free_port

    unreachable = f"openbao+http://127.0.0.1:{free_port()}/governed-memory-keys"
    settings = configured(tmp_path, bridge, database_url, key_store=unreachable, key_store_token="not-a-token")
    checks = await doctor.run(settings)
    assert failures(checks) == {"key_store": "key_unavailable"}
    assert [check.name for check in checks] == CHECKS
    missing = configured(tmp_path, bridge, database_url, key_store=unreachable)  # OpenBao without a token
    assert failures(await doctor.run(missing)) == {"key_store": "missing"}


async def test_without_a_database_url_the_embedded_default_is_reported_as_local_only(
    runtime: Runtime, bridge: Bridge, tmp_path: Path
) -> None:
    settings = configured(tmp_path, bridge, None, data_dir=tmp_path / "never-started")
    assert failures(await doctor.run(settings)) == {"database": "embedded_default_is_for_local_use_only"}
    assert not (tmp_path / "never-started").exists()


@pytest.mark.parametrize(
    ("pem", "reason"),
    [
        ("not a key", "not_ed25519_public_key"),
        (
            generate_private_key(SECP256R1())
            .public_key()
            .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
            .decode(),
            "not_ed25519_public_key",
        ),
        ("@/nonexistent/bridge.pem", "unreadable"),
        (  # the identity: small order, so a forged signature would verify
            Ed25519PublicKey.from_public_bytes(b"\x01" + bytes(31))
            .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
            .decode(),
            "not_ed25519_public_key",
        ),
    ],
    ids=["not-a-key", "p256-key", "missing-file", "identity-point"],  # stable ids: xdist workers compare them
)
async def test_a_bridge_key_that_is_not_a_readable_ed25519_key_fails(
    runtime: Runtime, bridge: Bridge, tmp_path: Path, pem: str, reason: str
) -> None:
    checks = await doctor.run(configured(tmp_path, bridge, None, bridge_public_key=pem))
    assert failures(checks)["bridge_key"] == reason


def test_the_report_names_checks_and_reason_codes_never_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "_active", None)  # as in a process that was never activated
    monkeypatch.setenv("KAGENT_NAME", "Not_A_Valid_Name")
    monkeypatch.delenv(KEY_STORE)  # the suite's own (conftest): unset, as in a new pod
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"entry_cap": 500}))
    settings = Settings(
        database_url=f"postgresql+asyncpg://app:SENTINEL-password@/postgres?host={tmp_path}",
        bridge_public_key="@/nonexistent/SENTINEL-key.pem",
        homeserver="SENTINEL.example",
        policy=policy,
    )
    out = io.StringIO()
    assert doctor.main_report(settings, out) == 1
    report = out.getvalue()
    assert "SENTINEL" not in report and "Not_A_Valid_Name" not in report
    assert [line.split() for line in report.splitlines()] == [
        ["settings", "ok"],
        "mode ok in-process store (this process holds the database URL and key store of every scope)".split(),
        ["policy", "FAILED", "invalid_policy", "entry_cap"],
        ["bridge_key", "FAILED", "unreadable"],
        ["bridge_issuer", "FAILED", "missing"],
        ["homeserver", "ok"],
        ["agent_identity", "FAILED", "invalid"],
        ["key_store", "FAILED", "embedded_default_is_for_local_use_only"],
        ["database", "FAILED", "store_unavailable", "connection_refused"],
        "replication ok unknown (connection_refused: erasures may not survive a failover)".split(),
        ["governed_memory_active", "FAILED", "not_activated"],
    ]


def test_settings_that_do_not_load_are_named_without_their_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGENT_GOVERNED_MEMORY_DATABASE_URL", "postgres://app:SENTINEL-password@db/kagent")
    out = io.StringIO()
    assert doctor.main_report(out=out) == 2
    assert out.getvalue().split(None, 3) == ["settings", "FAILED", "invalid_settings"] + [
        "KAGENT_GOVERNED_MEMORY_DATABASE_URL: not a postgresql+asyncpg:// URL\n"
    ]


def test_a_lookalike_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGENT_GOVERNEDMEMORY_DATABASE_URL", "postgres://app:SENTINEL-password@db/kagent")
    out = io.StringIO()
    assert doctor.main_report(out=out) == 2
    assert out.getvalue().split() == ["settings", "FAILED", "invalid_settings", "unknown", "setting"] + [
        "KAGENT_GOVERNEDMEMORY_DATABASE_URL"
    ]


def _doctor_in_a_pod(
    tmp_path: Path, bridge: Bridge, database_url: str, switch: str
) -> subprocess.CompletedProcess[str]:
    env = pod_environment(tmp_path, bridge, database_url, KAGENT_GOVERNED_MEMORY=switch)
    command = [sys.executable, "-m", "kagent_memory_governed.doctor"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.long
def test_in_a_pod_with_the_switch_on_every_check_passes(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    result = _doctor_in_a_pod(tmp_path, bridge, database_url, "on")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[:2] for line in lines] == [[name, "ok"] for name in ["settings", *CHECKS]]
    assert [line for line in lines if len(line) > 2 and line[0] not in ("mode", "replication")] == []  # their notes
    assert " ".join(lines[1]).endswith("holds the database URL and key store of every scope)")


def test_in_a_pod_with_the_switch_off_governed_memory_is_reported_inactive(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    result = _doctor_in_a_pod(tmp_path, bridge, database_url, "off")
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1].split() == ["governed_memory_active", "FAILED", "not_activated"]


@pytest.mark.parametrize(
    ("given", "reason", "at"),
    [
        ({"key_store_token": "tok", "key_store_ca": "/nonexistent/SENTINEL-ca.pem"}, "ca_unreadable", "_CA"),
        ({"key_store_token": "tok", "key_store_ca": "/etc/hostname"}, "ca_not_a_certificate", "_CA"),
        ({"key_store_token": "@/nonexistent/SENTINEL-token"}, "token_unreadable", "_TOKEN"),
    ],
    ids=["ca-missing", "ca-not-a-certificate", "token-file-missing"],
)
async def test_an_unusable_key_store_setting_is_the_key_store_line_naming_the_setting(
    runtime: Runtime,
    store: Store,
    database_url: str,
    bridge: Bridge,
    tmp_path: Path,
    given: dict[str, str],
    reason: str,
    at: str,
) -> None:
    settings = configured(tmp_path, bridge, database_url, key_store="openbao+https://bao.example:8200/kmg", **given)
    checks = await doctor.run(settings)
    assert [check.name for check in checks] == CHECKS
    assert failures(checks) == {"key_store": reason}  # the database is checked on its own, and passes
    [line] = [check for check in checks if check.name == "key_store"]
    assert line.at == f"{KEY_STORE}{at}"
