"""The primary's replication as an erasure sees it: what a failover could lose of an acknowledged commit.

An erasure is acknowledged once its fence (the scope disabled, its generation advanced) has committed; its keys are
destroyed in the key store right after. A standby that had not received that commit when the primary failed comes
back, once promoted, with the scope enabled and its rows (keyless: the key store kept no key). Only a synchronous
standby (``synchronous_standby_names`` set, ``synchronous_commit`` at least ``remote_write``) has every acknowledged
commit. ``replication`` reads which the server has, as the store's own role can (no ``pg_read_all_stats``: the
standbys' states may be hidden from it, and are then reported unknown, never guessed), in one statement, and
describes it in one content-free line (no host or application name): ``doctor``'s and the start-up's.

``durable`` is what a control-plane commit (an erasure's fence, a consent change) needs: its transaction's
``synchronous_commit`` raised to ``on`` where the role's or the database's defaults lowered it to ``off`` or
``local``, and never lowered (``remote_apply`` stays).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, case, func, text

from kagent_memory_governed.errors import GovernedMemoryError

if TYPE_CHECKING:
    from kagent_memory_governed.store.database import Database


class Kind(StrEnum):
    NONE = "none"  # no standby connected, none required
    ASYNCHRONOUS = "asynchronous"  # a standby may lack an acknowledged commit
    SYNCHRONOUS = "synchronous"  # every acknowledged commit is on a synchronous standby too
    STANDBY = "standby"  # this server is in recovery: read-only, memory work fails closed
    UNKNOWN = "unknown"  # it could not be read


SYNCHRONOUS_COMMITS = ("remote_write", "on", "remote_apply")  # the levels that wait for a synchronous standby
LOWERED = ("off", "local")  # the levels that do not

# One statement; what a role without pg_read_all_stats sees of pg_stat_replication is each WAL sender's pid, the rest
# NULL. A WAL sender that only streams a base backup (pg_basebackup) is no standby.
_READ = text(
    "SELECT pg_catalog.pg_is_in_recovery() AS recovery,"
    " pg_catalog.current_setting('synchronous_standby_names') <> '' AS required,"
    " pg_catalog.current_setting('synchronous_commit') AS commit,"
    " count(r.pid) FILTER (WHERE r.state IS DISTINCT FROM 'backup') AS standbys,"
    " count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum')) AS synchronous,"
    " count(r.pid) FILTER (WHERE r.sync_state IS NULL) AS hidden"
    " FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_stat_replication AS r ON true"
)


@dataclass(frozen=True, slots=True)
class Replication:
    """The replication a commit of the store's control plane gets: its ``kind``; ``commit``, the
    ``synchronous_commit`` it runs with; ``required``, whether ``synchronous_standby_names`` names a synchronous
    standby; ``standbys``, the standbys connected; ``synchronous``, how many of them are synchronous (``None``: hidden
    from this role); ``cause``, why it is ``unknown``."""

    kind: Kind
    commit: str | None = None
    required: bool = False
    standbys: int = 0
    synchronous: int | None = None
    cause: str | None = None

    @property
    def line(self) -> str:
        """The kind and what it means for erasures, in one content-free line."""
        if self.kind is Kind.NONE:
            return "none (no standby: a failover has no copy to lose an erasure in)"
        if self.kind is Kind.ASYNCHRONOUS:
            why = f"synchronous_commit {self.commit}" if self.required else "no synchronous standby required"
            lost = "a failover can lose acknowledged erasures; run sweep after one to bring every scope forward"
            return f"asynchronous ({why}: {lost})"
        if self.kind is Kind.SYNCHRONOUS:
            if self.synchronous is None:
                connected = "whether a synchronous standby is connected is hidden from this role"
            elif self.synchronous:
                connected = f"{self.synchronous} synchronous standby connected"
            else:
                connected = "no synchronous standby connected: commits wait for one"
            return f"synchronous {self.commit} ({connected})"
        if self.kind is Kind.STANDBY:
            return "standby (this server is in recovery: read-only, memory work fails closed)"
        return f"unknown ({self.cause or 'unreadable'}: erasures may not survive a failover)"


async def replication(db: Database) -> Replication:
    """The primary's replication, read in a transaction as a control-plane commit runs (its ``synchronous_commit``
    is theirs). Never raises for the database: unreadable, it is ``unknown`` with the failure's cause."""
    try:
        async with db.transaction() as conn:
            row = (await conn.execute(_READ)).one()
    except GovernedMemoryError as error:
        return Replication(Kind.UNKNOWN, cause=error.cause or error.reason.value)
    return classify(row.recovery, row.required, row.commit, row.standbys, row.synchronous, row.hidden)


def classify(recovery: bool, required: bool, commit: str, standbys: int, synchronous: int, hidden: int) -> Replication:
    """The kind: ``standby`` in recovery; ``synchronous`` when ``synchronous_standby_names`` requires one and
    ``commit`` waits for it; else ``asynchronous`` with a standby connected or required, ``none`` without."""
    if recovery:
        return Replication(Kind.STANDBY, commit, required, standbys)
    known = None if hidden and not synchronous else synchronous  # a hidden sender may be synchronous
    if required and commit in SYNCHRONOUS_COMMITS:
        return Replication(Kind.SYNCHRONOUS, commit, required, standbys, known)
    if required or standbys:
        return Replication(Kind.ASYNCHRONOUS, commit, required, standbys, known if required else 0)
    return Replication(Kind.NONE, commit)


def durable() -> ColumnElement[bool]:
    """A condition that is true and raises its transaction's ``synchronous_commit`` to ``on`` when lowered to ``off``
    or ``local``: in a lone statement's ``WHERE`` (``Database.call``, autocommit), its commit then waits for a
    synchronous standby; an unchanged level is set to itself, so ``remote_apply`` stays."""
    level = func.pg_catalog.current_setting("synchronous_commit")
    raised = case((level.in_(LOWERED), "on"), else_=level)
    return func.pg_catalog.set_config("synchronous_commit", raised, True).is_not(None)
