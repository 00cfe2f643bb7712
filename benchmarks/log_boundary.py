"""The cost per log record of the content boundary, inside and outside memory work.

    python benchmarks/log_boundary.py [--records 200000]

Each figure is the median over 7 rounds of the time to create and handle one record through a
handler that formats it (as a real handler would), printed in microseconds.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from kagent_memory_governed import redaction


class Formatting(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


def per_record_us(logger: logging.Logger, records: int) -> float:
    rounds = []
    for _ in range(7):
        started = time.perf_counter()
        for n in range(records):
            logger.info("Loading memory for query: %s (%d)", "a user's query", n)
        rounds.append((time.perf_counter() - started) / records * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    logger = logging.getLogger("benchmark.upstream")
    logger.propagate = False
    logger.addHandler(Formatting())
    logger.setLevel(logging.INFO)
    without = per_record_us(logger, args.records)
    redaction.install_log_boundary()
    outside = per_record_us(logger, args.records)
    token = redaction.enter(True)
    inside = per_record_us(logger, args.records)
    redaction.leave(token)
    print(f"no boundary                   {without:.3f} us/record")  # noqa: T201
    print(f"boundary, outside memory work {outside:.3f} us/record (+{outside - without:.3f})")  # noqa: T201
    print(f"boundary, inside memory work  {inside:.3f} us/record (+{inside - without:.3f})")  # noqa: T201


if __name__ == "__main__":
    main()
