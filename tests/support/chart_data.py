"""Stored history for the console's charts: hours of completions, verdicts, a long story.

Written through the service's own storage functions (``Journal``,
``storage.trust.verdict_row`` and ``count_completions``), so the health row
and its transitions are what the service would have stored. Every moment is
at least two clock hours before ``now``: a test that reads the page a little
later, in the next hour, still finds every mark inside the window; the story's
operation ended before the window, so it adds no bar to its provider's chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.console.provider_charts import Window
from reconciler.core.chain import Entry
from reconciler.core.states import State
from reconciler.core.trust import TrustMode, TrustPolicy, Verdict
from reconciler.core.vocabulary import DelaySource, HistoryKind
from reconciler.storage import trust
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from tests.support.factories import insert_operation

# Trust earned after 3 webhook-first completions, lost at the first miss.
POLICY = TrustPolicy(mode=TrustMode.ADAPTIVE, trust_after=3, distrust_after_misses=1)
COMPLETED_HOURS = range(3, 21)  # window indexes with completions
VERDICTS = {  # window index -> the verdict of that hour's first completion
    4: Verdict.MISS,  # learning -> distrusted
    6: Verdict.WEBHOOK_FIRST,
    8: Verdict.WEBHOOK_FIRST,
    10: Verdict.WEBHOOK_FIRST,  # -> trusted
    14: Verdict.MISS,  # -> distrusted
    16: Verdict.WEBHOOK_FIRST,
    18: Verdict.WEBHOOK_FIRST,
    19: Verdict.LATE,
}
TRANSITIONS = [(4, "distrusted"), (10, "trusted"), (14, "distrusted")]


@dataclass(frozen=True)
class ProviderHistory:
    window: Window
    reads: dict[int, tuple[int, int]]  # window index -> (completed, status reads)
    transitions: list[tuple[datetime, str]]


def completed_hours(
    db: Database, journal: Journal, provider: str, now: datetime, policy: TrustPolicy = POLICY
) -> ProviderHistory:
    """Completions in 18 of the last 24 hours, 8 of them judged, 3 trust transitions."""
    window = Window.ending_at(now)
    reads: dict[int, tuple[int, int]] = {}
    transitions = []
    for index in COMPLETED_HOURS:
        count, used = index % 3 + 1, index % 4 + 1
        reads[index] = (count, count * used)
        ops = []
        for i in range(count):
            done = window.starts[index] + timedelta(minutes=20, seconds=i)
            ops.append(
                insert_operation(
                    db,
                    journal,
                    done - timedelta(minutes=5),
                    provider=provider,
                    state=State.SUCCEEDED.value,
                    remote_job_id=f"job_{provider}_{index}_{i}",
                    status_requests_used=used,
                    done_at=done,
                )
            )
        verdict = VERDICTS.get(index)
        if verdict is None:
            continue
        op, judged_at = ops[0], ops[0].done_at
        assert judged_at is not None
        with db.write() as conn:
            trust.verdict_row(
                op,
                verdict,
                asked_at=judged_at - timedelta(seconds=1),
                seen_at=judged_at,
                hinted_at=judged_at - timedelta(seconds=2) if verdict is Verdict.LATE else None,
                settle_after=None,
            ).run(conn)
            changes = trust.count_completions(conn, provider, [(verdict, op.id)], judged_at, policy)
            transitions += [(judged_at, c.after.value) for c in changes]
    return ProviderHistory(window, reads, transitions)


@dataclass(frozen=True)
class Story:
    op_id: str
    entries: int
    lanes: dict[str, int]  # lane -> marks expected on it


def long_story(db: Database, journal: Journal, now: datetime) -> Story:
    """An operation that was created, polled, hinted, escalated, decided, collected, called back."""
    start = now - timedelta(hours=30)  # before the providers page's window: no bar of its own
    op = insert_operation(db, journal, start, remote_job_id="job_story")

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    def call(seconds: float, cause: str, status: int, **detail: object) -> Entry:
        source = DelaySource.LOCAL_BACKOFF if "next_poll_at" in detail else None
        return Entry(
            HistoryKind.OBSERVATION,
            "worker:1",
            cause,
            {"http_status": status, **detail},
            delay_source=source,
            at=at(seconds),
        )

    def moved(seconds: float, cause: str, was: State, now_in: State) -> Entry:
        return Entry(
            HistoryKind.TRANSITION, "worker:1", cause, {}, from_state=was, to_state=now_in,
            at=at(seconds),
        )  # fmt: skip

    def step(seconds: float, cause: str, **detail: object) -> Entry:
        return Entry(
            HistoryKind.STEP, "worker:1", cause, {"step": "callback", **detail}, at=at(seconds)
        )

    entries = [
        call(0.4, "create_response", 202, job_id="job_story"),
        Entry(
            HistoryKind.TRANSITION,
            "worker:1",
            "create_response",
            {"job_id": "job_story", "via": "create", "http_status": 202},
            from_state=State.CREATE_PENDING,
            to_state=State.ACCEPTED,
            at=at(0.5),
        ),
        moved(0.6, "create_response", State.ACCEPTED, State.OBSERVING),
        call(2, "status_read", 200, remote_state="queued", next_poll_at=at(6).isoformat()),
        call(6, "status_read", 503, retry_after="4"),
        call(10, "status_read", 200, remote_state="running", next_poll_at=at(30).isoformat()),
        Entry(HistoryKind.HINT, "webhook", "webhook:evt_1", {"event_id": "evt_1"}, at=at(14)),
        call(14.2, "status_read", 200, remote_state="running"),
        Entry(
            HistoryKind.ESCALATION,
            "worker:1",
            "request_budget_exhausted",
            {"reason": "request_budget_exhausted", "detail": "3 of 3 status requests used"},
            at=at(14.3),
        ),
        moved(14.3, "request_budget_exhausted", State.OBSERVING, State.ESCALATED),
        Entry(
            HistoryKind.DECISION,
            "operator:ops-1",
            "decision:extend",
            {"action": "extend", "extra_seconds": 600, "extra_status_requests": 4},
            at=at(52),
        ),
        moved(52, "decision:extend", State.ESCALATED, State.OBSERVING),
        call(53, "status_read", 200, remote_state="succeeded", decision="collect"),
        moved(53, "remote_succeeded", State.OBSERVING, State.RESULT_COLLECTING),
        call(54, "result_fetch", 200),
        moved(54.1, "result_collected", State.RESULT_COLLECTING, State.SUCCEEDED),
        step(55, "step_failed:callback", attempt=1, http_status=502, error="HTTP 502"),
        step(61, "step_done:callback", attempt=2, http_status=204),
    ]
    with db.write() as conn:
        journal.write(
            conn,
            op,
            now=at(61),
            changes={"state": State.SUCCEEDED.value, "done_at": at(54.1)},
            entries=entries,
        )
    lanes = {"requests": 7, "webhooks": 1, "state": 7, "decisions": 2, "callbacks": 2}
    return Story(op.id, len(entries) + 1, lanes)
