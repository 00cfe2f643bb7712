"""The memory service's embedder (R46): an OpenAI-compatible ``POST /v1/embeddings`` client, configured per agent.

The service embeds, so admission, the embedding capacity it guards and the model that made each vector live in one
place, and an agent pod in remote mode holds no provider credential. The wire is the one OpenAI, Azure OpenAI's v1
API, Ollama, vLLM, Hugging Face TEI, LiteLLM's proxy and agentgateway serve (docs/operator.md says how Bedrock and
Vertex are reached through one of those). Vectors are post-processed as kagent's ``KAgentEmbedding`` does, so entries
embedded in-process and by the service rank together: 768 dimensions as they are, a wider vector truncated and
L2-renormalized, a narrower one refused.

Every failure is ``embedding_failed`` with a content-free ``Cause``: no text of an input, an answer or an error body
reaches an exception, a log line or a metric (the provider's body is never read past its status on a failure).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kagent_memory_governed.errors import Cause, ConfigurationError, GovernedMemoryError, Reason, http_cause
from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS, admit_embedding
from kagent_memory_governed.scope import AgentId

if TYPE_CHECKING:
    import numpy
    from numpy.typing import NDArray

# a batch of texts in, their vectors out, in order (lists of numbers or arrays; ``fit`` checks them)
Embedder = Callable[[list[str]], Awaitable[Sequence[Any]]]
DEFAULT = "*"  # the table's entry for every agent not named in it
MAX_TABLE_BYTES = 64 * 1024
_STATUS_CAUSES = {401: Cause.PERMISSION_DENIED, 403: Cause.PERMISSION_DENIED, 429: Cause.RESOURCE_EXHAUSTED}


class EmbeddingModel(BaseModel):
    """One agent's embedding provider, as the operator configures it on the service."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    url: str = Field(pattern=r"^https?://[^\s?#]+$")  # the API base: ``…/v1``, to which ``/embeddings`` is added
    model: str = Field(min_length=1, max_length=256)  # sent as ``model``: what makes this agent's vectors
    credential_file: Path | None = None  # a file holding the API key, read for each call (the operator rotates it)
    ca_file: Path | None = None  # the PEM CA the endpoint's certificate is verified against (default: the system's)
    dimensions: int | None = Field(default=EMBEDDING_DIMENSIONS, ge=EMBEDDING_DIMENSIONS)  # ``null``: not sent
    # the whole call, every batch: connect, send, answer; below the service's bound on a handler (10 s), so a slow
    # provider is refused embedding_failed (timeout) before the call itself runs out of time
    timeout_seconds: float = Field(default=5.0, gt=0, le=8)
    max_answer_bytes: int = Field(default=4 << 20, ge=1024, le=64 << 20)  # past it (decoded), refused
    max_batch: int = Field(default=64, ge=1, le=2048)  # texts a request carries; more are sent in several


def load_table(path: Path) -> dict[str, EmbeddingModel]:
    """The service's table, a JSON object mapping ``<namespace>/<name>`` (or ``*``, every other agent) to an
    ``EmbeddingModel``'s fields. ``ConfigurationError`` naming the file's setting and the entry, never a value."""
    name = "KAGENT_GOVERNED_MEMORY_EMBEDDINGS"
    try:
        raw = path.read_bytes()[: MAX_TABLE_BYTES + 1]
    except OSError:
        raise ConfigurationError(f"{name}: unreadable", code="unreadable") from None
    if len(raw) > MAX_TABLE_BYTES:
        raise ConfigurationError(f"{name}: larger than {MAX_TABLE_BYTES} bytes", code="invalid")
    try:
        table = json.loads(raw)
    except (ValueError, RecursionError):
        raise ConfigurationError(f"{name}: not JSON", code="invalid") from None
    if not isinstance(table, dict) or not table:
        raise ConfigurationError(f"{name}: a JSON object of agents, at least one", code="invalid")
    models = {}
    for agent, entry in table.items():
        if not _is_agent_name(agent):
            raise ConfigurationError(f"{name}: a key that is not <namespace>/<name> or {DEFAULT}", code="invalid")
        try:
            models[agent] = EmbeddingModel.model_validate(entry, strict=False)
        except ValidationError as error:
            fields = sorted({str(problem["loc"][0]) for problem in error.errors() if problem["loc"]})
            raise ConfigurationError(f"{name}: {agent!r}: invalid {', '.join(fields) or 'entry'}") from None
    return models


def _is_agent_name(text: str) -> bool:
    if text == DEFAULT:
        return True
    try:
        AgentId.parse(text)
    except GovernedMemoryError:
        return False
    return True


def fit(vectors: Sequence[object], count: int) -> list[NDArray[numpy.float32]]:
    """``KAgentEmbedding``'s post-processing, checked: ``count`` vectors of numbers, each of 768 dimensions as it is,
    or wider, truncated to 768 and L2-renormalized; each then one the store takes (``policy.admit_embedding``: finite
    in single precision, a norm it can divide by). A wrong count, a narrower vector or anything else is
    ``embedding_failed`` (``wrong_count``, ``wrong_dimensions``, ``bad_answer``): the provider's fault, before the
    store is asked."""
    import numpy  # with the first embedding: a client of the service that loads this module never does

    if len(vectors) != count:
        raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.WRONG_COUNT)
    fitted = []
    for vector in vectors:
        try:
            values = numpy.asarray(vector) if isinstance(vector, list | tuple | numpy.ndarray) else None
        except ValueError:  # ragged
            values = None
        if values is None or values.ndim != 1 or values.dtype.kind not in "fiu":  # text, objects, booleans, nesting
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.BAD_ANSWER)
        if values.shape[0] < EMBEDDING_DIMENSIONS:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.WRONG_DIMENSIONS)
        values = values.astype(numpy.float64)
        if values.shape[0] > EMBEDDING_DIMENSIONS and numpy.isfinite(values).all():
            values = values[:EMBEDDING_DIMENSIONS]
            norm = float(numpy.linalg.norm(values))
            values = values / norm if norm else values
        try:
            fitted.append(admit_embedding(values[:EMBEDDING_DIMENSIONS]))
        except GovernedMemoryError:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.BAD_ANSWER) from None
    return fitted


class OpenAIEmbedder:
    """An ``Embedder`` over one ``EmbeddingModel``: ``await embedder(texts)`` answers their vectors, in order, or
    raises ``GovernedMemoryError(embedding_failed)`` with a content-free cause. ``aclose`` when done."""

    def __init__(self, model: EmbeddingModel, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.model = model
        verify: ssl.SSLContext | bool = True
        if model.ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=str(model.ca_file))
            except (OSError, ssl.SSLError):
                raise ConfigurationError("an embedding model's ca_file cannot be read as PEM", code="invalid") from None
        self._client = httpx.AsyncClient(
            verify=verify,
            timeout=httpx.Timeout(model.timeout_seconds),
            follow_redirects=False,
            trust_env=False,  # an operator's proxy variables are not the provider's address
            transport=transport,
        )
        self._endpoint = model.url.rstrip("/") + "/embeddings"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __call__(self, texts: list[str]) -> list[NDArray[numpy.float32]]:
        vectors: list[NDArray[numpy.float32]] = []
        try:
            async with asyncio.timeout(self.model.timeout_seconds):  # httpx bounds each phase; this, the whole
                for start in range(0, len(texts), self.model.max_batch):
                    batch = texts[start : start + self.model.max_batch]
                    vectors += fit(await self._request(batch), len(batch))
        except TimeoutError:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.TIMEOUT) from None
        return vectors

    async def _request(self, texts: list[str]) -> list[object]:
        body: dict[str, Any] = {"model": self.model.model, "input": texts, "encoding_format": "float"}
        if self.model.dimensions is not None:
            body["dimensions"] = self.model.dimensions
        try:
            async with self._client.stream("POST", self._endpoint, json=body, headers=self._headers()) as answer:
                if answer.status_code != 200:  # its body may echo the input: never read
                    raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=_status_cause(answer.status_code))
                raw = bytearray()
                async for chunk in answer.aiter_bytes():  # decoded (a provider may compress): bounded as decoded
                    raw += chunk
                    if len(raw) > self.model.max_answer_bytes:
                        raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.ANSWER_TOO_LARGE)
        except httpx.TimeoutException:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.TIMEOUT) from None
        except httpx.ConnectError as error:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=_connect_cause(error)) from None
        except (httpx.HTTPError, httpx.InvalidURL):
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.TRANSPORT) from None
        return _vectors(bytes(raw))

    def _headers(self) -> dict[str, str]:
        if self.model.credential_file is None:
            return {}
        try:
            key = self.model.credential_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            key = ""
        if not key or not key.isprintable() or not key.isascii():  # a header's value: never an exception's text
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.CREDENTIAL_UNREADABLE)
        return {"authorization": f"Bearer {key}", "api-key": key}  # OpenAI's header, and Azure OpenAI's


def _vectors(raw: bytes) -> list[object]:
    """The ``data[].embedding`` of an answer, ordered by each item's ``index``, which must number them 0 to n-1 when
    given (``bad_answer`` for anything else)."""
    try:
        items = json.loads(raw)["data"]
        indices = [item["index"] for item in items if "index" in item]
        if indices:
            if sorted(indices) != list(range(len(items))):
                raise ValueError("not 0 to n-1")
            items = sorted(items, key=lambda item: item["index"])
        return [item["embedding"] for item in items]
    except (ValueError, RecursionError, KeyError, TypeError):
        raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.BAD_ANSWER) from None


def _status_cause(status: int) -> Cause:
    return _STATUS_CAUSES.get(status) or http_cause("status_", status)


def _connect_cause(error: httpx.ConnectError) -> Cause:
    reason = error.__cause__ or error.__context__
    while reason is not None and not isinstance(reason, ssl.SSLError):
        reason = reason.__cause__ or reason.__context__
    if isinstance(reason, ssl.SSLCertVerificationError):
        mismatch = "match" in str(reason.verify_message or "") or "mismatch" in str(reason.verify_message or "")
        return Cause.TLS_HOSTNAME_MISMATCH if mismatch else Cause.TLS_UNTRUSTED_CERTIFICATE
    if isinstance(reason, ssl.SSLError):
        return Cause.TLS_HANDSHAKE_FAILED
    return Cause.UNREACHABLE


class Embedders:
    """The service's embedders, one per agent, from its table, each made now (a CA that cannot be read is a
    ``ConfigurationError`` at start-up): ``for_agent`` answers the agent's own entry, else the ``*`` entry, else
    ``None`` (that agent's text calls are refused ``embedding_failed (not_configured)``)."""

    def __init__(self, table: Mapping[str, EmbeddingModel]) -> None:
        made: dict[EmbeddingModel, OpenAIEmbedder] = {}
        for model in table.values():  # a client a distinct model; a CA refused here leaves none open
            if model not in made:
                made[model] = OpenAIEmbedder(model)
        self._agents = {agent: made[model] for agent, model in table.items()}
        self._made = list(made.values())

    def for_agent(self, agent: str) -> OpenAIEmbedder | None:
        return self._agents.get(agent) or self._agents.get(DEFAULT)

    async def aclose(self) -> None:
        for embedder in self._made:
            await embedder.aclose()
