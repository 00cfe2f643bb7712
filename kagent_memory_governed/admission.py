"""Cost admission as pure decisions (R21-R26): may this memory work start now, before any model or
embedding call? The store evaluates them inside one transaction over state shared by all replicas.

- explicit ``load_memory``/``save_memory``: a token bucket of ``explicit_burst`` tokens refilled at
  ``explicit_ops_per_minute`` per minute, and at most ``explicit_ops_per_minute`` in any rolling
  minute, per (sender, agent);
- every summarization, prefetch subquery, explicit load or save and embedding item is one unit of
  the scope's rolling hourly ceiling, ``scope_ops_per_hour``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kagent_memory_governed.errors import Reason
from kagent_memory_governed.policy import Policy

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Bucket:
    tokens: float
    updated_at: datetime


def refill(bucket: Bucket, now: datetime, policy: Policy) -> float:
    """Tokens available at ``now``: they accrue at the per-minute rate, up to the burst."""
    elapsed = max((now - bucket.updated_at).total_seconds(), 0.0)
    return min(float(policy.explicit_burst), bucket.tokens + elapsed * policy.explicit_ops_per_minute / 60.0)


def explicit_refusal(tokens: float, in_last_minute: int, policy: Policy) -> Reason | None:
    """``rate_limited`` when the burst is spent or the rolling minute is full."""
    if in_last_minute >= policy.explicit_ops_per_minute or tokens < 1.0:
        return Reason.RATE_LIMITED
    return None


def hourly_refusal(used: int, units: int, policy: Policy) -> Reason | None:
    """``hourly_ceiling`` when ``units`` more would pass the scope's rolling hourly ceiling."""
    return Reason.HOURLY_CEILING if used + units > policy.scope_ops_per_hour else None
