"""The control API the bridge calls, under ``/memory/v1`` on the agent's HTTP app: the calls of
``contract.CALLS``, each over the store.

The scope acted on comes from the bearer token's verified claims only; no path, query or body can
name another. Each token names the one operation it was minted for (``op``); tokens that change
something (consent and every erasure) are accepted once per token id across replicas. A body is read no
further than ``MAX_BODY_BYTES``, before authentication, and nothing else is read before authentication.
Every error under ``/memory/v1`` is ``{"error": <reason code>}`` and nothing else, unknown routes and
wrong methods included.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.routing import Match

from kagent_memory_governed import clock
from kagent_memory_governed.assertion import LEEWAY_SECONDS, Assertion, Trust, verify
from kagent_memory_governed.contract import (
    CALLS,
    MAX_BODY_BYTES,
    PREFIX,
    Answer,
    Body,
    Call,
    ConfirmBody,
    ConsentBody,
    ControlOperation,
    PageQuery,
    Refusal,
)
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store

In = TypeVar("In", bound=Body)

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


def _body_schema(model: type[Body]) -> dict[str, Any]:
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
_CREDENTIALS = Depends(HTTPBearer(auto_error=False, description="A JWS signed by the bridge (docs/bridge.md)"))


def router(store: Store, trust: Trust | Callable[[object], Trust]) -> APIRouter:
    """The ``/memory/v1`` routes of ``contract.CALLS`` over ``store``, trusting tokens signed with ``trust``'s key:
    one agent's ``Trust``, or, for a service of several agents, the ``Trust`` of the agent a token names (refusing
    ``bad_assertion`` for one it does not serve); either way the token is then verified against it in full."""
    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": Refusal} for code in (401, 403, 404, 409, 413, 422, 429, 503)
    }
    api = APIRouter(tags=["governed memory"], route_class=_ReasonCodeRoute, responses=errors)

    def authorized(op: ControlOperation) -> Callable[..., Coroutine[Any, Any, Assertion]]:
        """The verified token for ``op``; a single-use token is spent here, before the call does anything."""

        async def dependency(
            request: Request, credentials: HTTPAuthorizationCredentials | None = _CREDENTIALS
        ) -> Assertion:
            token = credentials.credentials if credentials else None
            trusted = trust if isinstance(trust, Trust) else trust(token)
            assertion = verify(token, trusted, now=clock.now(), purpose=op.purpose, op=op)
            if assertion.entry is not None and str(assertion.entry) != request.path_params.get("entry_id"):
                raise GovernedMemoryError(Reason.BAD_ASSERTION)  # minted for another entry: refused unspent
            if op.single_use:
                valid_until = assertion.expires_at + timedelta(seconds=LEEWAY_SECONDS)
                await store.claim_once(assertion.jti, valid_until)
            return assertion

        return dependency

    async def consent(request: Request, assertion: Assertion) -> object:
        """Explicit, versioned consent for the token's scope; advances the generation."""
        body = _body(request, ConsentBody)
        return await store.grant(_key(assertion), purpose=body.purpose, policy_version=body.policy_version)

    async def status(request: Request, assertion: Assertion) -> object:
        """Consent, limits, live entry count and the last erasure of the token's scope."""
        return await store.status(_key(assertion))

    async def entries(request: Request, assertion: Assertion) -> object:
        """One page (``limit`` at most 50) of the scope's live entries, oldest first."""
        query = _parsed(PageQuery, _unique_members(request.query_params.multi_items()))  # each parameter once
        return await store.inspect(_key(assertion), limit=query.limit, cursor=query.cursor)

    async def forget(request: Request, assertion: Assertion) -> object:
        """Erase exactly one entry of the token's scope and verify it unreadable."""
        try:
            entry_id = uuid.UUID(request.path_params["entry_id"])
        except ValueError:
            raise GovernedMemoryError(Reason.BAD_INPUT) from None
        return await store.forget(_key(assertion), entry_id)

    async def forget_all(request: Request, assertion: Assertion) -> object:
        """Erase every entry of the token's scope (confirmation required); consent stays as it was."""
        _body(request, ConfirmBody)
        return await store.forget_all(_key(assertion))

    async def off(request: Request, assertion: Assertion) -> object:
        """Disable collection first, then erase and verify (confirmation required)."""
        _body(request, ConfirmBody)
        return await store.off(_key(assertion))

    async def offboard(request: Request, assertion: Assertion) -> object:
        """Disable, erase and verify every scope of the token's principal, on every agent (confirmation required)."""
        _body(request, ConfirmBody)
        return await store.offboard(assertion.principal)

    handlers: dict[ControlOperation, Callable[[Request, Assertion], Coroutine[Any, Any, object]]] = {
        ControlOperation.CONSENT: consent,
        ControlOperation.STATUS: status,
        ControlOperation.ENTRIES: entries,
        ControlOperation.FORGET: forget,
        ControlOperation.FORGET_ALL: forget_all,
        ControlOperation.OFF: off,
        ControlOperation.OFFBOARD: offboard,
    }
    for call in CALLS.values():
        api.add_api_route(
            call.route,
            _endpoint(call, handlers[call.op], Depends(authorized(call.op))),
            methods=[call.method],
            response_model=call.answer,
            name=call.op.value,
            description=handlers[call.op].__doc__,
            openapi_extra=_body_schema(call.body) if call.body else None,
        )

    known = [route for route in api.routes if isinstance(route, APIRoute)]

    # Last, so every call above wins: the rest of /memory/v1 answers a reason code, never the app's own 404/405.
    @api.api_route(PREFIX, methods=_EVERY_METHOD, include_in_schema=False)
    @api.api_route(PREFIX + "/{rest:path}", methods=_EVERY_METHOD, include_in_schema=False)
    async def elsewhere(request: Request) -> Response:
        allowed = {m for r in known if r.matches(request.scope)[0] is not Match.NONE for m in r.methods or ()}
        raise _MethodNotAllowed(allowed) if allowed else GovernedMemoryError(Reason.NOT_FOUND)

    return api


def _key(assertion: Assertion) -> ScopeKey:
    assert assertion.key is not None  # every call but offboarding verifies a control token, which names its scope
    return assertion.key


def _endpoint(
    call: Call, handler: Callable[[Request, Assertion], Coroutine[Any, Any, object]], token: Any
) -> Callable[..., Coroutine[Any, Any, Answer]]:
    """The route of ``call``: the verified token first, then ``handler``, its store value read as the answer."""

    async def endpoint(request: Request, assertion: Assertion = token) -> Answer:
        return call.answer.model_validate(await handler(request, assertion))

    return endpoint


def mount(app: FastAPI, store: Store, trust: Trust | Callable[[object], Trust]) -> None:
    """Add the control API to an agent's app (idempotent)."""
    if not getattr(app.state, "governed_memory_control", False):
        app.include_router(router(store, trust))
        app.state.governed_memory_control = True
