"""Helpers the tests share: keys, facts, refusals, private directories and a pod's environment."""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from collections.abc import Awaitable
from pathlib import Path

import pytest

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey
from kagent_memory_governed.store import NewFact
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge, embed

_serial = itertools.count()


def private_directory(prefix: str) -> Path:
    """A directory outside pytest's temporary tree, which other pytest sessions of this user may clean up
    while a server still runs in it; removed when this process exits."""
    path = Path(tempfile.mkdtemp(prefix=f"kagent-memory-governed-{prefix}-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def make_key(
    user: str = "alice", *, origin: Origin = Origin.NATIVE, agent: str = "kagent/helper", room: str | None = None
) -> ScopeKey:
    return ScopeKey(
        Principal.parse(f"@{user}:example.org", origin.value),
        AgentId.parse(agent),
        ControlRoom.parse(room or f"!room{next(_serial)}:example.org"),
    )


def facts(*texts: str) -> list[NewFact]:
    return [NewFact(text, embed(text)) for text in texts]


async def refusal(work: Awaitable[object]) -> Reason:
    """The reason code ``work`` was refused with; fails the test if it was admitted."""
    with pytest.raises(GovernedMemoryError) as refused:
        await work
    assert str(refused.value) == refused.value.reason.value  # the code is the whole message
    return refused.value.reason


def pod_environment(tmp_path: Path, bridge: Bridge, database_url: str, **extra: str) -> dict[str, str]:
    """The environment of an agent pod trusting ``bridge``: activation on, the key mounted as a file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}
    key = tmp_path / "bridge.pem"
    key.write_text(bridge.public_pem)
    env.update(
        KAGENT_GOVERNED_MEMORY="on",
        KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url,
        KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY=f"@{key}",
        KAGENT_GOVERNED_MEMORY_BRIDGE_ISSUER=ISSUER,
        KAGENT_GOVERNED_MEMORY_HOMESERVER=HOMESERVER,
        KAGENT_URL="http://controller.invalid",
        KAGENT_NAMESPACE="kagent",
        KAGENT_NAME="helper",
    )
    env.update(extra)
    return env
