"""The operators' causes: ``Cause``, the content-free category a ``GovernedMemoryError`` names beside its reason
code, and the two mappings that give a member for an HTTP status (``http_cause``) or a gRPC status (``grpc_cause``).
Re-exported by ``kagent_memory_governed.errors`` and by the contract; a module of its own for its length alone."""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    """The operator's content-free category of a ``GovernedMemoryError`` (``store_unavailable (timeout)``): every
    one the package can give, beside the reason codes the ledger, the logs, ``doctor`` and the health probe show
    with them (docs/operator.md lists them, and a test holds the two together). A text only an operator needs that
    no category can say (the revisions of a newer schema) is the error's ``detail``, never a cause. Several sources
    share a member (``timeout``, ``unreachable``, ``permission_denied``): a value has one member."""

    # the database, by SQLSTATE (store/database.py ``_SQLSTATES``, the server's or a pooler's code)
    AUTHENTICATION_FAILED = "authentication_failed"
    DATABASE_MISSING = "database_missing"
    PERMISSION_DENIED = "permission_denied"  # also the key store's 403 and gRPC's PERMISSION_DENIED
    CONNECTION_REJECTED = "connection_rejected"
    CONNECTION_FAILURE = "connection_failure"  # also migrate's own, for a session that cannot be had
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    SERVER_SHUTDOWN = "server_shutdown"
    SERVER_UNAVAILABLE = "server_unavailable"
    TIMEOUT = "timeout"  # also the key store's, the memory service's, its clients' and the identity fetch's
    READ_ONLY = "read_only"  # a standby: also readiness's own
    # the database, by the driver's or the OS's exception where there is no SQLSTATE (``_CAUSES``)
    NO_MATCHING_HOST = "no_matching_host"
    NAME_NOT_RESOLVED = "name_not_resolved"
    CONNECTION_REFUSED = "connection_refused"  # also the key store's
    # TLS (store/connection.py ``tls_cause``; the key store's client gives the first two of the handshake too)
    TLS_HOSTNAME_MISMATCH = "tls_hostname_mismatch"
    TLS_UNTRUSTED_CERTIFICATE = "tls_untrusted_certificate"
    TLS_HANDSHAKE_FAILED = "tls_handshake_failed"
    TLS_NOT_OFFERED = "tls_not_offered"
    TLS_REQUIRED = "tls_required"
    # the schema and ``migrate`` (store/schema_admin.py, store/binding.py, store/data.py)
    POOLED = "pooled"  # unsupported_database: a pooler between migrate and the server
    EXTENSION_MISSING = "extension_missing"  # unsupported_database: this role may not create pgvector
    REWRITE_BLOCKED = "rewrite_blocked"  # schema_outdated: an open transaction kept row versions from the rewrite
    PLAIN_ENTRIES = "plain_entries"  # schema_outdated: entries an earlier version stored in plain text
    BINDING_MISSING = "binding_missing"  # schema_outdated: no binding row (migration 0014's)
    KEYRING_CONTENDED = "keyring_contended"  # store_unavailable: a write kept seeing keyrings go stale
    # key_store_mismatch (store/binding.py ``mismatch``)
    SERVES_ANOTHER_DATABASE = "serves_another_database"
    UNBOUND = "unbound"  # never migrated since 0014
    ANOTHER_KEY_STORE = "another_key_store"
    # erasure_failed (store/erasure.py), beside the cause of the failure it met
    ROWS_REMAIN = "rows_remain"
    KEYS_NOT_DESTROYED = "keys_not_destroyed"
    # a reason code as the cause of a ledger row: a failure met by an erasure that has no cause of its own
    # (``erasure.failure_cause``: these are the ones the store can meet there; anything else is internal_error),
    # and a scope brought forward (store/reconcile.py)
    STORE_UNAVAILABLE = "store_unavailable"
    BAD_INPUT = "bad_input"
    KEY_UNAVAILABLE = "key_unavailable"
    INTERNAL_ERROR = "internal_error"
    STORE_REGRESSED = "store_regressed"
    # key_unavailable: the key store and its client (keys/)
    BAD_RESPONSE = "bad_response"  # not JSON, not an object, too large, not HTTP/1.1, not of the shape expected
    BAD_REQUEST = "bad_request"  # the client's own HTTP could not be sent
    UNREACHABLE = "unreachable"  # also the memory service's clients' (no connection)
    SEALED = "sealed"  # 503
    TOKEN_UNREADABLE = "token_unreadable"
    TOKEN_MALFORMED = "token_malformed"
    CA_NOT_A_CERTIFICATE = "ca_not_a_certificate"
    CA_UNREADABLE = "ca_unreadable"
    IO_ERROR = "io_error"
    KEYRING_UNREADABLE = "keyring_unreadable"
    MOUNT_MISSING = "mount_missing"
    CONTENDED = "contended"
    BINDING_DELETED = "binding_deleted"
    CAS_REQUIRED = "cas_required"
    CAPABILITIES_DENIED = "capabilities_denied"
    # key_unavailable: a capability the token lacks, missing_<capability>_<kind> (keys/openbao.py ``_NEEDS``)
    MISSING_CREATE_DATA = "missing_create_data"
    MISSING_READ_DATA = "missing_read_data"
    MISSING_UPDATE_DATA = "missing_update_data"
    MISSING_PATCH_DATA = "missing_patch_data"
    MISSING_READ_METADATA = "missing_read_metadata"
    MISSING_UPDATE_DESTROY = "missing_update_destroy"
    MISSING_READ_CONFIG = "missing_read_config"
    MISSING_CREATE_BINDING = "missing_create_binding"
    MISSING_READ_BINDING = "missing_read_binding"
    # the key store's HTTP answer the store does not expect (keys/http.py, keys/openbao.py): status_<code>, by
    # http_cause, for each code of http.HTTPStatus that can arrive there and OpenBao's 472 and 473; any other code
    # is status_other (200 is answered, 403 is permission_denied and 503 sealed)
    STATUS_201 = "status_201"
    STATUS_202 = "status_202"
    STATUS_203 = "status_203"
    STATUS_204 = "status_204"
    STATUS_205 = "status_205"
    STATUS_206 = "status_206"
    STATUS_207 = "status_207"
    STATUS_208 = "status_208"
    STATUS_226 = "status_226"
    STATUS_300 = "status_300"
    STATUS_301 = "status_301"
    STATUS_302 = "status_302"
    STATUS_303 = "status_303"
    STATUS_304 = "status_304"
    STATUS_305 = "status_305"
    STATUS_307 = "status_307"
    STATUS_308 = "status_308"
    STATUS_400 = "status_400"
    STATUS_401 = "status_401"
    STATUS_402 = "status_402"
    STATUS_404 = "status_404"
    STATUS_405 = "status_405"
    STATUS_406 = "status_406"
    STATUS_407 = "status_407"
    STATUS_408 = "status_408"
    STATUS_409 = "status_409"
    STATUS_410 = "status_410"
    STATUS_411 = "status_411"
    STATUS_412 = "status_412"
    STATUS_413 = "status_413"
    STATUS_414 = "status_414"
    STATUS_415 = "status_415"
    STATUS_416 = "status_416"
    STATUS_417 = "status_417"
    STATUS_418 = "status_418"
    STATUS_421 = "status_421"
    STATUS_422 = "status_422"
    STATUS_423 = "status_423"
    STATUS_424 = "status_424"
    STATUS_425 = "status_425"
    STATUS_426 = "status_426"
    STATUS_428 = "status_428"
    STATUS_429 = "status_429"
    STATUS_431 = "status_431"
    STATUS_451 = "status_451"
    STATUS_472 = "status_472"
    STATUS_473 = "status_473"
    STATUS_500 = "status_500"
    STATUS_501 = "status_501"
    STATUS_502 = "status_502"
    STATUS_504 = "status_504"
    STATUS_505 = "status_505"
    STATUS_506 = "status_506"
    STATUS_507 = "status_507"
    STATUS_508 = "status_508"
    STATUS_510 = "status_510"
    STATUS_511 = "status_511"
    STATUS_OTHER = "status_other"
    # the API server's answer other than 200 to the identity's discovery fetch (service/identity.py): by http_cause,
    # discovery_http_<code> for each code of http.HTTPStatus from 201 to 511; any other code is discovery_http_other
    DISCOVERY_HTTP_201 = "discovery_http_201"
    DISCOVERY_HTTP_202 = "discovery_http_202"
    DISCOVERY_HTTP_203 = "discovery_http_203"
    DISCOVERY_HTTP_204 = "discovery_http_204"
    DISCOVERY_HTTP_205 = "discovery_http_205"
    DISCOVERY_HTTP_206 = "discovery_http_206"
    DISCOVERY_HTTP_207 = "discovery_http_207"
    DISCOVERY_HTTP_208 = "discovery_http_208"
    DISCOVERY_HTTP_226 = "discovery_http_226"
    DISCOVERY_HTTP_300 = "discovery_http_300"
    DISCOVERY_HTTP_301 = "discovery_http_301"
    DISCOVERY_HTTP_302 = "discovery_http_302"
    DISCOVERY_HTTP_303 = "discovery_http_303"
    DISCOVERY_HTTP_304 = "discovery_http_304"
    DISCOVERY_HTTP_305 = "discovery_http_305"
    DISCOVERY_HTTP_307 = "discovery_http_307"
    DISCOVERY_HTTP_308 = "discovery_http_308"
    DISCOVERY_HTTP_400 = "discovery_http_400"
    DISCOVERY_HTTP_401 = "discovery_http_401"
    DISCOVERY_HTTP_402 = "discovery_http_402"
    DISCOVERY_HTTP_403 = "discovery_http_403"
    DISCOVERY_HTTP_404 = "discovery_http_404"
    DISCOVERY_HTTP_405 = "discovery_http_405"
    DISCOVERY_HTTP_406 = "discovery_http_406"
    DISCOVERY_HTTP_407 = "discovery_http_407"
    DISCOVERY_HTTP_408 = "discovery_http_408"
    DISCOVERY_HTTP_409 = "discovery_http_409"
    DISCOVERY_HTTP_410 = "discovery_http_410"
    DISCOVERY_HTTP_411 = "discovery_http_411"
    DISCOVERY_HTTP_412 = "discovery_http_412"
    DISCOVERY_HTTP_413 = "discovery_http_413"
    DISCOVERY_HTTP_414 = "discovery_http_414"
    DISCOVERY_HTTP_415 = "discovery_http_415"
    DISCOVERY_HTTP_416 = "discovery_http_416"
    DISCOVERY_HTTP_417 = "discovery_http_417"
    DISCOVERY_HTTP_418 = "discovery_http_418"
    DISCOVERY_HTTP_421 = "discovery_http_421"
    DISCOVERY_HTTP_422 = "discovery_http_422"
    DISCOVERY_HTTP_423 = "discovery_http_423"
    DISCOVERY_HTTP_424 = "discovery_http_424"
    DISCOVERY_HTTP_425 = "discovery_http_425"
    DISCOVERY_HTTP_426 = "discovery_http_426"
    DISCOVERY_HTTP_428 = "discovery_http_428"
    DISCOVERY_HTTP_429 = "discovery_http_429"
    DISCOVERY_HTTP_431 = "discovery_http_431"
    DISCOVERY_HTTP_451 = "discovery_http_451"
    DISCOVERY_HTTP_500 = "discovery_http_500"
    DISCOVERY_HTTP_501 = "discovery_http_501"
    DISCOVERY_HTTP_502 = "discovery_http_502"
    DISCOVERY_HTTP_503 = "discovery_http_503"
    DISCOVERY_HTTP_504 = "discovery_http_504"
    DISCOVERY_HTTP_505 = "discovery_http_505"
    DISCOVERY_HTTP_506 = "discovery_http_506"
    DISCOVERY_HTTP_507 = "discovery_http_507"
    DISCOVERY_HTTP_508 = "discovery_http_508"
    DISCOVERY_HTTP_510 = "discovery_http_510"
    DISCOVERY_HTTP_511 = "discovery_http_511"
    DISCOVERY_HTTP_OTHER = "discovery_http_other"
    # the API server's answer other than 200 to the identity's jwks fetch (service/identity.py): by http_cause,
    # jwks_http_<code> for each code of http.HTTPStatus from 201 to 511; any other code is jwks_http_other
    JWKS_HTTP_201 = "jwks_http_201"
    JWKS_HTTP_202 = "jwks_http_202"
    JWKS_HTTP_203 = "jwks_http_203"
    JWKS_HTTP_204 = "jwks_http_204"
    JWKS_HTTP_205 = "jwks_http_205"
    JWKS_HTTP_206 = "jwks_http_206"
    JWKS_HTTP_207 = "jwks_http_207"
    JWKS_HTTP_208 = "jwks_http_208"
    JWKS_HTTP_226 = "jwks_http_226"
    JWKS_HTTP_300 = "jwks_http_300"
    JWKS_HTTP_301 = "jwks_http_301"
    JWKS_HTTP_302 = "jwks_http_302"
    JWKS_HTTP_303 = "jwks_http_303"
    JWKS_HTTP_304 = "jwks_http_304"
    JWKS_HTTP_305 = "jwks_http_305"
    JWKS_HTTP_307 = "jwks_http_307"
    JWKS_HTTP_308 = "jwks_http_308"
    JWKS_HTTP_400 = "jwks_http_400"
    JWKS_HTTP_401 = "jwks_http_401"
    JWKS_HTTP_402 = "jwks_http_402"
    JWKS_HTTP_403 = "jwks_http_403"
    JWKS_HTTP_404 = "jwks_http_404"
    JWKS_HTTP_405 = "jwks_http_405"
    JWKS_HTTP_406 = "jwks_http_406"
    JWKS_HTTP_407 = "jwks_http_407"
    JWKS_HTTP_408 = "jwks_http_408"
    JWKS_HTTP_409 = "jwks_http_409"
    JWKS_HTTP_410 = "jwks_http_410"
    JWKS_HTTP_411 = "jwks_http_411"
    JWKS_HTTP_412 = "jwks_http_412"
    JWKS_HTTP_413 = "jwks_http_413"
    JWKS_HTTP_414 = "jwks_http_414"
    JWKS_HTTP_415 = "jwks_http_415"
    JWKS_HTTP_416 = "jwks_http_416"
    JWKS_HTTP_417 = "jwks_http_417"
    JWKS_HTTP_418 = "jwks_http_418"
    JWKS_HTTP_421 = "jwks_http_421"
    JWKS_HTTP_422 = "jwks_http_422"
    JWKS_HTTP_423 = "jwks_http_423"
    JWKS_HTTP_424 = "jwks_http_424"
    JWKS_HTTP_425 = "jwks_http_425"
    JWKS_HTTP_426 = "jwks_http_426"
    JWKS_HTTP_428 = "jwks_http_428"
    JWKS_HTTP_429 = "jwks_http_429"
    JWKS_HTTP_431 = "jwks_http_431"
    JWKS_HTTP_451 = "jwks_http_451"
    JWKS_HTTP_500 = "jwks_http_500"
    JWKS_HTTP_501 = "jwks_http_501"
    JWKS_HTTP_502 = "jwks_http_502"
    JWKS_HTTP_503 = "jwks_http_503"
    JWKS_HTTP_504 = "jwks_http_504"
    JWKS_HTTP_505 = "jwks_http_505"
    JWKS_HTTP_506 = "jwks_http_506"
    JWKS_HTTP_507 = "jwks_http_507"
    JWKS_HTTP_508 = "jwks_http_508"
    JWKS_HTTP_510 = "jwks_http_510"
    JWKS_HTTP_511 = "jwks_http_511"
    JWKS_HTTP_OTHER = "jwks_http_other"

    # bad_identity: a workload identity token the memory service does not accept (service/identity.py ``CAUSES``)
    MISSING = "missing"
    MALFORMED = "malformed"
    ALGORITHM = "algorithm"
    UNKNOWN_KEY = "unknown_key"
    KEY_MISMATCH = "key_mismatch"
    SIGNATURE = "signature"
    ISSUER = "issuer"
    AUDIENCE = "audience"
    LIFETIME = "lifetime"
    NOT_YET_VALID = "not_yet_valid"
    EXPIRED = "expired"
    NOT_A_POD = "not_a_pod"
    SUBJECT = "subject"
    UNKNOWN_AGENT = "unknown_agent"
    # identity_unavailable: the cluster's keys cannot be had (service/identity.py); <fetch>_<failure> for each
    # fetch, ``discovery`` (the issuer's configuration) and ``jwks`` (its keys)
    OWN_TOKEN_UNREADABLE = "own_token_unreadable"
    DISCOVERY_ISSUER = "discovery_issuer"
    NOT_FETCHED = "not_fetched"  # asked again within RETRY_SECONDS of start-up, before any fetch ended
    UNKNOWN = "unknown"  # a fetch failed without a cause; also gRPC's UNKNOWN
    DISCOVERY_TOO_LARGE = "discovery_too_large"
    DISCOVERY_TLS_UNTRUSTED_CERTIFICATE = "discovery_tls_untrusted_certificate"
    DISCOVERY_TIMEOUT = "discovery_timeout"
    DISCOVERY_UNREACHABLE = "discovery_unreachable"
    DISCOVERY_MALFORMED = "discovery_malformed"
    JWKS_TOO_LARGE = "jwks_too_large"
    JWKS_TLS_UNTRUSTED_CERTIFICATE = "jwks_tls_untrusted_certificate"
    JWKS_TIMEOUT = "jwks_timeout"
    JWKS_UNREACHABLE = "jwks_unreachable"
    JWKS_MALFORMED = "jwks_malformed"  # also a JWKS that is none, or names a kid twice
    # service_unavailable: the memory service as its clients see it (bridge.py, service/remote.py); a timeout and
    # unreachable above
    TRANSPORT = "transport"
    BAD_ANSWER = "bad_answer"
    IDENTITY_TOKEN_UNREADABLE = "identity_token_unreadable"
    # embedding_failed: the memory service's embedding provider (embedding.py); also timeout, unreachable, the TLS
    # causes, transport, bad_answer, permission_denied (401, 403), resource_exhausted (429) and status_<code>
    NOT_CONFIGURED = "not_configured"  # no embedding model for the calling agent in the service's table
    CREDENTIAL_UNREADABLE = "credential_unreadable"
    ANSWER_TOO_LARGE = "answer_too_large"
    WRONG_COUNT = "wrong_count"
    WRONG_DIMENSIONS = "wrong_dimensions"  # fewer than 768
    # service_unavailable: a gRPC status the service answered without a reason code, by ``grpc_cause``: its name,
    # lower case (UNKNOWN and PERMISSION_DENIED above; OK, never a failure, is bad_answer)
    CANCELLED = "cancelled"
    INVALID_ARGUMENT = "invalid_argument"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    ABORTED = "aborted"
    OUT_OF_RANGE = "out_of_range"
    UNIMPLEMENTED = "unimplemented"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"
    DATA_LOSS = "data_loss"
    UNAUTHENTICATED = "unauthenticated"


def http_cause(prefix: str, status: int) -> Cause:
    """The cause of an HTTP answer with ``status``: ``<prefix><status>`` (``status_401``, ``jwks_http_503``) where
    ``Cause`` has it, else ``<prefix>other``."""
    try:
        return Cause(f"{prefix}{status}")
    except ValueError:
        return Cause(f"{prefix}other")


_GRPC = (
    "CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED "
    "RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS "
    "UNAUTHENTICATED"
).split()
GRPC_CAUSES: dict[str, Cause] = {name: Cause(name.lower()) for name in _GRPC}  # by grpc.StatusCode's name


def grpc_cause(name: str) -> Cause:
    """The cause of a gRPC status the service answered without a reason code, by its ``grpc.StatusCode`` name
    (``UNAVAILABLE``: ``unavailable``); ``bad_answer`` for any other name (``OK`` is no failure)."""
    return GRPC_CAUSES.get(name, Cause.BAD_ANSWER)
