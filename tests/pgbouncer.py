"""PgBouncer in front of a real PostgreSQL, for the tests of the pooler: Debian 12's 1.18 (``/usr/sbin/pgbouncer``,
which ``.ci/run`` apt-installs) and Debian 13's 1.24 (``.ci/run`` extracts its package, never installed, into
``/opt/pgbouncer-1.24`` with trixie's C library and c-ares: it needs glibc 2.38, bookworm has 2.36).

PgBouncer refuses to run as root; as root it runs as the owner of the server's socket directory (the embedded
server's system user, whose data directory is that directory), or ``nobody`` in front of a server over TCP. Its
configuration, user list and log live in a private directory outside pytest's temporary tree.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url
from support import free_port, private_directory

PASSWORD = "SENTINEL-pooler-password"


@dataclass(frozen=True)
class Binary:
    """One PgBouncer executable, named by its version (``name``): ``path`` run as it is or, when ``root`` is a
    package tree extracted beside the system (Debian 13's), through that tree's own dynamic loader with its
    libraries first, for that process only."""

    name: str
    path: Path
    provides: str  # what puts it there
    root: Path | None = None

    def installed(self) -> bool:
        return os.access(self.path, os.X_OK)

    def command(self) -> list[str]:
        if self.root is None:
            return [str(self.path)]
        [libraries] = self.root.glob("usr/lib/*-linux-gnu")
        [loader] = libraries.glob("ld-linux*.so.*")
        return [str(loader), "--library-path", str(libraries), str(self.path)]

    def version(self) -> str:
        """``PgBouncer 1.24.1``, as the binary names itself."""
        answer = subprocess.run([*self.command(), "--version"], capture_output=True, text=True, check=True)
        return answer.stdout.splitlines()[0]

    def release(self) -> tuple[int, int]:
        found = re.fullmatch(r"PgBouncer (\d+)\.(\d+)\.\d+", self.version())
        assert found, self.version()
        return int(found[1]), int(found[2])

    def require(self) -> None:
        """Skip, saying why, where this binary is absent; fail in CI (``CI=true``), which must run it."""
        if self.installed():
            return
        absent = f"PgBouncer {self.name} is not at {self.path}: {self.provides}"
        if os.environ.get("CI") == "true":
            pytest.fail(absent)
        pytest.skip(absent)


DEBIAN_12 = Binary("1.18", Path("/usr/sbin/pgbouncer"), "apt-get install pgbouncer (.ci/run does)")
DEBIAN_13 = Binary(
    "1.24",
    Path("/opt/pgbouncer-1.24/usr/sbin/pgbouncer"),
    "run .ci/run's pgbouncer_124 step (it extracts trixie's package there)",
    root=Path("/opt/pgbouncer-1.24"),
)
BINARIES = {binary.name: binary for binary in (DEBIAN_12, DEBIAN_13)}


def server_of(database_url: str) -> str:
    """The ``[databases]`` connection string that reaches the server ``database_url`` names (without dbname)."""
    url = make_url(database_url)
    host = url.host or url.query.get("host") or "/var/run/postgresql"
    parts = [f"host={host}", f"port={url.port or 5432}"]
    if url.password:
        parts.append(f"password={url.password}")
    return " ".join(parts)


@dataclass
class PgBouncer:
    """One PgBouncer process: ``databases`` maps a name clients ask for to a ``[databases]`` connection string
    (``dbname=`` included), ``settings`` are ``[pgbouncer]`` settings over the defaults here (transaction pooling,
    two server connections a pool, SCRAM against the user list), run by ``binary``. Clients log in as ``user``
    with ``PASSWORD``."""

    databases: dict[str, str]
    binary: Binary = DEBIAN_12
    user: str = "postgres"
    settings: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    directory: Path = field(default_factory=lambda: private_directory("pgbouncer"))
    process: subprocess.Popen[bytes] | None = None

    def url(self, database: str, *, password: str = PASSWORD, query: str = "") -> str:
        """The store's URL to ``database`` through this PgBouncer."""
        tail = f"?{query}" if query else ""
        return f"postgresql+asyncpg://{self.user}:{quote(password)}@127.0.0.1:{self.port}/{database}{tail}"

    def _runs_as(self) -> str | None:
        if os.geteuid() != 0:
            return None
        for value in self.databases.values():  # the owner of a socket directory, the only one let in
            host = dict(part.split("=", 1) for part in value.split()).get("host", "")
            if host.startswith("/") and Path(host).is_dir():
                return pwd.getpwuid(Path(host).stat().st_uid).pw_name
        return "nobody"

    def start(self) -> PgBouncer:
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "scram-sha-256",
            "auth_file": str(self.directory / "users.txt"),
            "pool_mode": "transaction",
            "default_pool_size": "2",
            "max_client_conn": "200",
            "logfile": str(self.directory / "log"),
            "pidfile": "",
            **self.settings,
        }
        databases = "".join(f"{name} = {value}\n" for name, value in self.databases.items())
        options = "".join(f"{name} = {value}\n" for name, value in settings.items())
        (self.directory / "pgbouncer.ini").write_text(f"[databases]\n{databases}\n[pgbouncer]\n{options}")
        (self.directory / "users.txt").write_text(f'"{self.user}" "{PASSWORD}"\n')
        user = self._runs_as()
        if user is not None:
            account = pwd.getpwnam(user)
            for path in [self.directory, *self.directory.iterdir()]:
                os.chown(path, account.pw_uid, account.pw_gid)
        self.directory.chmod(0o700)
        command = [*self.binary.command(), str(self.directory / "pgbouncer.ini")]
        self.process = subprocess.Popen(command, user=user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)  # waiting for a real server to listen; no clock-dependent behaviour is tested
        raise RuntimeError(f"PgBouncer did not start:\n{self.log()}")

    def log(self) -> str:
        path = self.directory / "log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # immediate shutdown: 1.18's SIGTERM; from 1.23 SIGTERM waits for clients (10 s with the server down)
            self.process.send_signal(signal.SIGQUIT if self.binary.release() >= (1, 23) else signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
