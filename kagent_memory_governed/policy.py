"""The policy: ceilings from the decision record that configuration may lower and never raise.

Also the pure admission checks over single values (a fact, an embedding) that every write applies.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kagent_memory_governed.errors import GovernedMemoryError, PolicyError, Reason

if TYPE_CHECKING:
    import numpy

_FLOAT32_MAX = 3.4028234663852886e38  # also excludes NaN and the infinities
_FLOAT32_TINY = 1.1754943508222875e-38  # numpy.finfo(numpy.float32).tiny; numpy is imported by the first embedding
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
    "control_reads_per_hour": (120, "max"),
}
# The least a "max" key may be lowered to (1 unless listed): operation records must outlive any dispute window.
MINIMUMS: dict[str, int] = {"ledger_retention_days": 30}
# The most a floor ("min" key) may be raised to: an auto-save every 10^24 turns is auto-save off by accident.
MAXIMUMS: dict[str, int] = {"autosave_every_user_turns": 1000}
MAX_POLICY_FILE_BYTES = 64 * 1024
_KEY = re.compile(r"[a-z_]{1,64}")


def _limit(key: str) -> Any:
    """The field of one policy key: its ceiling as default, bounded on both sides."""
    ceiling, direction = CEILINGS[key]
    if direction == "min":
        return Field(default=ceiling, ge=ceiling, le=MAXIMUMS[key])
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
    control_reads_per_hour: int = _limit("control_reads_per_hour")

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
        """Read a policy JSON file (``KAGENT_GOVERNED_MEMORY_POLICY``) as strictly as a control body: at most
        ``MAX_POLICY_FILE_BYTES`` of UTF-8 JSON, each key once, no ``NaN`` or ``Infinity``. ``PolicyError``
        is one line naming the problem."""
        try:
            with Path(path).open("rb") as file:
                raw = file.read(MAX_POLICY_FILE_BYTES + 1)
        except OSError:
            raise PolicyError("policy: file is unreadable") from None
        if len(raw) > MAX_POLICY_FILE_BYTES:
            raise PolicyError(f"policy: file is larger than {MAX_POLICY_FILE_BYTES} bytes")
        try:
            values = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except UnicodeDecodeError:
            raise PolicyError("policy: file is not UTF-8") from None
        except json.JSONDecodeError as error:
            raise PolicyError(f"policy: not JSON (line {error.lineno}, column {error.colno})") from None
        except RecursionError:
            raise PolicyError("policy: nested too deeply") from None
        return cls.from_mapping(values)


def _printable(key: str) -> str:
    """A key as an error may name it: a policy key as it is, anything else JSON-escaped and clipped, on one line."""
    return key if _KEY.fullmatch(key) else json.dumps(key[:64])


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):  # {"entry_cap": 200, "entry_cap": 10} must not mean whichever came last
        keys = [key for key, _ in pairs]
        repeated = next(key for index, key in enumerate(keys) if key in keys[:index])
        raise PolicyError(f"{_printable(repeated)}: appears more than once")
    return members


def _no_constant(name: str) -> Any:
    raise PolicyError(f"policy: {name} is not JSON")


def _explain(key: str, problem: Any) -> str:
    """One line naming the key and what is wrong with it, in the policy's own terms."""
    if problem["type"] == "extra_forbidden":
        return f"{_printable(key)}: unknown policy key"
    if problem["type"] not in ("less_than_equal", "greater_than_equal"):
        return f"{key}: must be an integer"
    value, (ceiling, direction) = problem["input"], CEILINGS[key]
    if direction == "min" and value > ceiling:
        return f"{key}: {value} is above its maximum {MAXIMUMS[key]}"
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
    """A 768-dimensional vector of numbers (never text or booleans) whose single-precision form can be
    found: finite values and a squared norm that is finite and not below the least normal float, as
    pgvector's cosine distance computes it. Otherwise ``bad_input``, before it is stored or counted: a
    vector of float32-max values, or of values whose squares vanish, has no cosine distance to anything.
    Returned as the single-precision array that is sent and stored."""
    import numpy

    if isinstance(vector, list | tuple) and not {bool, numpy.bool_} & set(map(type, vector)):
        values = numpy.asarray(vector)
    elif isinstance(vector, numpy.ndarray):
        values = vector
    else:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    if values.dtype.kind not in "fiu" or values.shape != (EMBEDDING_DIMENSIONS,):
        raise GovernedMemoryError(Reason.BAD_INPUT)  # text, objects, booleans, nested lists
    values = values.astype(numpy.float64)
    if not (numpy.abs(values) <= _FLOAT32_MAX).all():  # NaN compares false too
        raise GovernedMemoryError(Reason.BAD_INPUT)
    stored = values.astype(numpy.float32)
    with numpy.errstate(over="ignore", under="ignore"):
        norm = numpy.dot(stored, stored)
    if not numpy.isfinite(norm) or norm < _FLOAT32_TINY:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return stored


def expiry_seconds(requested: int | None, policy: Policy, consented: int) -> int:
    """The lifetime of a new entry: the request, bounded by the policy and by what consent was given for."""
    bound = min(policy.max_expiry_seconds, consented)
    if requested is None:
        return bound
    return min(admit_int(requested, low=1, high=2**63 - 1), bound)
