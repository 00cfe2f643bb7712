"""The per-request memory scope: verified from ``X-Memory-Scope`` once, visible to that invocation only.

The scope lives in a ``ContextVar`` set while kagent builds the A2A request context. The agent run,
its tool tasks and the tasks it spawns inherit a copy; another request never sees it. Session state
and ``RunConfig.custom_metadata`` are persisted to the controller, so neither is used. The token itself,
as the bridge signed it, travels in the scope (``RequestScope.token``) to the memory service, which verifies it
again; it is never stored.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from kagent.core.a2a import KAgentRequestContextBuilder

from kagent_memory_governed import clock, metering, redaction
from kagent_memory_governed.assertion import Trust, verify
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Result
from kagent_memory_governed.service.plane import RequestScope

__all__ = ["HEADER", "RequestScope", "bind", "context_builder", "current"]
HEADER = "x-memory-scope"
logger = logging.getLogger(__name__)


_scope: ContextVar[RequestScope | None] = ContextVar("governed_memory_scope", default=None)


def current() -> RequestScope | None:
    """The verified scope of the running request, or ``None``: then memory does nothing (R32)."""
    return _scope.get()


def bind(headers: dict[str, Any], trust: Trust) -> RequestScope | None:
    """Verify the request's assertion and bind the result to this context, always (``None`` when refused),
    so nothing carries over from an earlier request served in the same task. The assertion header is
    removed from ``headers``: kagent persists request headers into the session."""
    token = headers.pop(HEADER, None)
    try:
        assertion = verify(token, trust, now=clock.now(), purpose="scope", user_id=headers.get("x-user-id"))
    except GovernedMemoryError as refused:
        _scope.set(None)
        redaction.enter(False)  # a memory-free request: its records stay as they are
        metering.count(Operation.ASSERTION, Result.REFUSED, refused.reason)
        logger.info("memory-free request: %s", refused.reason.value)
        return None
    assert assertion.key is not None and assertion.generation is not None  # a scope header names both
    scope = RequestScope(
        assertion.key, assertion.generation, assertion.expires_at, token if isinstance(token, str) else None
    )
    _scope.set(scope)
    redaction.enter(True)
    metering.count(Operation.ASSERTION, Result.ADMITTED)
    return scope


def context_builder(trust: Trust) -> type[KAgentRequestContextBuilder]:
    """kagent's request context builder, binding the memory scope before it builds the context."""

    class GovernedRequestContextBuilder(KAgentRequestContextBuilder):
        async def build(  # upstream's own signature, typed
            self,
            params: Any = None,
            task_id: str | None = None,
            context_id: str | None = None,
            task: Any = None,
            context: Any = None,
        ) -> Any:
            bind(context.state.setdefault("headers", {}) if context else {}, trust)
            # by keyword: kagent-core on a2a-sdk 1.x (upstream main) takes ``context`` first
            return await super().build(
                params=params, task_id=task_id, context_id=context_id, task=task, context=context
            )

    return GovernedRequestContextBuilder
