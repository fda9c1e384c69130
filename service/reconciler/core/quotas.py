"""Per-agent quotas on starting operations: values in, a verdict out.

Guarantee: one agent cannot crowd out the others or the operators. An agent
may have at most so many operations in flight (not yet in an end state) and
start at most so many per sliding minute. The shell counts from the
operations table itself, the one record every replica shares, so the limits
hold across replicas without any state of their own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.core.errors import QuotaExceeded

RATE_WINDOW = timedelta(minutes=1)
# When one of the agent's operations ends is not known in advance; a client that honours
# Retry-After (most HTTP and MCP clients do) comes back after this, not at once.
IN_FLIGHT_RETRY_SECONDS = 5


@dataclass(frozen=True)
class Quota:
    max_in_flight: int  # 0: no limit
    max_per_minute: int  # 0: no limit


def check_quota(
    quota: Quota, caller: str, in_flight: int, recent: Sequence[datetime], now: datetime
) -> None:
    """Raise ``QuotaExceeded`` when one more operation would pass a limit.

    ``recent`` holds the creation times of the caller's operations inside the window,
    oldest first (at most ``max_per_minute`` of them are needed).
    """
    if quota.max_in_flight and in_flight >= quota.max_in_flight:
        raise QuotaExceeded(
            f"agent '{caller}' already has {in_flight} operations in flight, the most allowed "
            f"({quota.max_in_flight}); wait for some to finish (GET /v1/operations/{{id}}/wait) "
            f"before starting more, or retry after {IN_FLIGHT_RETRY_SECONDS} s",
            retry_after_seconds=IN_FLIGHT_RETRY_SECONDS,
        )
    if quota.max_per_minute and len(recent) >= quota.max_per_minute:
        frees = recent[len(recent) - quota.max_per_minute] + RATE_WINDOW
        wait = max(1, math.ceil((frees - now).total_seconds()))
        raise QuotaExceeded(
            f"agent '{caller}' started {quota.max_per_minute} operations in the last minute, "
            f"the most allowed; retry after {wait} s",
            retry_after_seconds=wait,
        )
