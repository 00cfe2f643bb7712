"""The control API's wire contract, once: every call's method, path, token ``op``, body and answer.

The server (``control``), the bridge's client (``bridge``) and the tests read ``CALLS``; docs/bridge.md
states the same table for people, and a test holds the two together. ``Reason`` (a refusal's ``error``) and
``Cause`` (an operator's category beside it: docs/operator.md, held to it by ``tests/core/test_causes.py``) are the
core's, re-exported here as the names others depend on. Bodies are closed and strictly
typed (the server validates what a caller sends with them); answers are read from the store's values on
the server and from JSON on the client, and timestamps are written as RFC 3339 UTC.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from kagent_memory_governed.assertion import ControlOperation as ControlOperation  # a token's ``op``: the core's
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import Cause as Cause  # an error's operator-facing category: the core's
from kagent_memory_governed.errors import Reason as Reason  # a refusal's code (``Refusal.error``): the core's
from kagent_memory_governed.limits import MAX_PAGE

PREFIX = "/memory/v1"
MAX_BODY_BYTES = 1024


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


Timestamp = Annotated[datetime, PlainSerializer(rfc3339, return_type=str)]


# -- bodies: what a caller sends ---------------------------------------------------------------------


class Body(BaseModel):
    """What a caller sends: exactly these members, each of exactly its JSON type."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _true(confirm: bool) -> bool:
    if not confirm:  # strict has refused 1, "true" and null already: a confirmation is JSON true itself
        raise ValueError("not confirmed")
    return confirm


def _decimal(raw: object) -> object:
    """``05`` is 5; any other spelling (``+5``, `` 5``, ``1e1``, ``5.0``) stays a string, which strict int refuses."""
    return int(raw) if isinstance(raw, str) and re.fullmatch("[0-9]{1,3}", raw) else raw


class ConsentBody(Body):
    purpose: str  # the label's own rule (consent.admit_label) is the store's
    policy_version: str


class ConfirmBody(Body):
    confirm: Annotated[bool, AfterValidator(_true)]


class PageQuery(Body):
    """The query of ``GET /entries``: each parameter at most once."""

    limit: Annotated[int, BeforeValidator(_decimal), Field(ge=1, le=MAX_PAGE)] = MAX_PAGE
    cursor: str | None = None

    def params(self) -> dict[str, str]:
        return {"limit": str(self.limit)} | ({"cursor": self.cursor} if self.cursor is not None else {})


# -- answers: what the server sends back --------------------------------------------------------------


class Answer(BaseModel):
    """An answer, read from a store value (its attributes) or from JSON; constants the contract promises are
    defaults, so the server never has to set them and the client checks them."""

    model_config = ConfigDict(
        frozen=True, from_attributes=True, extra="ignore", json_schema_serialization_defaults_required=True
    )


class Consent(Answer):
    enabled: Literal[True] = True
    generation: int
    max_expiry_seconds: int
    entry_cap: int


class LastErasure(Answer):
    at: Timestamp
    result: Erasure


class ScopeStatus(Answer):
    enabled: bool
    generation: int
    purpose: str | None
    policy_version: str | None
    max_expiry_seconds: int
    entry_cap: int
    entries: int
    last_erasure: LastErasure | None


class Memory(Answer):
    id: uuid.UUID = Field(validation_alias=AliasChoices("id", "entry_id"))
    text: str
    source_scope: str
    created_at: Timestamp
    expires_at: Timestamp


class Memories(Answer):
    entries: list[Memory]
    next_cursor: str | None


class Forgotten(Answer):
    deleted: Literal[True] = True
    verified: Literal[True] = True
    generation: int  # every erasure fences: later scope headers need the new generation


class ForgottenAll(Answer):
    erased: int
    verified: Literal[True] = True
    generation: int


class SwitchedOff(Answer):
    enabled: Literal[False] = False
    generation: int
    erased: int
    verified: Literal[True] = True


class PrincipalOffboarded(Answer):
    scopes: int
    erased: int
    verified: Literal[True] = True


class Refusal(BaseModel):
    """Every error under ``PREFIX``: the reason code and nothing else."""

    error: str


# -- the calls -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the control API: ``method`` on ``PREFIX + path`` with a token minted for ``op``."""

    op: ControlOperation
    method: Literal["GET", "POST", "DELETE"]
    path: str
    answer: type[Answer]
    body: type[Body] | None = None  # a JSON body; ``GET /entries`` takes ``PageQuery`` as its query instead

    @property
    def route(self) -> str:
        return PREFIX + self.path

    @property
    def single_use(self) -> bool:
        return self.op.single_use


CALLS: dict[ControlOperation, Call] = {
    call.op: call
    for call in (
        Call(ControlOperation.CONSENT, "POST", "/consent", Consent, ConsentBody),
        Call(ControlOperation.STATUS, "GET", "/status", ScopeStatus),
        Call(ControlOperation.ENTRIES, "GET", "/entries", Memories),
        Call(ControlOperation.FORGET, "DELETE", "/entries/{entry_id}", Forgotten),
        Call(ControlOperation.FORGET_ALL, "POST", "/forget-all", ForgottenAll, ConfirmBody),
        Call(ControlOperation.OFF, "POST", "/off", SwitchedOff, ConfirmBody),
        Call(ControlOperation.OFFBOARD, "POST", "/offboard", PrincipalOffboarded, ConfirmBody),
    )
}

__all__ = [
    "CALLS",
    "MAX_BODY_BYTES",
    "PREFIX",
    "Answer",
    "Body",
    "Call",
    "Cause",
    "ConfirmBody",
    "Consent",
    "ConsentBody",
    "ControlOperation",
    "Forgotten",
    "ForgottenAll",
    "LastErasure",
    "Memories",
    "Memory",
    "PageQuery",
    "PrincipalOffboarded",
    "Reason",
    "Refusal",
    "ScopeStatus",
    "SwitchedOff",
    "Timestamp",
    "rfc3339",
]
