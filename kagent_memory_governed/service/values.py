"""What the data plane answers, in process and through the service: the ``Hit`` of a search and the ``Turn`` an
auto-save collects, one class each for the ``Store`` and ``RemoteStore`` (``store.values`` re-exports them), and
the ``Fact`` both write. Declared here, importing nothing, so that the runtime's client loads nothing of the store
package (whose ``__init__`` brings in SQLAlchemy)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

# an embedding as the store takes it: a list of numbers, or the array the service reads off the wire. At run time
# the alias is the list form alone, so that introspection resolves it without importing numpy here.
if TYPE_CHECKING:
    import numpy
    import numpy.typing

    Embedding: TypeAlias = Sequence[float] | numpy.typing.NDArray[numpy.floating[Any]]
else:
    Embedding = Sequence[float]


class Fact(Protocol):
    """A fact to write: ``store.NewFact`` is one, and so is any value with its two fields (the runtime's own)."""

    @property
    def text(self) -> str: ...

    @property
    def embedding(self) -> Embedding: ...


@dataclass(frozen=True, slots=True)
class Hit:
    entry_id: uuid.UUID
    text: str
    score: float
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Turn:
    """A conversation turn admitted under a scope and generation; ``recalled`` if it recalled memory."""

    invocation_id: str
    recalled: bool
