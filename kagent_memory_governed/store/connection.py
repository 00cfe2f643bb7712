"""How the store reaches PostgreSQL: the database URL, with libpq's connection parameters, checked once.

``KAGENT_GOVERNED_MEMORY_DATABASE_URL`` is a SQLAlchemy ``postgresql+asyncpg://`` URL whose query may
carry libpq's TLS parameters with libpq's meaning (``sslmode`` disable, allow, prefer, require,
verify-ca, verify-full; ``sslrootcert``, ``sslcert``, ``sslkey``, ``sslpassword``), ``host`` (a Unix
socket directory; given several times, with ports, libpq's multi-host form), ``target_session_attrs``
(which of several hosts to use: any, primary, standby, prefer-standby, read-write, read-only) and
``connect_timeout`` (whole seconds, at least 1; unset: ``CONNECT_TIMEOUT``). The driver (asyncpg) implements
libpq's modes itself: the parameters reach it as libpq spells them, never as keyword arguments it does not
take, and never as start-up parameters (a pooler such as PgBouncer refuses those it does not know).
``sslrootcert=system`` (libpq 16) trusts the system's roots and needs ``verify-full``. Anything else, or a
contradiction, is refused before any connection with a ``ConfigurationError`` naming the parameter, never
its value.

A connection that fails in TLS is ``store_unavailable`` with a content-free cause (``tls_cause``).

The driver's connection carries the store's timeouts (``Bounds``) per transaction and per lone statement, never
as session state, so it runs alike direct and behind a transaction pooler (``BoundedConnection``).
"""

from __future__ import annotations

import os
import re
import ssl
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import asyncpg
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from kagent_memory_governed.errors import Cause, ConfigurationError

VARIABLE = "KAGENT_GOVERNED_MEMORY_DATABASE_URL"
SCHEME = "postgresql+asyncpg"
MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
TLS_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword")
# libpq's target_session_attrs, which asyncpg implements with libpq's meaning
SESSION_ATTRIBUTES = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
CONNECT_TIMEOUT = 10  # seconds: a silent endpoint (accepts, never answers) costs a command this long, not minutes
# ``ssl`` is asyncpg's own spelling of sslmode (SQLAlchemy's documentation shows ``?ssl=require``)
PARAMETERS = frozenset({"host", "ssl", "connect_timeout", "target_session_attrs", *TLS_PARAMETERS})
_DRIVER_PARAMETERS = ("ssl", "connect_timeout", "target_session_attrs", *TLS_PARAMETERS)  # none stays in ``url``
_FILES = ("sslrootcert", "sslcert", "sslkey")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")
_NAME_MISMATCH = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


def _refuse(problem: str) -> ConfigurationError:
    return ConfigurationError(f"{VARIABLE}: {problem}", code="invalid")


@dataclass(frozen=True)
class DatabaseUrl:
    """A checked database URL: what SQLAlchemy is given (``url``, no driver parameter left in it), the
    libpq TLS parameters the driver is given (``tls``), how long a connection attempt may take
    (``connect_timeout``, seconds, all hosts together) and which host of several to use
    (``target_session_attrs``). ``repr`` shows neither URL nor TLS parameters: both may hold secrets."""

    url: URL = field(repr=False)
    tls: dict[str, str] = field(repr=False)
    connect_timeout: int = CONNECT_TIMEOUT
    target_session_attrs: str | None = None

    def connect_args(self) -> dict[str, Any]:
        """The driver's keyword arguments that carry the TLS parameters: libpq's own spelling in a DSN of
        query parameters only (host, user and password stay explicit arguments from ``url``), or, for
        ``sslrootcert=system``, a context trusting the system's roots and checking the host name."""
        if self.tls.get("sslrootcert") == "system":
            context = ssl.create_default_context()  # CERT_REQUIRED, check_hostname: libpq's verify-full
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            if "sslcert" in self.tls:
                password = self.tls.get("sslpassword", "")
                context.load_cert_chain(self.tls["sslcert"], self.tls["sslkey"], password=lambda: password)
            return {"ssl": context}
        return {"dsn": "postgresql://?" + urlencode(self.tls)} if self.tls else {}

    def driver_args(self) -> dict[str, Any]:
        """Every keyword argument the driver is given from the URL's query: ``connect_args`` and the connection
        attempt's bound (``timeout``) and, when given, ``target_session_attrs``."""
        args = {**self.connect_args(), "timeout": self.connect_timeout}
        if self.target_session_attrs is not None:
            args["target_session_attrs"] = self.target_session_attrs
        return args


def parse(text: str) -> DatabaseUrl:
    """Check a database URL and split off its TLS parameters. Refuses, with a ``ConfigurationError`` naming
    the parameter and never a value: another scheme, an unparsable URL or port, an unknown or repeated
    parameter, an sslmode libpq does not know, ``ssl`` beside ``sslmode``, certificate files with a mode
    that may fall back to plain text, half a client key pair, ``sslpassword`` without ``sslkey``, a
    verifying mode with no root certificate to verify against, files that cannot be read or loaded, a
    ``connect_timeout`` that is not a whole number of seconds from 1 to 3600 and a ``target_session_attrs``
    libpq does not know."""
    if not text.startswith(f"{SCHEME}://"):
        raise _refuse(f"not a {SCHEME}:// URL")
    try:
        url = make_url(text)
        port = url.port
    except ArgumentError:
        raise _refuse("not a URL") from None
    except ValueError:
        raise _refuse("port is not a number") from None
    if port is not None and not 0 < port < 65536:
        raise _refuse("port out of range")
    query = dict(url.query)
    for name, value in query.items():
        if name not in PARAMETERS:
            raise _refuse(f"unknown parameter {name}" if _NAME.fullmatch(name) else "unknown parameter")
        if not isinstance(value, str) and name != "host":  # several hosts: SQLAlchemy's asyncpg multihost form
            raise _refuse(f"{name} given more than once")
    if "ssl" in query and "sslmode" in query:
        raise _refuse("ssl and sslmode contradict each other: give sslmode only")
    tls = {name: str(query[name]) for name in TLS_PARAMETERS if name in query}  # each given once, checked above
    if "ssl" in query:
        tls["sslmode"] = str(query["ssl"])
    _check(tls)
    return DatabaseUrl(
        url.difference_update_query(_DRIVER_PARAMETERS),
        tls,
        _connect_timeout(query.get("connect_timeout")),
        _session_attributes(query.get("target_session_attrs")),
    )


def _connect_timeout(value: object) -> int:
    if value is None:
        return CONNECT_TIMEOUT
    # ASCII digits only: int() would also take " 5", "+5", "5_0" and other scripts' digits
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 3600:
        raise _refuse("connect_timeout is not a whole number of seconds from 1 to 3600")
    return int(value)


def _session_attributes(value: object) -> str | None:
    if value is not None and value not in SESSION_ATTRIBUTES:
        raise _refuse(f"target_session_attrs not one of {', '.join(SESSION_ATTRIBUTES)}")
    return None if value is None else str(value)


def _check(tls: dict[str, str]) -> None:
    mode = tls.get("sslmode")
    if mode is not None and mode not in MODES:
        raise _refuse(f"sslmode not one of {', '.join(MODES)}")
    if tls.get("sslrootcert") == "system":  # libpq 16: the system's roots, and only with host name checks
        mode = tls.setdefault("sslmode", "verify-full")
        if mode != "verify-full":
            raise _refuse("sslrootcert=system needs sslmode=verify-full")
    files = [name for name in (*_FILES, "sslpassword") if name in tls]
    if files and MODES.index(mode or "prefer") < MODES.index("require"):
        raise _refuse(f"{files[0]} needs sslmode require, verify-ca or verify-full (a weaker mode may not use it)")
    if ("sslcert" in tls) != ("sslkey" in tls):
        raise _refuse("sslcert and sslkey go together" if "sslkey" in tls else "sslcert needs sslkey")
    if "sslpassword" in tls and "sslkey" not in tls:
        raise _refuse("sslpassword needs sslkey")
    if mode in ("verify-ca", "verify-full") and "sslrootcert" not in tls and not _default_root():
        raise _refuse(f"sslmode={mode} needs sslrootcert (the CA certificates to verify the server against)")
    for name in _FILES:
        if name in tls and not (name == "sslrootcert" and tls[name] == "system"):
            if not os.access(tls[name], os.R_OK) or not Path(tls[name]).is_file():
                raise _refuse(f"{name} is not a readable file")
    try:
        if "sslrootcert" in tls and tls["sslrootcert"] != "system":
            ssl.create_default_context(cafile=tls["sslrootcert"])
    except (ssl.SSLError, ValueError):
        raise _refuse("sslrootcert holds no PEM certificate") from None
    try:
        if "sslcert" in tls:
            password = tls.get("sslpassword", "")
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
                tls["sslcert"], tls["sslkey"], password=lambda: password
            )
    except (ssl.SSLError, ValueError):
        raise _refuse("sslcert and sslkey do not load (a key that needs sslpassword, or the wrong one?)") from None


def _default_root() -> bool:
    """Whether libpq would find a root certificate without ``sslrootcert``: ``PGSSLROOTCERT`` or
    ``~/.postgresql/root.crt``."""
    if os.environ.get("PGSSLROOTCERT"):
        return True
    return (Path.home() / ".postgresql" / "root.crt").is_file()


# What follows a transaction's BEGIN so that its commit waits for a synchronous standby even where the role's or
# database's default lowered synchronous_commit to off or local; never lowered (remote_apply stays). The read path
# lowers it to off itself afterwards; a lone statement says the same in its WHERE (``replication.durable``).
DURABLE_BEGIN = (
    " SELECT pg_catalog.set_config('synchronous_commit', 'on', true)"
    " WHERE pg_catalog.current_setting('synchronous_commit') IN ('off', 'local');"
)


@dataclass(frozen=True, slots=True)
class Bounds:
    """How long the store waits on the server, in milliseconds, none of it session state. Each transaction sets
    ``statement_timeout``, ``lock_timeout`` and ``idle_in_transaction_session_timeout`` ``LOCAL`` in its
    ``BEGIN`` (the same round trip), so the server keeps them exactly whichever session a pooler lends it. A lone
    statement (``Database.call``: autocommit, no transaction to set them in) is bounded as a whole by the smaller
    of ``statement_ms`` and ``lock_ms``: past it the driver cancels it at the server (through a pooler too) and
    fails with ``timeout``, so neither a lock wait nor the statement outlasts its bound."""

    statement_ms: int
    lock_ms: int
    idle_in_transaction_ms: int = 60000

    def __post_init__(self) -> None:
        for value in (self.statement_ms, self.lock_ms, self.idle_in_transaction_ms):
            if type(value) is not int or not 1 <= value <= 2**31 - 1:  # PostgreSQL's range; 0 would mean never
                raise ValueError("a bound is a whole number of milliseconds from 1 to 2147483647")

    def begin(self) -> str:
        """What follows asyncpg's ``BEGIN ...;`` in the same simple query: the bounds, ``LOCAL`` to it."""
        return (
            f" SET LOCAL statement_timeout = {self.statement_ms};"
            f" SET LOCAL lock_timeout = {self.lock_ms};"
            f" SET LOCAL idle_in_transaction_session_timeout = {self.idle_in_transaction_ms};{DURABLE_BEGIN}"
        )

    @property
    def lone_statement_seconds(self) -> float:
        return min(self.statement_ms, self.lock_ms) / 1000


# set by ``Database.call`` only: the statement it runs is fetched within the bound of a lone statement
LONE_STATEMENT: ContextVar[bool] = ContextVar("lone_statement", default=False)

COMMAND_TIMEOUT = 30  # seconds: the driver's last resort for a statement no other bound covers
# the migration session's connection only (``BoundedConnection.migration``): its statements (a ``VACUUM FULL`` of
# every entry) take what the table needs, within a last resort of hours rather than the driver's 30 s
MIGRATION_TIMEOUT = 6 * 3600.0


class BoundedConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no type hints
    """asyncpg's connection with the store's ``Bounds`` (``_bounds``, set per engine by ``create_engine``): a
    transaction's ``BEGIN`` carries them ``LOCAL`` and is itself answered within the bound of a lone statement (or
    the connection is closed), a lone statement is fetched within its bound."""

    _bounds: Bounds
    migration = False  # set on the migration session's connection, which is discarded after it

    async def execute(self, query: str, *args: Any, **options: Any) -> str:
        if args or not query.startswith("BEGIN"):  # asyncpg's own transaction start is the one rewritten
            return str(await super().execute(query, *args, **options))
        try:  # what the server cannot bound: the wait for a server session (a pooler's), bounded as a lone statement
            return str(await super().execute(query + self._bounds.begin(), timeout=self._bounds.lone_statement_seconds))
        except TimeoutError:
            self.terminate()  # the BEGIN may still run later and leave a transaction open: never reuse the connection
            raise

    async def prepare(self, query: str, **options: Any) -> BoundedStatement:
        bound = self._bounds.lone_statement_seconds
        return BoundedStatement(await super().prepare(query, **options), bound, migration=self.migration)


class BoundedStatement:
    """An asyncpg prepared statement as SQLAlchemy's adapter uses it; run by ``Database.call``, its rows are fetched
    within the bound of a lone statement (asyncpg's ``timeout``: past it, a cancel request to the server)."""

    __slots__ = ("_statement", "_bound", "_migration")

    def __init__(self, statement: Any, bound: float, *, migration: bool = False) -> None:
        self._statement = statement
        self._bound = bound
        self._migration = migration

    def __getattr__(self, name: str) -> Any:
        return getattr(self._statement, name)

    async def fetch(self, *args: Any) -> Any:
        timeout = self._bound if LONE_STATEMENT.get() else (MIGRATION_TIMEOUT if self._migration else None)
        return await self._statement.fetch(*args, timeout=timeout)


def tls_cause(error: BaseException) -> Cause | None:
    """The content-free cause of a connection that failed in TLS, or ``None`` when ``error`` is not one:
    ``tls_hostname_mismatch`` (verify-full: the certificate names another host), ``tls_untrusted_certificate``
    (not signed by a trusted CA), ``tls_handshake_failed``, ``tls_not_offered`` (the server has no TLS) and
    ``tls_required`` (the server accepts this connection only over TLS)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return Cause.TLS_HOSTNAME_MISMATCH if error.verify_code in _NAME_MISMATCH else Cause.TLS_UNTRUSTED_CERTIFICATE
    if isinstance(error, ssl.SSLError):
        return Cause.TLS_HANDSHAKE_FAILED
    if type(error) is ConnectionError and "rejected SSL upgrade" in str(error):
        return Cause.TLS_NOT_OFFERED
    if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError) and str(error).endswith("no encryption"):
        return Cause.TLS_REQUIRED
    return None
