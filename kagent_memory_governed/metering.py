"""Bounded aggregate counters of memory operations, apart from chat tokens (R27).

Labels come from fixed sets only: an operation type, a result, a reason code. Never a user, room,
scope, entry id or any text. With no OpenTelemetry meter provider configured, counting is a no-op.
"""

from __future__ import annotations

from opentelemetry import metrics

from kagent_memory_governed.errors import Operation, Reason, Result

OPERATIONS = frozenset(
    {
        Operation.ASSERTION,
        Operation.PREFETCH,
        Operation.LOAD,
        Operation.SAVE,
        Operation.AUTOSAVE,
        Operation.SUMMARIZE,
        Operation.EMBED,
        Operation.TURN,
    }
)
RESULTS = frozenset(Result)

_counter = metrics.get_meter("kagent_memory_governed").create_counter(
    "governed_memory.operations", unit="{operation}", description="Governed memory operations by result"
)


def count(operation: Operation, result: Result, reason: Reason | None = None, amount: int = 1) -> None:
    """Add ``amount`` to the counter for (operation, result, reason); unknown labels are a programming error."""
    if operation not in OPERATIONS or result not in RESULTS:
        raise ValueError("unbounded metric label")
    labels = {"operation": operation.value, "result": result.value, "reason": reason.value if reason else "none"}
    _counter.add(amount, labels)
