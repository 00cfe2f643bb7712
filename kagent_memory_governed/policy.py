"""The policy: ceilings from the decision record that configuration may lower and never raise.

Also the pure admission checks over single values (a fact, an embedding) that every write applies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kagent_memory_governed.errors import GovernedMemoryError, PolicyError, Reason

_FLOAT32_MAX = 3.4028234663852886e38  # also excludes NaN and the infinities
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


def _limit(key: str) -> Any:
    """The field of one policy key: its ceiling as default, bounded on the side a policy may not move."""
    ceiling, direction = CEILINGS[key]
    if direction == "min":
        return Field(default=ceiling, ge=ceiling)
    return Field(default=ceiling, ge=MINIMUMS.get(key, 1), le=ceiling)


class Policy(BaseModel):
    """Effective limits. Every field defaults to its ceiling; a value past its ceiling is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_expiry_seconds: int = _limit("max_expiry_seconds")
    entry_cap: int = _limit("entry_cap")
    max_fact_bytes: int = _limit("max_fact_bytes")
    prefetch_max_subqueries: int = _limit("prefetch_max_subqueries")
    prefetch_max_query_bytes: int = _limit("prefetch_max_query_bytes")
    explicit_ops_per_minute: int = _limit("explicit_ops_per_minute")
    explicit_burst: int = _limit("explicit_burst")
    scope_ops_per_hour: int = _limit("scope_ops_per_hour")
    autosave_every_user_turns: int = _limit("autosave_every_user_turns")
    autosave_max_input_bytes: int = _limit("autosave_max_input_bytes")
    autosave_max_facts: int = _limit("autosave_max_facts")
    ledger_retention_days: int = _limit("ledger_retention_days")

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
            raise PolicyError(_explain(key, first)) from None

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Read a policy JSON file (``KAGENT_GOVERNED_MEMORY_POLICY``)."""
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise PolicyError("policy: file is unreadable or not JSON") from None
        return cls.from_mapping(values)


def _explain(key: str, problem: Any) -> str:
    """One line naming the key and what is wrong with it, in the policy's own terms."""
    if problem["type"] == "extra_forbidden":
        return f"{key}: unknown policy key"
    if problem["type"] not in ("less_than_equal", "greater_than_equal"):
        return f"{key}: must be an integer"
    value, (ceiling, direction) = problem["input"], CEILINGS[key]
    if direction == "min":
        return f"{key}: {value} is below its floor {ceiling}; a policy may only raise it"
    if value > ceiling:
        return f"{key}: {value} is above its ceiling {ceiling}; a policy may only lower it"
    return f"{key}: {value} is below its minimum {MINIMUMS.get(key, 1)}"


def admit_int(value: object, *, low: int, high: int) -> int:
    """``value`` if it is an ``int`` (never a ``bool``) in ``low..high``; otherwise ``bad_input``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return value


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


def admit_embedding(vector: object) -> numpy.ndarray:
    """A 768-dimensional vector of finite single-precision values, not all zero once stored as such, or
    ``bad_input``. Returned as the single-precision array that is sent and stored."""
    try:
        values = numpy.asarray(vector, dtype=numpy.float64)
    except (TypeError, ValueError, OverflowError):
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if values.shape != (EMBEDDING_DIMENSIONS,) or not (numpy.abs(values) <= _FLOAT32_MAX).all():
        raise GovernedMemoryError(Reason.BAD_INPUT)
    stored = values.astype(numpy.float32)
    if not stored.any():
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return stored


def expiry_seconds(requested: int | None, policy: Policy, consented: int) -> int:
    """The lifetime of a new entry: the request, bounded by the policy and by what consent was given for."""
    bound = min(policy.max_expiry_seconds, consented)
    if requested is None:
        return bound
    return min(admit_int(requested, low=1, high=2**63 - 1), bound)
