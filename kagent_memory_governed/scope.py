"""Typed identity: who (principal), which agent, and where (scope). Together, the authorization key.

Values are parsed once, strictly, and are then trusted. A parse failure is a
``GovernedMemoryError(bad_input)`` and never echoes the input.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from enum import StrEnum

from kagent_memory_governed.errors import GovernedMemoryError, Reason

_MAX_ID_BYTES = 255  # Matrix caps user and room ids at 255 bytes
# Server name: DNS name, IPv4 or [IPv6] literal, optional port (Matrix spec, appendix "Server Name").
_DNS_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
_SERVER = rf"(?:{_DNS_NAME}|\[[0-9A-Fa-f:.]{{2,45}}\])(?::[0-9]{{1,5}})?"
_MXID = re.compile(rf"@(?P<local>[a-z0-9._=\-/+]+):(?P<server>{_SERVER})")
_ROOM_ID = re.compile(rf"![A-Za-z0-9._~+/=\-]+(?::{_SERVER})?")  # room v12 ids have no server part
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?")
_SCOPE_NAMESPACE = uuid.UUID("6f1d7c1e-4a59-5b8e-9a53-0c7b5f0e2a11")


def _refuse() -> GovernedMemoryError:
    return GovernedMemoryError(Reason.BAD_INPUT)


def _ascii_fullmatch(pattern: re.Pattern[str], value: object) -> str:
    if not isinstance(value, str) or not value.isascii() or len(value) > _MAX_ID_BYTES:
        raise _refuse()
    if pattern.fullmatch(value) is None:
        raise _refuse()
    return value


class Origin(StrEnum):
    """How the principal reached the bridge. The same MXID under another origin is another principal."""

    NATIVE = "native"
    APPSERVICE = "appservice"


@dataclass(frozen=True, slots=True)
class Principal:
    """A complete Matrix user id ``@local:server`` plus its origin. A bare localpart is refused."""

    mxid: str
    origin: Origin

    @classmethod
    def parse(cls, mxid: object, origin: object) -> Principal:
        mxid = _ascii_fullmatch(_MXID, mxid)
        try:
            return cls(mxid, Origin(origin))  # type: ignore[arg-type]  # anything else is a ValueError
        except ValueError:
            raise _refuse() from None

    @property
    def server(self) -> str:
        return self.mxid.split(":", 1)[1]


@dataclass(frozen=True, slots=True)
class AgentId:
    """An exact kagent Agent identity, ``namespace/name`` (a DNS label and a DNS subdomain)."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, value: object) -> AgentId:
        if not isinstance(value, str) or value.count("/") != 1:
            raise _refuse()
        namespace, name = value.split("/")
        return cls(_ascii_fullmatch(_DNS_LABEL, namespace), _ascii_fullmatch(_DNS_SUBDOMAIN, name))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ScopeKind(StrEnum):
    """The only kind of scope for now. Cross-room scopes need a canonical-person binding first (ADR 0023)."""

    CONTROL_ROOM = "control-room"


@dataclass(frozen=True, slots=True)
class ControlRoom:
    """One exact Matrix room id; nothing is inherited from a Space, homeserver or localpart."""

    room_id: str

    @classmethod
    def parse(cls, room_id: object) -> ControlRoom:
        return cls(_ascii_fullmatch(_ROOM_ID, room_id))

    kind = ScopeKind.CONTROL_ROOM

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.room_id}"


@dataclass(frozen=True, slots=True)
class ScopeKey:
    """The authorization key: (principal, agent, scope). Equal keys, and only equal keys, share memory."""

    principal: Principal
    agent: AgentId
    room: ControlRoom

    @property
    def scope_id(self) -> uuid.UUID:
        """A stable opaque id of the key, the same on every replica (the store's partition key)."""
        parts = (
            self.principal.mxid,
            self.principal.origin.value,
            str(self.agent),
            self.room.kind.value,
            self.room.room_id,
        )
        return uuid.uuid5(_SCOPE_NAMESPACE, "\x00".join(("v1", *parts)))

    @property
    def sender_agent_id(self) -> uuid.UUID:
        """A stable opaque id of (principal, agent), every room included: the explicit-operation rate key."""
        parts = (self.principal.mxid, self.principal.origin.value, str(self.agent))
        return uuid.uuid5(_SCOPE_NAMESPACE, "\x00".join(("v1-sender-agent", *parts)))
