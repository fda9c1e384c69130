"""JSON log lines carrying the trace id and operation id of the work in hand, and the
outage lines that say a repeated failure a few times rather than at every attempt."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from reconciler.core.log_throttle import OUTAGE_LOG_SECONDS, Beat, OutageThrottle

trace_id_var: ContextVar[str | None] = ContextVar("trace_id", default=None)
operation_id_var: ContextVar[str | None] = ContextVar("operation_id", default=None)

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        trace = trace_id_var.get()
        if trace:
            line["trace_id"] = trace
        op = operation_id_var.get()
        if op:
            line["operation_id"] = op
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Access lines would repeat every request; the service logs what matters itself.
    logging.getLogger("uvicorn.access").disabled = True
    quiet_libraries()


# Libraries kept to their warnings whatever the level: httpx and APScheduler would repeat a
# line per request or per turn; botocore's DEBUG lines carry each signed request's
# signature, canonical request and string to sign, which must never reach a log.
QUIET_LIBRARIES = ("httpx", "apscheduler", "botocore", "google.auth")


def quiet_libraries() -> None:
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)


class OutageLog:
    """The WARNINGs of one kind of failure that an outage repeats (a claim, a sweep, a batch).

    The first failure is logged as given; while they go on, one line a minute says how
    long and how many were not logged; the first success after them is one INFO line
    (``core.log_throttle``). ``clock``: monotonic seconds (the runtime's clock, so tests
    move it by hand).
    """

    def __init__(
        self,
        logger: logging.Logger,
        kind: str,
        clock: Callable[[], float],
        every: float = OUTAGE_LOG_SECONDS,
    ) -> None:
        self.logger, self.kind, self.clock = logger, kind, clock
        self.throttle = OutageThrottle(every)
        self._lock = threading.Lock()  # a writer thread may report the end

    def failed(self, message: str, *args: Any, **extra: Any) -> None:
        with self._lock:
            line = self.throttle.failed(self.clock())
        if line is None:
            return
        fields = {"outage": self.kind, "failures": line.failures, **extra}
        if line.beat is Beat.STARTED:
            self.logger.warning(message, *args, extra=fields)
            return
        self.logger.warning(
            message + " (failing for %.0f s: %d failures, %d not logged since the last line)",
            *args,
            line.seconds,
            line.failures,
            line.skipped,
            extra={**fields, "skipped": line.skipped},
        )

    def succeeded(self) -> None:
        if not self.throttle.failing:  # the common case: one attribute read
            return
        with self._lock:
            line = self.throttle.succeeded(self.clock())
        if line is None:
            return
        self.logger.info(
            "%s work again after %.0f s (%d failures, %d not logged since the last line)",
            self.kind,
            line.seconds,
            line.failures,
            line.skipped,
            extra={"outage": self.kind, "failures": line.failures, "skipped": line.skipped},
        )
