"""TLS to PostgreSQL with libpq's meaning, against TLS-only servers with a CA and certificates made here.

Two real servers, neither reachable in plain text:
- Debian's PostgreSQL 15 (``/usr/lib/postgresql/15/bin``; ``.ci/run`` installs it) with ``ssl = on`` and
  ``hostssl`` lines only: PostgreSQL's own TLS, for what each ``sslmode`` connects to or refuses, host name
  checks, client certificates; it has no pgvector, so a command gets as far as ``unsupported_database``.
- the suite's PostgreSQL 18 with pgvector (built without TLS) behind a relay that speaks PostgreSQL's
  TLS negotiation and accepts nothing else (as a managed database's TLS front does): where ``migrate``,
  ``sweep``, ``doctor`` and ``static`` do their whole work over TLS.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from certificates import certificate
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support import KEY_STORE, free_port, key_store_of, pod_environment, private_directory, serve

from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.connection import parse
from kagent_memory_governed.testing import Bridge

POSTGRES_15 = Path("/usr/lib/postgresql/15/bin")
PASSWORD = "SENTINEL-db-password"
KEY_PASSWORD = "SENTINEL-key-password"
CERT_USER = "tls_cert_user"
COMMAND = str(Path(sys.executable).parent / "kagent-memory-governed")


# -- a CA, a server certificate for "localhost" only, a client certificate, and a CA nobody signed with ----


@dataclass(frozen=True)
class Pki:
    ca: Path
    wrong_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    dns: str | None = None,
) -> x509.Certificate:
    return certificate(subject, key, issuer, issuer_key, ca=ca, names=[x509.DNSName(dns)] if dns else ())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def make_pki(directory: Path) -> Pki:
    pem = serialization.Encoding.PEM
    ca_key, wrong_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    ca = _certificate("governed test CA", ca_key, "governed test CA", ca_key, ca=True)
    wrong = _certificate("another CA", wrong_key, "another CA", wrong_key, ca=True)
    server = _certificate("localhost", server_key, "governed test CA", ca_key, ca=False, dns="localhost")
    client = _certificate(CERT_USER, client_key, "governed test CA", ca_key, ca=False)
    plain = serialization.NoEncryption()
    locked = serialization.BestAvailableEncryption(KEY_PASSWORD.encode())
    pkcs8 = serialization.PrivateFormat.PKCS8
    return Pki(
        ca=_write(directory / "ca.pem", ca.public_bytes(pem)),
        wrong_ca=_write(directory / "wrong-ca.pem", wrong.public_bytes(pem)),
        server_cert=_write(directory / "server.pem", server.public_bytes(pem)),
        server_key=_write(directory / "server.key", server_key.private_bytes(pem, pkcs8, plain)),
        client_cert=_write(directory / "client.pem", client.public_bytes(pem)),
        client_key=_write(directory / "client.key", client_key.private_bytes(pem, pkcs8, locked)),
    )


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki(private_directory("pki"))


# -- Debian's PostgreSQL 15, TLS only ---------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    port: int
    directory: Path
    user: str | None  # the system user the server runs as (PostgreSQL refuses to run as root)

    def run(self, *command: str) -> str:
        return subprocess.run(
            [str(POSTGRES_15 / command[0]), *command[1:]],
            user=self.user,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.directory,
        ).stdout

    def sql(self, statement: str) -> str:
        return self.run("psql", "-h", str(self.directory), "-p", str(self.port), "-U", "postgres", "-Atc", statement)


HBA = f"""local all all trust
hostssl all {CERT_USER} all cert
hostssl all all all scram-sha-256
"""


@pytest.fixture(scope="module")
def postgres15(pki: Pki) -> Iterator[Server]:
    if not (POSTGRES_15 / "postgres").exists():
        pytest.fail("PostgreSQL 15's server is not installed: apt-get install postgresql-15 (.ci/run does)")
    user = "postgres" if os.geteuid() == 0 else None
    directory = private_directory("tls-pg15")
    server = Server(free_port(), directory, user)
    secrets = directory / "secrets"
    secrets.mkdir()
    for source in (pki.server_cert, pki.server_key, pki.ca):
        shutil.copy(source, secrets / source.name)
    (directory / "pw").write_text(PASSWORD)
    if user:
        account = pwd.getpwnam(user)
        for path in [directory, secrets, directory / "pw", *secrets.iterdir()]:
            os.chown(path, account.pw_uid, account.pw_gid)
    directory.chmod(0o700)
    server.run("initdb", "-D", "data", "-U", "postgres", "--pwfile", "pw", "-A", "trust", "--no-sync")
    with (directory / "data" / "postgresql.conf").open("a") as conf:
        conf.write(
            f"listen_addresses = 'localhost'\nport = {server.port}\nunix_socket_directories = '{directory}'\n"
            f"ssl = on\nssl_cert_file = '{secrets / 'server.pem'}'\nssl_key_file = '{secrets / 'server.key'}'\n"
            f"ssl_ca_file = '{secrets / 'ca.pem'}'\nfsync = off\n"
        )
    (directory / "data" / "pg_hba.conf").write_text(HBA)
    server.run("pg_ctl", "-D", "data", "-l", "log", "-w", "start")
    try:
        server.sql(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
        server.sql(f"CREATE ROLE {CERT_USER} LOGIN")
        yield server
    finally:
        server.run("pg_ctl", "-D", "data", "-w", "-m", "immediate", "stop")


def url_of(port: int, query: str = "", *, host: str = "localhost", user: str = "postgres") -> str:
    credentials = f"{user}:{quote(PASSWORD)}" if user == "postgres" else user
    return f"postgresql+asyncpg://{credentials}@{host}:{port}/postgres" + (f"?{query}" if query else "")


async def outcome(url: str) -> str:
    """``connected`` or the content-free refusal of one connection and query through the store."""
    store = Store.connect(url, Policy(), keys=LocalKeyStore(key_store_of(url)), pool_size=1, max_overflow=0)
    try:
        await store.revision()
    except GovernedMemoryError as refused:
        return refused.explained()
    finally:
        await store.close()
    return "connected"


def test_the_url_keeps_its_hosts_and_hands_the_tls_parameters_to_the_driver_as_libpq_spells_them(pki: Pki) -> None:
    url = f"postgresql+asyncpg://app:{PASSWORD}@/db?host=a:5432&host=b:5433&sslmode=verify-ca&sslrootcert={pki.ca}"
    parsed = parse(url)
    assert dict(parsed.url.query) == {"host": ("a:5432", "b:5433")}  # SQLAlchemy's multihost form
    assert parsed.connect_args() == {
        "dsn": f"postgresql://?sslmode=verify-ca&sslrootcert={quote(str(pki.ca), safe='')}"
    }
    assert PASSWORD not in repr(parsed)
    assert parse("postgresql+asyncpg://app@/db?host=/run/sock").connect_args() == {}  # libpq's defaults


LIBPQ_MODES = [
    # (query, host, what libpq does against a TLS-only server whose certificate names localhost)
    ("sslmode=disable", "localhost", "store_unavailable (tls_required)"),
    ("sslmode=allow", "localhost", "connected"),  # plain text is refused, then it tries TLS
    ("sslmode=prefer", "localhost", "connected"),
    ("", "localhost", "connected"),  # libpq's default is prefer
    ("sslmode=require", "localhost", "connected"),  # encrypted, not verified
    ("ssl=require", "localhost", "connected"),  # asyncpg's spelling of the same
    ("sslmode=require&sslrootcert={ca}", "127.0.0.1", "connected"),  # with a CA: verified as verify-ca
    ("sslmode=require&sslrootcert={wrong_ca}", "localhost", "store_unavailable (tls_untrusted_certificate)"),
    ("sslmode=verify-ca&sslrootcert={ca}", "127.0.0.1", "connected"),  # no host name check
    ("sslmode=verify-ca&sslrootcert={wrong_ca}", "localhost", "store_unavailable (tls_untrusted_certificate)"),
    ("sslmode=verify-full&sslrootcert={ca}", "localhost", "connected"),
    ("sslmode=verify-full&sslrootcert={ca}", "127.0.0.1", "store_unavailable (tls_hostname_mismatch)"),
    ("sslmode=verify-full&sslrootcert={wrong_ca}", "localhost", "store_unavailable (tls_untrusted_certificate)"),
    ("sslrootcert=system", "localhost", "store_unavailable (tls_untrusted_certificate)"),  # verify-full, system roots
]


@pytest.mark.parametrize(("query", "host", "expected"), LIBPQ_MODES)
async def test_each_sslmode_connects_or_refuses_as_libpq_does(
    postgres15: Server, pki: Pki, query: str, host: str, expected: str
) -> None:
    query = query.format(ca=pki.ca, wrong_ca=pki.wrong_ca)
    assert await outcome(url_of(postgres15.port, query, host=host)) == expected


async def test_a_client_certificate_with_its_key_password_authenticates(postgres15: Server, pki: Pki) -> None:
    query = f"sslmode=verify-full&sslrootcert={pki.ca}&sslcert={pki.client_cert}&sslkey={pki.client_key}"
    url = url_of(postgres15.port, f"{query}&sslpassword={quote(KEY_PASSWORD)}", user=CERT_USER)
    assert await outcome(url) == "connected"
    without = url_of(postgres15.port, f"sslmode=verify-full&sslrootcert={pki.ca}", user=CERT_USER)
    assert await outcome(without) == "store_unavailable (authentication_failed)"


async def test_a_server_without_tls_is_refused_by_require_and_reached_in_plain_text_by_prefer(
    postgres15: Server, pki: Pki
) -> None:
    postgres15.sql("ALTER SYSTEM SET ssl = off")
    postgres15.sql("SELECT pg_reload_conf()")
    try:
        assert await outcome(url_of(postgres15.port, "sslmode=require")) == "store_unavailable (tls_not_offered)"
        # prefer falls back to plain text, which this server's hostssl-only rules refuse
        assert await outcome(url_of(postgres15.port, "sslmode=prefer")) == "store_unavailable (tls_required)"
    finally:
        postgres15.sql("ALTER SYSTEM RESET ssl")
        postgres15.sql("SELECT pg_reload_conf()")
    assert await outcome(url_of(postgres15.port, "sslmode=require")) == "connected"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}
    keys = {KEY_STORE: f"file://{key_store_of(env['KAGENT_GOVERNED_MEMORY_DATABASE_URL'])}"}  # that database's
    return subprocess.run([COMMAND, *args], env={**clean, **keys, **env}, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["migrate", "sweep"])
def test_commands_reach_postgres_15_over_tls_and_refuse_a_wrong_ca_in_one_line(
    postgres15: Server, pki: Pki, command: str
) -> None:
    for query, expected in [
        ("sslmode=require", "refused: unsupported_database\n"),  # reached and asked: no pgvector there
        (f"sslmode=verify-full&sslrootcert={pki.ca}", "refused: unsupported_database\n"),
        (f"sslmode=verify-full&sslrootcert={pki.wrong_ca}", "refused: store_unavailable (tls_untrusted_certificate)\n"),
    ]:
        result = run(command, KAGENT_GOVERNED_MEMORY_DATABASE_URL=url_of(postgres15.port, query))
        assert (result.returncode, result.stdout, result.stderr) == (
            1,
            f"database: localhost:{postgres15.port}/postgres\n",
            expected,
        )


# -- PostgreSQL 18 with pgvector behind a TLS-only relay ---------------------------------------------------

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class TlsRelay:
    """Accepts PostgreSQL's TLS negotiation only (``SSLRequest``, then a handshake with the server
    certificate), then relays the session to a Unix socket; a plain-text start-up gets PostgreSQL's refusal."""

    def __init__(self, socket_path: str, pki: Pki) -> None:
        self.socket_path = socket_path
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pki.server_cert, pki.server_key)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> TlsRelay:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._session, "localhost", self.port)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                length, code = struct.unpack("!ii", await reader.readexactly(8))
                if code == GSSENC_REQUEST:
                    writer.write(b"N")
                    continue
                if code != SSL_REQUEST:  # a plain-text start-up: refused as hostssl-only PostgreSQL refuses it
                    message = b"SFATAL\0C28000\0Mno pg_hba.conf entry for host, no encryption\0\0"
                    writer.write(b"E" + struct.pack("!i", len(message) + 4) + message)
                    await writer.drain()
                    return
                writer.write(b"S")
                await writer.drain()
                await writer.start_tls(self.context)
                break
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(self.socket_path)
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()


@pytest.fixture(scope="module")
def relay(database_url: str, store: Store, pki: Pki) -> Iterator[TlsRelay]:
    socket_dir = database_url.split("host=")[1]
    with TlsRelay(f"{socket_dir}/.s.PGSQL.5432", pki) as running:
        yield running


def relayed(relay: TlsRelay, query: str, database: str) -> str:
    return f"postgresql+asyncpg://postgres@localhost:{relay.port}/{database}?{query}"


@pytest.fixture
async def tls_database(sql: asyncpg.Connection) -> AsyncIterator[str]:
    """A database of its own on the PostgreSQL 18 server, never migrated, dropped afterwards."""
    name = f"tls_{os.urandom(5).hex()}"
    await sql.execute(f'CREATE DATABASE "{name}"')
    yield name
    await sql.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_plain_text_never_reaches_the_relayed_server(relay: TlsRelay, tls_database: str) -> None:
    assert await outcome(relayed(relay, "sslmode=disable", tls_database)) == "store_unavailable (tls_required)"


@pytest.mark.parametrize("verify", [False, True], ids=["require", "verify-full"])
async def test_migrate_and_sweep_do_their_work_over_tls(
    relay: TlsRelay, pki: Pki, tls_database: str, verify: bool
) -> None:
    query = f"sslmode=verify-full&sslrootcert={pki.ca}" if verify else "sslmode=require"
    url = relayed(relay, query, tls_database)
    described = f"database: localhost:{relay.port}/{tls_database}\n"
    migrated = await asyncio.to_thread(run, "migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=url)
    assert (migrated.returncode, migrated.stderr) == (0, "")
    assert migrated.stdout == described + f"governed memory schema at revision {Store.head_revision()}\n"
    swept = await asyncio.to_thread(run, "sweep", KAGENT_GOVERNED_MEMORY_DATABASE_URL=url)
    assert (swept.returncode, swept.stdout, swept.stderr) == (0, described + "swept 0 expired entries\n", "")


@pytest.mark.long
async def test_doctor_passes_and_static_serves_over_verify_full(
    relay: TlsRelay, pki: Pki, tls_database: str, bridge: Bridge, tmp_path: Path
) -> None:
    url = relayed(relay, f"sslmode=verify-full&sslrootcert={pki.ca}", tls_database)
    assert (await asyncio.to_thread(run, "migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=url)).returncode == 0
    env = pod_environment(tmp_path, bridge, url)
    doctor = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "kagent_memory_governed.doctor"], env=env, capture_output=True, text=True
    )
    assert doctor.returncode == 0, doctor.stdout
    assert [line.split()[1] for line in doctor.stdout.splitlines()] == ["ok"] * 11
    env.pop("KAGENT_GOVERNED_MEMORY")  # the console script installs governed memory itself
    server, base = serve(tmp_path, env)
    try:
        ready = await asyncio.to_thread(_wait_ready, server, base)
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert ready == (200, {"ready": True})
    assert PASSWORD not in output and str(pki.ca) not in output


def _wait_ready(server: subprocess.Popen[str], base: str) -> tuple[int, dict[str, Any]] | None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and server.poll() is None:
        try:
            answer = httpx.get(f"{base}/memory/ready", timeout=5)
            return answer.status_code, answer.json()
        except httpx.TransportError:
            time.sleep(0.2)  # waiting for a real server to listen; no clock-dependent behaviour is tested
    return None


@pytest.mark.long
def test_a_wrong_ca_under_verify_full_stops_every_command_in_one_line(
    relay: TlsRelay, pki: Pki, database_url: str, bridge: Bridge, tmp_path: Path
) -> None:
    url = relayed(relay, f"sslmode=verify-full&sslrootcert={pki.wrong_ca}", "postgres")
    refused = "store_unavailable (tls_untrusted_certificate)"
    for command in ("migrate", "sweep"):
        result = run(command, KAGENT_GOVERNED_MEMORY_DATABASE_URL=url)
        assert (result.returncode, result.stderr) == (1, f"refused: {refused}\n")
    env = pod_environment(tmp_path, bridge, url)
    doctor = subprocess.run(
        [sys.executable, "-m", "kagent_memory_governed.doctor"], env=env, capture_output=True, text=True
    )
    assert doctor.returncode == 1
    assert "database                 FAILED store_unavailable tls_untrusted_certificate\n" in doctor.stdout
    env.pop("KAGENT_GOVERNED_MEMORY")
    server, _ = serve(tmp_path, env)
    try:
        output, _ = server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 78
    assert output.endswith(f"kagent-memory-governed: not serving: {refused}\n")
    assert "Traceback" not in output and PASSWORD not in output
