"""The soak's deadline check judges a status read by when the service sent it.

The provider records when a read arrived; on a loaded machine that can be seconds after the
service checked its deadline and sent it. Where the service recorded the answer, its own
send time decides; a read it never recorded (killed while asking) is judged by arrival.
One read after a closed cancellation window is the designed last look.
"""

from __future__ import annotations

from bench.soak_checks import (
    DbSnapshot,
    JobView,
    OpRow,
    Req,
    SimSnapshot,
    Tolerances,
    past_deadline,
)

DEADLINE = 1_000.0


def _op(op_id: str = "op_1", cancel_deadline: float | None = None) -> OpRow:
    return OpRow(
        id=op_id,
        state="escalated",
        idempotency_key=None,
        token="tok_1",
        remote_job_id="job_1",
        created_at=DEADLINE - 60,
        done_at=None,
        deadline_at=DEADLINE,
        cancel_deadline_at=cancel_deadline,
        max_status_requests=10,
        status_requests_used=2,
        escalation_id=1,
        completion_pending=False,
        callback_url=None,
        error=None,
    )


def _check(
    arrivals: list[float], sends: list[float], cancel_deadline: float | None = None
) -> list[str]:
    db = DbSnapshot(
        ops={"op_1": _op(cancel_deadline=cancel_deadline)},
        escalations={},
        steps=[],
        step_done=[],
        event_ids=frozenset(),
        status_sent={"op_1": tuple(sends)} if sends else {},
    )
    job = JobView(
        "job_1",
        "tok_1",
        "running",
        DEADLINE - 59,
        None,
        tuple(Req(at, at + 0.01, 200, None) for at in arrivals),
    )
    sim = SimSnapshot({"job_1": job}, {"tok_1": ["job_1"]}, frozenset(), 0, {})
    inv, _ = past_deadline(db, sim, Tolerances())
    return inv.breaches


def test_a_read_sent_before_the_deadline_that_arrived_late_is_no_breach() -> None:
    assert _check([DEADLINE - 5, DEADLINE + 2.9], [DEADLINE - 5.01, DEADLINE - 0.2]) == []


def test_a_read_sent_after_the_deadline_is_a_breach() -> None:
    breaches = _check([DEADLINE - 5, DEADLINE + 2.9], [DEADLINE - 5.01, DEADLINE + 2.0])
    assert breaches == ["op_1: status request 2.90 s late, sent 2.00 s after"]


def test_an_unrecorded_read_is_judged_by_its_arrival() -> None:
    assert _check([DEADLINE + 2.9], []) == ["op_1: status request 2.90 s late"]


def test_one_recorded_send_excuses_one_arrival_only() -> None:
    breaches = _check([DEADLINE + 1.0, DEADLINE + 2.0], [DEADLINE - 0.1])
    assert breaches == ["op_1: status request 2.00 s late"]


def test_a_send_long_before_the_arrival_is_not_its_send() -> None:
    # Further apart than a status read's timeout: the send belongs to another read.
    assert _check([DEADLINE + 12.0], [DEADLINE - 0.1]) == ["op_1: status request 12.00 s late"]


def test_the_last_look_after_a_cancellation_window_is_allowed_once() -> None:
    # The window closed while the service was down; it looks once when it is back.
    window = DEADLINE - 30
    assert _check([window - 10, DEADLINE + 33], [window - 10.01, DEADLINE + 32.9], window) == []
    breaches = _check(
        [DEADLINE + 33, DEADLINE + 35], [DEADLINE + 32.9, DEADLINE + 34.9], cancel_deadline=window
    )
    assert breaches == ["op_1: status request 35.00 s late, sent 34.90 s after"]
