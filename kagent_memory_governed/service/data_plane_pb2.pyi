import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecallRequest(_message.Message):
    __slots__ = ("queries", "operation")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedScalarFieldContainer[str]
    operation: str
    def __init__(self, queries: _Optional[_Iterable[str]] = ..., operation: _Optional[str] = ...) -> None: ...

class RememberRequest(_message.Message):
    __slots__ = ("facts", "expires_in", "operation")
    FACTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    facts: _containers.RepeatedScalarFieldContainer[str]
    expires_in: int
    operation: str
    def __init__(self, facts: _Optional[_Iterable[str]] = ..., expires_in: _Optional[int] = ..., operation: _Optional[str] = ...) -> None: ...

class Vector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("operation", "units", "explicit")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_FIELD_NUMBER: _ClassVar[int]
    operation: str
    units: int
    explicit: bool
    def __init__(self, operation: _Optional[str] = ..., units: _Optional[int] = ..., explicit: bool = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("embeddings", "operation", "explicit")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Vector]
    operation: str
    explicit: bool
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Vector, _Mapping]]] = ..., operation: _Optional[str] = ..., explicit: bool = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("entry_id", "text", "score", "created_at", "expires_at")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    text: str
    score: float
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, entry_id: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Hits(_message.Message):
    __slots__ = ("hits",)
    HITS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    def __init__(self, hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ...) -> None: ...

class SearchReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Hits]
    def __init__(self, results: _Optional[_Iterable[_Union[Hits, _Mapping]]] = ...) -> None: ...

class Fact(_message.Message):
    __slots__ = ("text", "embedding")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    text: str
    embedding: Vector
    def __init__(self, text: _Optional[str] = ..., embedding: _Optional[_Union[Vector, _Mapping]] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("facts", "expires_in", "operation", "explicit")
    FACTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_FIELD_NUMBER: _ClassVar[int]
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    expires_in: int
    operation: str
    explicit: bool
    def __init__(self, facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., expires_in: _Optional[int] = ..., operation: _Optional[str] = ..., explicit: bool = ...) -> None: ...

class WriteReply(_message.Message):
    __slots__ = ("entry_ids",)
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RecordTurnRequest(_message.Message):
    __slots__ = ("session_id", "invocation_id", "recalled")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    RECALLED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    invocation_id: str
    recalled: bool
    def __init__(self, session_id: _Optional[str] = ..., invocation_id: _Optional[str] = ..., recalled: bool = ...) -> None: ...

class RecordTurnReply(_message.Message):
    __slots__ = ("waiting",)
    WAITING_FIELD_NUMBER: _ClassVar[int]
    waiting: int
    def __init__(self, waiting: _Optional[int] = ...) -> None: ...

class CollectTurnsRequest(_message.Message):
    __slots__ = ("session_id", "candidates")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    candidates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., candidates: _Optional[_Iterable[str]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("invocation_id", "recalled")
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    RECALLED_FIELD_NUMBER: _ClassVar[int]
    invocation_id: str
    recalled: bool
    def __init__(self, invocation_id: _Optional[str] = ..., recalled: bool = ...) -> None: ...

class CollectTurnsReply(_message.Message):
    __slots__ = ("turns",)
    TURNS_FIELD_NUMBER: _ClassVar[int]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    def __init__(self, turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ...) -> None: ...

class PolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyReply(_message.Message):
    __slots__ = ("max_expiry_seconds", "entry_cap", "max_fact_bytes", "prefetch_max_subqueries", "prefetch_max_query_bytes", "explicit_ops_per_minute", "explicit_burst", "scope_ops_per_hour", "autosave_every_user_turns", "autosave_max_input_bytes", "autosave_max_facts", "ledger_retention_days", "control_reads_per_hour")
    MAX_EXPIRY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_CAP_FIELD_NUMBER: _ClassVar[int]
    MAX_FACT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_MAX_SUBQUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_MAX_QUERY_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_OPS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_BURST_FIELD_NUMBER: _ClassVar[int]
    SCOPE_OPS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    AUTOSAVE_EVERY_USER_TURNS_FIELD_NUMBER: _ClassVar[int]
    AUTOSAVE_MAX_INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    AUTOSAVE_MAX_FACTS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_READS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    max_expiry_seconds: int
    entry_cap: int
    max_fact_bytes: int
    prefetch_max_subqueries: int
    prefetch_max_query_bytes: int
    explicit_ops_per_minute: int
    explicit_burst: int
    scope_ops_per_hour: int
    autosave_every_user_turns: int
    autosave_max_input_bytes: int
    autosave_max_facts: int
    ledger_retention_days: int
    control_reads_per_hour: int
    def __init__(self, max_expiry_seconds: _Optional[int] = ..., entry_cap: _Optional[int] = ..., max_fact_bytes: _Optional[int] = ..., prefetch_max_subqueries: _Optional[int] = ..., prefetch_max_query_bytes: _Optional[int] = ..., explicit_ops_per_minute: _Optional[int] = ..., explicit_burst: _Optional[int] = ..., scope_ops_per_hour: _Optional[int] = ..., autosave_every_user_turns: _Optional[int] = ..., autosave_max_input_bytes: _Optional[int] = ..., autosave_max_facts: _Optional[int] = ..., ledger_retention_days: _Optional[int] = ..., control_reads_per_hour: _Optional[int] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("id", "authorization", "scope", "admit", "search", "write", "record_turn", "collect_turns", "policy", "recall", "remember")
    ID_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    RECORD_TURN_FIELD_NUMBER: _ClassVar[int]
    COLLECT_TURNS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    REMEMBER_FIELD_NUMBER: _ClassVar[int]
    id: int
    authorization: str
    scope: str
    admit: AdmitRequest
    search: SearchRequest
    write: WriteRequest
    record_turn: RecordTurnRequest
    collect_turns: CollectTurnsRequest
    policy: PolicyRequest
    recall: RecallRequest
    remember: RememberRequest
    def __init__(self, id: _Optional[int] = ..., authorization: _Optional[str] = ..., scope: _Optional[str] = ..., admit: _Optional[_Union[AdmitRequest, _Mapping]] = ..., search: _Optional[_Union[SearchRequest, _Mapping]] = ..., write: _Optional[_Union[WriteRequest, _Mapping]] = ..., record_turn: _Optional[_Union[RecordTurnRequest, _Mapping]] = ..., collect_turns: _Optional[_Union[CollectTurnsRequest, _Mapping]] = ..., policy: _Optional[_Union[PolicyRequest, _Mapping]] = ..., recall: _Optional[_Union[RecallRequest, _Mapping]] = ..., remember: _Optional[_Union[RememberRequest, _Mapping]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("id", "refused", "admit", "search", "write", "record_turn", "collect_turns", "policy", "recall", "remember")
    ID_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    RECORD_TURN_FIELD_NUMBER: _ClassVar[int]
    COLLECT_TURNS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RECALL_FIELD_NUMBER: _ClassVar[int]
    REMEMBER_FIELD_NUMBER: _ClassVar[int]
    id: int
    refused: Refusal
    admit: AdmitReply
    search: SearchReply
    write: WriteReply
    record_turn: RecordTurnReply
    collect_turns: CollectTurnsReply
    policy: PolicyReply
    recall: SearchReply
    remember: WriteReply
    def __init__(self, id: _Optional[int] = ..., refused: _Optional[_Union[Refusal, _Mapping]] = ..., admit: _Optional[_Union[AdmitReply, _Mapping]] = ..., search: _Optional[_Union[SearchReply, _Mapping]] = ..., write: _Optional[_Union[WriteReply, _Mapping]] = ..., record_turn: _Optional[_Union[RecordTurnReply, _Mapping]] = ..., collect_turns: _Optional[_Union[CollectTurnsReply, _Mapping]] = ..., policy: _Optional[_Union[PolicyReply, _Mapping]] = ..., recall: _Optional[_Union[SearchReply, _Mapping]] = ..., remember: _Optional[_Union[WriteReply, _Mapping]] = ...) -> None: ...
