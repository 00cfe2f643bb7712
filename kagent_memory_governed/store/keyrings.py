"""Kept keyrings: a scope's keys as this process fetched them from the key store, kept for one consent generation.

A read is fenced at a generation in the statement that returns its ciphertexts, and every erasure advances the
generation before it settles, so a keyring kept for an earlier generation never opens what a read returns after
an erasure, on any replica; it is fetched again instead. A kept keyring is the only copy of a key in a process:
the replica that erases drops it when the erasure starts, every other replica at most ``ttl`` (60 s) after it
fetched it, by a timer on the event loop whether or not the scope is read again, and every replica drops all it
keeps once another database server answers (``Keyrings.serving``: a failover or a restore may bring back rows
whose keys the key store destroyed since). No cipher and no other copy of a key is cached anywhere.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any

from kagent_memory_governed.keys import EntryKey, Keyring, KeyStore


class Keyrings:
    """The keyrings this process fetched, each kept for the consent generation it was fetched under, for at most
    ``ttl`` seconds (then dropped by a timer, read or not) and at most ``size`` scopes, and only while the same
    database server answers (``serving``). ``ring`` joins a fetch under way; a keyring lacking a key a read needs
    is fetched once more (another replica wrote meanwhile)."""

    def __init__(self, store: KeyStore, *, ttl: float = 60.0, size: int = 4096) -> None:
        self.store = store
        self.ttl = ttl
        self._size = size
        self._kept: OrderedDict[uuid.UUID, tuple[int, float, asyncio.Task[Keyring], Keyring]] = OrderedDict()
        self._server: object = None

    def start(self, scope: uuid.UUID, generation: int) -> asyncio.Task[Keyring]:
        """Begin fetching the scope's keyring for ``generation``, or join the fetch kept for it."""
        kept = self._kept.get(scope)
        loop = asyncio.get_running_loop()
        if kept is not None:
            at_generation, fetched, task, _ = kept
            fresh = time.monotonic() - fetched < self.ttl
            failed = task.done() and (task.cancelled() or task.exception() is not None)
            if at_generation == generation and fresh and not failed and task.get_loop() is loop:
                self._kept.move_to_end(scope)
                return task
        task = loop.create_task(self.store.fetch(scope))
        task.add_done_callback(retrieve)
        fetched = time.monotonic()
        self._kept[scope] = (generation, fetched, task, {})
        # the bound holds on a replica nobody reads from; the timer holds no reference to the keyring
        loop.call_later(self.ttl, self._expire, scope, fetched)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return task

    def cancel(self, scope: uuid.UUID, task: asyncio.Task[Keyring]) -> None:
        """Keep nothing of a fetch whose work was refused (others awaiting it still get its answer)."""
        kept = self._kept.get(scope)
        if kept is not None and kept[2] is task:
            del self._kept[scope]

    async def ring(
        self,
        scope: uuid.UUID,
        generation: int,
        *,
        needs: Collection[uuid.UUID] = (),
        task: asyncio.Task[Keyring] | None = None,
    ) -> Keyring:
        """The scope's keyring for a read or write fenced at ``generation``; fetched again, once, if it lacks a key
        of ``needs``."""
        held = self._kept.get(scope)
        if task is None or held is None or held[2] is not task:  # dropped meanwhile: it may be from before
            task = self.start(scope, generation)
        kept: Keyring = await asyncio.shield(task)  # shared: a caller's cancellation stays its own
        keyring = kept | self._extra(scope, task)
        if any(entry not in keyring for entry in needs):
            self.drop(scope)
            keyring = await self.start(scope, generation)
        return keyring

    def add(self, scope: uuid.UUID, generation: int, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        """Keys this process stored for ``scope`` under ``generation``: part of the kept keyring from now on."""
        kept = self._kept.get(scope)
        if kept is not None and kept[0] == generation:
            kept[3].update(keys)

    def drop(self, scope: uuid.UUID) -> None:
        self._kept.pop(scope, None)

    def clear(self) -> None:
        """Keep nothing: the database may have gone back in time (``Database``)."""
        self._kept.clear()

    def serving(self, server: object) -> None:
        """The database server that answered a statement of the hot path (its start time: ``functions.SERVER``).
        Another than the one before, or the first, drops every kept keyring, fetches under way included: after a
        failover, a restore or a restart the database may be behind the key store, and a keyring kept from before
        an erasure it lost would open the rows it brought back. Exact, with no wait: the statement that first
        reaches the new server drops them before its rows are opened."""
        if server != self._server:
            self._server = server
            self._kept.clear()

    def _expire(self, scope: uuid.UUID, fetched: float) -> None:
        kept = self._kept.get(scope)
        if kept is not None and kept[1] == fetched:
            del self._kept[scope]

    def kept(self) -> dict[uuid.UUID, Keyring]:
        """What this process keeps now, by scope: the fetched keyrings that have answered, with the keys added
        since (for health checks and tests; a copy)."""
        return {
            scope: task.result() | extra
            for scope, (_, _, task, extra) in self._kept.items()
            if task.done() and not task.cancelled() and task.exception() is None
        }

    def _extra(self, scope: uuid.UUID, task: asyncio.Task[Keyring]) -> Keyring:
        kept = self._kept.get(scope)
        return kept[3] if kept is not None and kept[2] is task else {}


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback: a failed fetch is raised where it is awaited, never logged as never retrieved."""
    if not task.cancelled():
        task.exception()
