"""The one error type of governed memory, its reason codes, and the codes the ledger records with them.

    GovernedMemoryError(Exception)   every refusal and failure at run time; ``str()`` is the reason code, and
                                     ``cause`` an operator's content-free category (``Cause``, errors/causes.py:
                                     ``timeout``), or ``detail`` where no category can say it
    ConfigurationError(ValueError)   start-up only: a setting is missing or invalid (named, never echoed);
     │                               ``code`` a content-free category (``missing``, ``invalid``, ...)
     └── PolicyError                 a policy file or key is invalid, or tries to raise a ceiling
    redaction.WithheldError          what leaves a memory-bearing run instead of a failure whose text might
        (RuntimeError)               hold content: its type's name only

A reason code is stable, content-free and safe to log, meter, audit and return to a caller.
Nothing else is ever attached: no input, no query, no database message. Code that turns a
lower-level exception into a ``GovernedMemoryError`` raises it ``from None`` so that no
traceback carries the lower-level text.
"""

from __future__ import annotations

from enum import StrEnum

from kagent_memory_governed.errors.causes import GRPC_CAUSES as GRPC_CAUSES
from kagent_memory_governed.errors.causes import Cause as Cause
from kagent_memory_governed.errors.causes import grpc_cause as grpc_cause
from kagent_memory_governed.errors.causes import http_cause as http_cause


class Reason(StrEnum):
    """Stable reason codes (docs/bridge.md lists them for callers). Add codes when needed; never put content in one."""

    NO_ASSERTION = "no_assertion"
    BAD_ASSERTION = "bad_assertion"
    ASSERTION_REPLAYED = "assertion_replayed"
    PRINCIPAL_NOT_ADMITTED = "principal_not_admitted"
    SCOPE_MISMATCH = "scope_mismatch"
    CONSENT_MISSING = "consent_missing"
    CONSENT_DISABLED = "consent_disabled"
    CONSENT_STALE = "consent_stale"
    CONSENT_EXPIRED = "consent_expired"
    ENTRY_CAP_REACHED = "entry_cap_reached"
    FACT_TOO_LARGE = "fact_too_large"
    RATE_LIMITED = "rate_limited"
    HOURLY_CEILING = "hourly_ceiling"
    STORE_UNAVAILABLE = "store_unavailable"
    ERASURE_FAILED = "erasure_failed"
    ERASURE_PENDING = "erasure_pending"
    NOT_FOUND = "not_found"
    MALFORMED_SUMMARY = "malformed_summary"
    MODEL_FAILED = "model_failed"
    EMBEDDING_FAILED = "embedding_failed"
    CONFIRMATION_REQUIRED = "confirmation_required"
    BAD_INPUT = "bad_input"
    BODY_TOO_LARGE = "body_too_large"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INTERNAL_ERROR = "internal_error"
    SCHEMA_OUTDATED = "schema_outdated"
    SCHEMA_MISSING = "schema_missing"  # never migrated: run ``migrate``
    SCHEMA_NEWER = "schema_newer"
    UNSUPPORTED_DATABASE = "unsupported_database"
    KEY_UNAVAILABLE = "key_unavailable"  # the key store cannot be reached or refused: nothing is read or written
    KEY_STORE_MISMATCH = "key_store_mismatch"  # the key store serves another database (or none yet): run nothing
    # the database was behind the key store's last erasure of the scope (a failover, a restore): brought forward
    STORE_REGRESSED = "store_regressed"
    # the memory service (``serve``, docs/decisions/0001-memory-service.md), as its data plane's callers see it
    SERVICE_UNAVAILABLE = "service_unavailable"  # unreachable, past its deadline, or an answer not of the wire
    BAD_IDENTITY = "bad_identity"  # the caller's workload identity token is not one the service accepts
    IDENTITY_UNAVAILABLE = "identity_unavailable"  # the cluster's keys to verify it cannot be had now
    ASSERTION_EXPIRING = "assertion_expiring"  # an auto-save would outlive the request's scope token at the service
    KEYRING_STALE = "keyring_stale"  # internal to the store: a write saw a live entry its keyring lacked; retried


class Operation(StrEnum):
    """What memory work did: the ledger's operation column (it accepts ``[a-z_]{1,32}``; ``Store.admit``
    records its caller's operation) and the operation label of the metric."""

    # the runtime's memory work, admitted by Store.admit and metered
    ASSERTION = "assertion"
    PREFETCH = "prefetch"
    LOAD = "load"
    SAVE = "save"
    AUTOSAVE = "autosave"
    SUMMARIZE = "summarize"
    EMBED = "embed"
    TURN = "turn"
    # the store's own operations
    GRANT = "grant"
    STATUS = "status"
    WRITE = "write"
    SEARCH = "search"
    COLLECT = "collect"
    INSPECT = "inspect"
    FORGET = "forget"
    FORGET_ALL = "forget_all"
    OFF = "off"
    OFFBOARD_FENCE = "offboard_fence"
    OFFBOARD = "offboard"
    COMPLETE_ERASURE = "complete_erasure"  # an interrupted erasure, completed by sweep or the scope's next operation
    RECONCILE = "reconcile"  # a scope brought forward to the key store's last erasure (``store/reconcile.py``)
    SWEEP = "sweep"
    CLAIM = "claim"


class Result(StrEnum):
    """How a recorded operation ended; a ``refused`` or ``failed`` row carries its ``Reason``.
    ``admitted`` is for the metric only (a verified scope assertion), never a ledger row."""

    OK = "ok"
    REFUSED = "refused"
    FAILED = "failed"
    ADMITTED = "admitted"


class GovernedMemoryError(Exception):
    """A refusal or failure of governed memory. ``str(error)`` is the reason code and nothing else."""

    def __init__(self, reason: Reason, *, cause: Cause | None = None, detail: str | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        # for operators: a content-free category (``connection_refused``), never database text
        self.cause = cause
        # for operators, where no category can say it: content-free text (the revisions of a newer schema, a
        # target migrate refuses), shown in the cause's place; never recorded in the ledger
        self.detail = detail

    @property
    def shown(self) -> str | None:
        """What an operator is shown beside the reason code: the detail, else the cause."""
        return self.detail or self.cause

    def explained(self) -> str:
        """The reason code, and the operator-facing cause when there is one: ``store_unavailable (timeout)``."""
        return f"{self.reason.value} ({self.shown})" if self.shown else self.reason.value

    def __repr__(self) -> str:
        return f"GovernedMemoryError({self.reason.value!r})"


class ConfigurationError(ValueError):
    """Start-up only: configuration is missing or invalid; the message names the setting, never its value.
    ``code`` is a content-free category for reports (``missing``, ``invalid``, ...)."""

    def __init__(self, message: str, *, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code


class PolicyError(ConfigurationError):
    """A policy file or value is invalid; the message names the key, never a secret or content."""
