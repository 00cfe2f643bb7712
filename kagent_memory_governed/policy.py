"""The policy: ceilings from the decision record that configuration may lower and never raise.

Also the pure admission checks over single values (a fact, an embedding) that every write applies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from kagent_memory_governed.errors import GovernedMemoryError, PolicyError, Reason

EMBEDDING_DIMENSIONS = 768  # kagent's KAgentEmbedding pads or truncates every provider to 768

# key -> (ceiling, direction). "max": a value may only be lower; "min": only higher (a floor).
CEILINGS: dict[str, tuple[int, str]] = {
    "max_expiry_seconds": (7 * 24 * 3600, "max"),
    "entry_cap": (100, "max"),
    "max_fact_bytes": (512, "max"),
    "prefetch_max_subqueries": (8, "max"),
    "prefetch_max_query_bytes": (512, "max"),
    "explicit_ops_per_minute": (6, "max"),
    "explicit_burst": (3, "max"),
    "scope_ops_per_hour": (60, "max"),
    "autosave_every_user_turns": (5, "min"),
    "autosave_max_input_bytes": (16384, "max"),
    "autosave_max_facts": (10, "max"),
    "ledger_retention_days": (400, "max"),
}
# The least a "max" key may be lowered to (1 unless listed): operation records must outlive any dispute window.
MINIMUMS: dict[str, int] = {"ledger_retention_days": 30}


class Policy(BaseModel):
    """Effective limits. Every field defaults to its ceiling; a value past its ceiling is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_expiry_seconds: int = CEILINGS["max_expiry_seconds"][0]
    entry_cap: int = CEILINGS["entry_cap"][0]
    max_fact_bytes: int = CEILINGS["max_fact_bytes"][0]
    prefetch_max_subqueries: int = CEILINGS["prefetch_max_subqueries"][0]
    prefetch_max_query_bytes: int = CEILINGS["prefetch_max_query_bytes"][0]
    explicit_ops_per_minute: int = CEILINGS["explicit_ops_per_minute"][0]
    explicit_burst: int = CEILINGS["explicit_burst"][0]
    scope_ops_per_hour: int = CEILINGS["scope_ops_per_hour"][0]
    autosave_every_user_turns: int = CEILINGS["autosave_every_user_turns"][0]
    autosave_max_input_bytes: int = CEILINGS["autosave_max_input_bytes"][0]
    autosave_max_facts: int = CEILINGS["autosave_max_facts"][0]
    ledger_retention_days: int = CEILINGS["ledger_retention_days"][0]

    @model_validator(mode="after")
    def _within_ceilings(self) -> Policy:
        for key, (ceiling, direction) in CEILINGS.items():
            value, minimum = getattr(self, key), MINIMUMS.get(key, 1)
            if value < 1:
                raise ValueError(f"{key}: must be a positive integer")
            if value < minimum:
                raise ValueError(f"{key}: {value} is below its minimum {minimum}")
            if direction == "max" and value > ceiling:
                raise ValueError(f"{key}: {value} is above its ceiling {ceiling}; a policy may only lower it")
            if direction == "min" and value < ceiling:
                raise ValueError(f"{key}: {value} is below its floor {ceiling}; a policy may only raise it")
        return self

    @classmethod
    def from_mapping(cls, values: Any) -> Policy:
        """Validate a policy mapping; a ``PolicyError`` names the offending key."""
        if not isinstance(values, dict):
            raise PolicyError("policy: must be a JSON object")
        try:
            return cls(**values)
        except ValidationError as error:
            first = error.errors()[0]
            key = ".".join(str(part) for part in first["loc"]) or "policy"
            if first["type"] == "extra_forbidden":
                raise PolicyError(f"{key}: unknown policy key") from None
            if first["type"] == "value_error":
                raise PolicyError(str(first["ctx"]["error"])) from None
            raise PolicyError(f"{key}: must be an integer") from None

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Read a policy JSON file (``KAGENT_GOVERNED_MEMORY_POLICY``)."""
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise PolicyError("policy: file is unreadable or not JSON") from None
        return cls.from_mapping(values)


def admit_fact(text: object, policy: Policy) -> str:
    """The fact as it will be stored, its whitespace normalized (runs become one space, ends trimmed) so
    equal facts are equal text; or a refusal: ``bad_input`` (not text, empty, NUL, lone surrogates) or
    ``fact_too_large`` (more UTF-8 bytes than the policy allows)."""
    if not isinstance(text, str) or "\x00" in text:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    fact = " ".join(text.split())
    if not fact:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    try:
        size = len(fact.encode("utf-8"))
    except UnicodeEncodeError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if size > policy.max_fact_bytes:
        raise GovernedMemoryError(Reason.FACT_TOO_LARGE)
    return fact


def admit_embedding(vector: Sequence[float]) -> list[float]:
    """A 768-dimensional finite, non-zero vector as a list, or ``bad_input``."""
    try:
        values = [float(x) for x in vector]
    except (TypeError, ValueError):
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if len(values) != EMBEDDING_DIMENSIONS or not all(math.isfinite(x) for x in values) or not any(values):
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return values


def expiry_seconds(requested: int | None, policy: Policy, consented: int) -> int:
    """The lifetime of a new entry: the request, bounded by the policy and by what consent was given for."""
    bound = min(policy.max_expiry_seconds, consented)
    if requested is None:
        return bound
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return min(requested, bound)
