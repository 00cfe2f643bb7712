"""The control API the bridge calls, under ``/memory/v1`` on the agent's HTTP app (CONTRACT.md).

The scope acted on comes from the bearer token's verified claims only; no path, query or body can
name another. Each token names the one operation it was minted for (``op``); tokens that change
something (consent and every erasure) are accepted once per token id across replicas. A body is read no
further than ``MAX_BODY_BYTES``, before authentication, and nothing else is read before authentication.
Every error under ``/memory/v1`` is ``{"error": <reason code>}`` and nothing else, unknown routes and
wrong methods included.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar, get_type_hints

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    create_model,
)
from starlette.routing import Match

from kagent_memory_governed import clock
from kagent_memory_governed.assertion import LEEWAY_SECONDS, Assertion, Operation, Trust, verify
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.store import MAX_PAGE, Status, Store

PREFIX = "/memory/v1"
MAX_BODY_BYTES = 1024

STATUS_CODES: dict[Reason, int] = {
    Reason.NO_ASSERTION: 401,
    Reason.BAD_ASSERTION: 401,
    Reason.ASSERTION_REPLAYED: 401,
    Reason.PRINCIPAL_NOT_ADMITTED: 403,
    Reason.SCOPE_MISMATCH: 403,
    Reason.NOT_FOUND: 404,
    Reason.METHOD_NOT_ALLOWED: 405,
    Reason.CONSENT_MISSING: 409,
    Reason.CONSENT_DISABLED: 409,
    Reason.CONSENT_STALE: 409,
    Reason.CONSENT_EXPIRED: 409,
    Reason.ERASURE_PENDING: 409,
    Reason.ENTRY_CAP_REACHED: 409,
    Reason.BODY_TOO_LARGE: 413,
    Reason.BAD_INPUT: 422,
    Reason.CONFIRMATION_REQUIRED: 422,
    Reason.FACT_TOO_LARGE: 422,
    Reason.RATE_LIMITED: 429,
    Reason.HOURLY_CEILING: 429,
    Reason.INTERNAL_ERROR: 500,
}  # everything else (store_unavailable, erasure_failed, schema_outdated, ...) is 503


def error_response(reason: Reason, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": reason.value}, status_code=STATUS_CODES.get(reason, 503), headers=headers)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class _MethodNotAllowed(GovernedMemoryError):
    """A known call under another method: 405 ``method_not_allowed``, with the methods it takes as ``Allow``."""

    def __init__(self, allowed: set[str]) -> None:
        super().__init__(Reason.METHOD_NOT_ALLOWED)
        self.allowed = allowed


async def _read_body(request: Request) -> bytes:
    """The body, read no further than ``MAX_BODY_BYTES``: a larger one is ``body_too_large`` and is never
    held, whether it declares its length or streams."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isascii() or not declared.isdigit()):
        raise GovernedMemoryError(Reason.BAD_INPUT)
    if declared is not None and int(declared) > MAX_BODY_BYTES:
        raise GovernedMemoryError(Reason.BODY_TOO_LARGE)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise GovernedMemoryError(Reason.BODY_TOO_LARGE)
    return bytes(body)


class _ReasonCodeRoute(APIRoute):
    """Reads the body within its limit first, then runs the route; turns every refusal into
    ``{"error": code}``; an unexpected failure becomes ``internal_error``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                request.state.governed_memory_body = await _read_body(request)
                return await handler(request)
            except _MethodNotAllowed as refused:
                return error_response(refused.reason, {"Allow": ", ".join(sorted(refused.allowed))})
            except GovernedMemoryError as refused:
                return error_response(refused.reason)
            except Exception:  # never a traceback or exception text to the caller
                return error_response(Reason.INTERNAL_ERROR)

        return guarded


class _Input(BaseModel):
    """What a caller sends: exactly these members, each of exactly its JSON type."""

    model_config = ConfigDict(extra="forbid", strict=True)


In = TypeVar("In", bound=_Input)


def _true(confirm: bool) -> bool:
    if not confirm:  # strict has refused 1, "true" and null already: a confirmation is JSON true itself
        raise ValueError("not confirmed")
    return confirm


def _decimal(raw: object) -> object:
    """``05`` is 5; any other spelling (``+5``, `` 5``, ``1e1``, ``5.0``) stays a string, which strict int refuses."""
    return int(raw) if isinstance(raw, str) and re.fullmatch("[0-9]{1,3}", raw) else raw


class ConsentBody(_Input):
    purpose: str  # the label's own rule (consent.admit_label) is the store's
    policy_version: str


class ConfirmBody(_Input):
    confirm: Annotated[bool, AfterValidator(_true)]


class PageQuery(_Input):
    limit: Annotated[int, BeforeValidator(_decimal), Field(ge=1, le=MAX_PAGE)] = MAX_PAGE
    cursor: str | None = None


class _Answer(BaseModel):
    """An answer read from the store's value (its attributes); the constants the contract promises are defaults."""

    model_config = ConfigDict(from_attributes=True, json_schema_serialization_defaults_required=True)


Timestamp = Annotated[datetime, PlainSerializer(rfc3339, return_type=str)]


def _answer_of(value: type, **retyped: Any) -> type[_Answer]:
    """The answer with the fields of the store's dataclass ``value``, in its order, some ``retyped`` for the wire."""
    hints = get_type_hints(value)
    fields = {field.name: (retyped.get(field.name, hints[field.name]), ...) for field in dataclasses.fields(value)}
    return create_model(f"{value.__name__}Answer", __base__=_Answer, __module__=__name__, **fields)


class ConsentAnswer(_Answer):
    enabled: Literal[True] = True
    generation: int
    max_expiry_seconds: int
    entry_cap: int


class ErasureState(_Answer):
    at: Timestamp
    result: Erasure


StatusAnswer = _answer_of(Status, last_erasure=ErasureState | None)


class EntryAnswer(_Answer):
    id: uuid.UUID = Field(validation_alias="entry_id")
    text: str
    source_scope: str
    created_at: Timestamp
    expires_at: Timestamp


class EntriesAnswer(_Answer):
    entries: list[EntryAnswer]
    next_cursor: str | None


class DeletedAnswer(_Answer):
    deleted: Literal[True] = True
    verified: Literal[True] = True
    generation: int  # beyond CONTRACT.md: every erasure fences, so later assertions need the new generation


class ForgetAllAnswer(_Answer):
    erased: int
    verified: Literal[True] = True
    generation: int  # as above


class OffAnswer(_Answer):
    enabled: Literal[False] = False
    generation: int
    erased: int
    verified: Literal[True] = True


class OffboardAnswer(_Answer):
    scopes: int
    erased: int
    verified: Literal[True] = True


class ErrorAnswer(BaseModel):
    error: str


def _body_schema(model: type[_Input]) -> dict[str, Any]:
    content = {"application/json": {"schema": model.model_json_schema()}}  # additionalProperties: false
    return {"requestBody": {"required": True, "content": content}}


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):  # {"confirm": false, "confirm": true} must not mean whichever came last
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return members


def _no_constant(name: str) -> Any:
    raise GovernedMemoryError(Reason.BAD_INPUT)  # NaN, Infinity: not JSON


def _parsed(model: type[In], members: Any) -> In:
    """``members`` valid as ``model``. The one place a validation error becomes a reason code: a ``confirm``
    missing or other than ``true``, with nothing else wrong, is ``confirmation_required``; all else ``bad_input``."""
    try:
        return model.model_validate(members)
    except ValidationError as invalid:
        confirm_only = all(e["loc"] == ("confirm",) and e["type"] != "extra_forbidden" for e in invalid.errors())
        raise GovernedMemoryError(Reason.CONFIRMATION_REQUIRED if confirm_only else Reason.BAD_INPUT) from None


def _body(request: Request, model: type[In]) -> In:
    """The body (already read within its limit): one JSON object with unique members, valid as ``model``."""
    try:
        members = json.loads(
            request.state.governed_memory_body, object_pairs_hook=_unique_members, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    return _parsed(model, members)


_EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]
_CREDENTIALS = Depends(HTTPBearer(auto_error=False, description="A JWS signed by the bridge (CONTRACT.md)"))


def router(store: Store, trust: Trust) -> APIRouter:
    """The ``/memory/v1`` routes over ``store``, trusting tokens signed with ``trust``'s key."""
    errors = {code: {"model": ErrorAnswer} for code in (401, 403, 404, 409, 413, 422, 429, 503)}
    api = APIRouter(prefix=PREFIX, tags=["governed memory"], route_class=_ReasonCodeRoute, responses=errors)

    def authorized(op: Operation) -> Callable[..., Coroutine[Any, Any, Assertion]]:
        """The verified token for ``op``; a single-use token is spent here, before the call does anything."""
        purpose = "offboard" if op is Operation.OFFBOARD else "control"

        async def dependency(
            request: Request, credentials: HTTPAuthorizationCredentials | None = _CREDENTIALS
        ) -> Assertion:
            token = credentials.credentials if credentials else None
            assertion = verify(token, trust, now=clock.now(), purpose=purpose, op=op)
            if assertion.entry is not None and str(assertion.entry) != request.path_params.get("entry_id"):
                raise GovernedMemoryError(Reason.BAD_ASSERTION)  # minted for another entry: refused unspent
            if op.single_use:
                valid_until = assertion.expires_at + timedelta(seconds=LEEWAY_SECONDS)
                await store.claim_once(assertion.jti, valid_until)
            return assertion

        return dependency

    token_for = {op: Depends(authorized(op)) for op in Operation}

    @api.post("/consent", response_model=ConsentAnswer, openapi_extra=_body_schema(ConsentBody))
    async def consent(request: Request, assertion: Assertion = token_for[Operation.CONSENT]) -> ConsentAnswer:
        """Explicit, versioned consent for the token's scope; advances the generation."""
        body = _body(request, ConsentBody)
        grant = await store.grant(assertion.key, purpose=body.purpose, policy_version=body.policy_version)
        return ConsentAnswer.model_validate(grant)

    @api.get("/status", response_model=StatusAnswer)
    async def status(assertion: Assertion = token_for[Operation.STATUS]) -> _Answer:
        """Consent, limits, live entry count and the last erasure of the token's scope."""
        return StatusAnswer.model_validate(await store.status(assertion.key))

    @api.get("/entries", response_model=EntriesAnswer)
    async def entries(request: Request, assertion: Assertion = token_for[Operation.ENTRIES]) -> EntriesAnswer:
        """One page (``limit`` at most 50) of the scope's live entries, oldest first."""
        query = _parsed(PageQuery, _unique_members(request.query_params.multi_items()))  # each parameter once
        return EntriesAnswer.model_validate(await store.inspect(assertion.key, limit=query.limit, cursor=query.cursor))

    @api.delete("/entries/{entry_id}", response_model=DeletedAnswer)
    async def forget(entry_id: str, assertion: Assertion = token_for[Operation.FORGET]) -> DeletedAnswer:
        """Erase exactly one entry of the token's scope and verify it unreadable."""
        try:
            parsed = uuid.UUID(entry_id)
        except ValueError:
            raise GovernedMemoryError(Reason.BAD_INPUT) from None
        return DeletedAnswer.model_validate(await store.forget(assertion.key, parsed))

    @api.post("/forget-all", response_model=ForgetAllAnswer, openapi_extra=_body_schema(ConfirmBody))
    async def forget_all(request: Request, assertion: Assertion = token_for[Operation.FORGET_ALL]) -> ForgetAllAnswer:
        """Erase every entry of the token's scope (confirmation required); consent stays as it was."""
        _body(request, ConfirmBody)
        return ForgetAllAnswer.model_validate(await store.forget_all(assertion.key))

    @api.post("/off", response_model=OffAnswer, openapi_extra=_body_schema(ConfirmBody))
    async def off(request: Request, assertion: Assertion = token_for[Operation.OFF]) -> OffAnswer:
        """Disable collection first, then erase and verify (confirmation required)."""
        _body(request, ConfirmBody)
        return OffAnswer.model_validate(await store.off(assertion.key))

    @api.post("/offboard", response_model=OffboardAnswer, openapi_extra=_body_schema(ConfirmBody))
    async def offboard(request: Request, assertion: Assertion = token_for[Operation.OFFBOARD]) -> OffboardAnswer:
        """Disable, erase and verify every scope of the token's principal, on every agent (confirmation required)."""
        _body(request, ConfirmBody)
        return OffboardAnswer.model_validate(await store.offboard(assertion.principal))

    known = list(api.routes)

    # Last, so every call above wins: the rest of /memory/v1 answers a reason code, never the app's own 404/405.
    @api.api_route("", methods=_EVERY_METHOD, include_in_schema=False)
    @api.api_route("/{rest:path}", methods=_EVERY_METHOD, include_in_schema=False)
    async def elsewhere(request: Request) -> Response:
        allowed = {m for r in known if r.matches(request.scope)[0] is not Match.NONE for m in r.methods or ()}
        raise _MethodNotAllowed(allowed) if allowed else GovernedMemoryError(Reason.NOT_FOUND)

    return api


def mount(app: FastAPI, store: Store, trust: Trust) -> None:
    """Add the control API to an agent's app (idempotent)."""
    if not getattr(app.state, "governed_memory_control", False):
        app.include_router(router(store, trust))
        app.state.governed_memory_control = True
