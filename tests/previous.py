"""Previous releases of this package, for real: the package at a given commit of this repository, installed into
a virtualenv of its own with that commit's lock, and driven in a process of its own with that virtualenv's python.

``python_of(commit)`` builds it once per test session, in a private directory outside pytest's temporary tree:
``git archive <commit>`` (this repository's own history: nothing fetched but locked packages from the registry,
which uv's cache usually holds), then ``uv pip install -c <that commit's locks/kagent-adk-0.10.4.txt>
'<archive>[testing]'``: that commit's code and that commit's pins, nothing of this checkout's.

``drive(commit, phase, request)`` runs this very file as a script with that python (``python -P``, from a directory
outside the checkout, so nothing of this checkout can be imported) and returns what the phase answered. The phases
use only the previous release's public API: ``Store`` and the control API (``control.mount``, served over ASGI and
called with the tokens its own ``bridge.ScopeSigner`` signs), as a replica and a bridge of that release would, and
``RemoteStore``, as its agent runtime reaches a memory service.
Every call's answer is recorded as the bridge or the operator sees it: ``[status, body]`` of a control call,
``["ok", value]`` or ``["refused", "<reason> (<cause>)"]`` of a store call, and ``["crashed", "<type>"]`` for
anything else, which a test then fails on.

Only the standard library is imported at module level: the same file is the previous release's driver.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".venv-tools" / "bin" / "uv"
LOCK = "locks/kagent-adk-0.10.4.txt"
ISSUER = "matrix-bridge.example"
HOMESERVER = "example.org"
AGENT = "kagent/helper"

_BUILT: dict[str, Path] = {}


def python_of(commit: str) -> Path:
    """The python of a virtualenv holding this repository's package as of ``commit`` (and that commit's pins)."""
    if commit not in _BUILT:
        from support import private_directory

        home = private_directory(f"release-{commit}")
        source, venv = home / "source", home / "venv"
        source.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True)
        if archive.returncode != 0:  # a shallow clone: the test needs the release's commit, fetched
            raise LookupError(f"commit {commit} is not in this checkout's history (git fetch --unshallow)")
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True, capture_output=True)
        lock = source / LOCK
        if not lock.is_file():
            raise FileNotFoundError(f"{commit} has no {LOCK}")
        python = str(Path(sys.executable).resolve())  # the interpreter of this release's virtualenv
        subprocess.run([str(UV), "venv", "-q", "--python", python, str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
            + ["-c", str(lock), f"{source}[testing]"],
            check=True,
            capture_output=True,
        )
        _BUILT[commit] = venv / "bin" / "python"
    return _BUILT[commit]


def drive(commit: str, phase: str, request: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Run ``phase`` of this driver with the previous release ``commit``; ``env`` holds its package settings
    (nothing of this process's ``KAGENT_GOVERNED_MEMORY*`` reaches it)."""
    python = python_of(commit)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KAGENT_GOVERNED_MEMORY", "PYTHON"))}
    done = subprocess.run(
        [str(python), "-P", str(Path(__file__).resolve()), phase],
        input=json.dumps(request),
        env={**clean, **env},
        cwd=python.parent,  # not the checkout: its package must not shadow the installed one
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise AssertionError(f"{commit} {phase} exited {done.returncode}:\n{done.stderr[-4000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


# -- the previous release's side: everything below runs in its process, importing its package --------------------


def _key(subject: dict[str, str]) -> Any:
    from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey

    principal = Principal.parse(subject["mxid"], Origin.NATIVE.value)
    return ScopeKey(principal, AgentId.parse(AGENT), ControlRoom.parse(subject["room"]))


async def _store_call(work: Any) -> list[Any]:
    from kagent_memory_governed.errors import GovernedMemoryError

    try:
        return ["ok", await work]
    except GovernedMemoryError as refused:
        cause = getattr(refused, "cause", None)
        return ["refused", f"{refused.reason.value} ({cause})" if cause else refused.reason.value]
    except Exception as error:  # what the phase is there to find out
        return ["crashed", type(error).__name__]


class _Replica:
    """The previous release as one replica serves it: its store and its control API, and a bridge signing for it."""

    def __init__(self, url: str) -> None:
        import httpx
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from fastapi import FastAPI

        from kagent_memory_governed.assertion import Trust
        from kagent_memory_governed.bridge import ScopeSigner
        from kagent_memory_governed.control import mount
        from kagent_memory_governed.policy import Policy
        from kagent_memory_governed.scope import AgentId
        from kagent_memory_governed.store import Store

        bridge_key = Ed25519PrivateKey.generate()
        # its own key store setting, if it knows any: the previous release's connect, checked against this one's
        self.store = Store.connect(url, Policy())  # type: ignore[call-arg]
        self.signer = ScopeSigner(bridge_key, ISSUER, AGENT)
        app = FastAPI()
        mount(app, self.store, Trust(bridge_key.public_key(), ISSUER, AgentId.parse(AGENT), HOMESERVER))
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")

    async def control(self, subject: dict[str, str], op: str, method: str, path: str, body: Any = None) -> list[Any]:
        from kagent_memory_governed.bridge import Subject

        token = self.signer.control(Subject(subject["mxid"], subject["room"]), op)  # type: ignore[arg-type]
        answer = await self.http.request(
            method, f"/memory/v1/{path}", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        try:
            return [answer.status_code, answer.json()]
        except ValueError:
            return [answer.status_code, answer.text[:200]]

    async def close(self) -> None:
        await self.http.aclose()
        await self.store.close()


async def _seed(request: dict[str, Any]) -> dict[str, Any]:
    """Migrate a fresh database to this release's head and write each scope's facts (their embeddings given in
    ``vectors``: the caller's, as a model's embedder gives them) under a consent granted through the control API;
    ``expired`` facts under a clock an hour back, with a minute's expiry."""
    from datetime import UTC, datetime, timedelta

    from freezegun import freeze_time

    from kagent_memory_governed.store import NewFact

    vectors = request["vectors"]
    replica = _Replica(request["url"])
    try:
        answer: dict[str, Any] = {"revision": await replica.store.migrate(), "scopes": {}}
        for name, scope in request["scopes"].items():
            key = _key(scope)
            grant = {"purpose": "p", "policy_version": "1"}
            consent = await replica.control(scope, "consent", "POST", "consent", grant)
            assert consent[0] == 200, consent
            generation = consent[1]["generation"]
            ids: dict[str, str] = {}
            if scope.get("expired"):
                with freeze_time(datetime.now(UTC) - timedelta(hours=1), real_asyncio=True):
                    facts = [NewFact(text, vectors[text]) for text in scope["expired"]]
                    written = await replica.store.write(key, generation, facts, expires_in=60)
                ids |= {text: str(entry) for text, entry in zip(scope["expired"], written, strict=True)}
            facts = [NewFact(text, vectors[text]) for text in scope["facts"]]
            written = await replica.store.write(key, generation, facts)
            ids |= {text: str(entry) for text, entry in zip(scope["facts"], written, strict=True)}
            answer["scopes"][name] = {"scope_id": str(key.scope_id), "generation": generation, "entries": ids}
        return answer
    finally:
        await replica.close()


async def _serve(request: dict[str, Any]) -> dict[str, Any]:
    """The previous release beside the database another release migrated: its readiness, its reads, each of its
    erasures (with the scope's status after it), and its sweep, each answer as recorded."""
    from kagent_memory_governed.store import NewFact

    scopes, seeded, vectors = request["scopes"], request["seeded"], request["vectors"]
    replica = _Replica(request["url"])
    try:
        store, control = replica.store, replica.control
        kept = scopes["kept"]
        answers: dict[str, Any] = {
            "ready": await _store_call(store.check_ready()),
            "status": await control(kept, "status", "GET", "status"),
            "entries": await control(kept, "entries", "GET", "entries"),
            "search": await _store_call(
                store.search(_key(kept), seeded["kept"]["generation"], vectors[kept["facts"][0]])
            ),
        }
        forgotten = seeded["forget"]["entries"][scopes["forget"]["forget"]]
        later = [NewFact(text, vectors[text]) for text in kept["later"]]
        answers["write"] = await _store_call(store.write(_key(kept), seeded["kept"]["generation"], later))
        answers["forget"] = await control(scopes["forget"], "forget", "DELETE", f"entries/{forgotten}")
        answers["entries_forgetting"] = await control(scopes["forget"], "entries", "GET", "entries")
        confirm = {"confirm": True}
        answers["forget_all"] = await control(scopes["forget_all"], "forget-all", "POST", "forget-all", confirm)
        answers["off"] = await control(scopes["off"], "off", "POST", "off", confirm)
        answers["offboard"] = await control(scopes["offboard_1"], "offboard", "POST", "offboard", confirm)
        answers["after"] = {
            name: await control(scopes[name], "status", "GET", "status")
            for name in ("forget", "forget_all", "off", "offboard_1", "offboard_2")
        }
        answers["sweep"] = await _store_call(store.sweep())
        return answers
    finally:
        await replica.close()


async def _runtime(request: dict[str, Any]) -> dict[str, Any]:
    """The previous release's agent runtime against a memory service: its ``RemoteStore`` (two calls an operation,
    the runtime embedding), each answer as recorded."""
    from kagent_memory_governed.service import remote
    from kagent_memory_governed.store import NewFact

    client = remote.RemoteStore.connect(request["url"], token_file=Path(request["token_file"]))
    key, generation, vector = _key(request["scope"]), request["generation"], request["vector"]
    remote.carry(request["token"])
    try:
        return {
            "admit save": await _store_call(client.admit(key, generation, "save", units=1, explicit=True)),
            "write": await _store_call(client.write(key, generation, [NewFact(request["fact"], vector)])),
            "admit load": await _store_call(client.admit(key, generation, "load", units=1, explicit=True)),
            "search": await _store_call(client.search_many(key, generation, [vector])),
        }
    finally:
        await client.close()


def _json(value: Any) -> Any:
    import dataclasses
    import uuid
    from datetime import datetime

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, uuid.UUID | datetime):
        return str(value)
    return value


if __name__ == "__main__":
    phase = {"seed": _seed, "serve": _serve, "runtime": _runtime}[sys.argv[1]]
    sys.stdout.write(json.dumps(_json(asyncio.run(phase(json.loads(sys.stdin.read()))))) + "\n")
