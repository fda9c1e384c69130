"""Our own outages and the deadlines they covered: the recovery look (docs/design.md#recovery-look).

A deadline that passed while this service could not look (its storage down, or the
service not running) is not the provider's doing. Such an operation gets one status
read after recovery, the recovery look, before anything is decided; only then does it
time out, with the outage on record. A look past a deadline is a status request like
any other: while the provider's ``Retry-After`` still runs it is not made.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.core.clock import isoformat
from reconciler.core.poll_values import Observation, Stop, clip
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import EscalationReason


@dataclass(frozen=True)
class Lapse:
    """A stretch in which this service could not look at its operations.

    Known (its storage refused every write, ``storage.availability``) or inferred (an
    operation claimed long after it was due: the service was stopped or its storage
    down, which across a restart nothing else remembers).
    """

    started_at: datetime
    ended_at: datetime
    inferred: bool = False


def deadline_lapse(
    deadline_at: datetime,
    due_at: datetime | None,
    now: datetime,
    known: tuple[Lapse, ...] | list[Lapse],
    *,
    slack_seconds: float,
) -> Lapse | None:
    """The lapse of ours that covered this deadline, or None: then the deadline is the story.

    ``due_at`` is when the operation asked to be looked at next (its last plan, at the
    latest the deadline). A lapse covers the deadline when it began by the deadline and
    lasted until that plan's moment or later: the read it planned, or a webhook that
    would have brought the read forward, was lost to us. A claim later than
    ``slack_seconds`` after its due time is a lapse in itself, from the due time plus the
    slack until now (the bounded window: within the slack a wake is merely a tick late):
    it needs no memory, so it holds across a restart. A read made after the lapse ended,
    before the deadline, was that look already: the lapse then ends before the plan.
    """
    if now < deadline_at:
        return None
    due = deadline_at if due_at is None else min(due_at, deadline_at)
    lapses = list(known)
    if (now - due).total_seconds() > slack_seconds:
        lapses.append(Lapse(due + timedelta(seconds=slack_seconds), now, inferred=True))
    covering = [lp for lp in lapses if lp.started_at <= deadline_at and lp.ended_at >= due]
    if not covering:
        return None
    return Lapse(
        min(lp.started_at for lp in covering),
        max(lp.ended_at for lp in covering),
        inferred=all(lp.inferred for lp in covering),
    )


def outage_stop(deadline_at: datetime, lapse: Lapse, said: str | None) -> Stop:
    """The escalation of a deadline that passed during our own outage: never a plain timeout."""
    looked = (
        f"a status read after recovery still said {clip(said)}"
        if said is not None
        else "no status read after recovery could settle it"
    )
    return Stop(
        EscalationReason.DEADLINE_EXCEEDED,
        f"deadline {isoformat(deadline_at)} passed during this service's own storage outage "
        f"({isoformat(lapse.started_at)} to {isoformat(lapse.ended_at)}); {looked}",
    )


def recovery_said(obs: Observation) -> str:
    """What the recovery look's answer said, as the timeout after it quotes it."""
    if obs.remote_state:
        return obs.remote_state
    return f"HTTP {obs.http_status}" if obs.http_status is not None else "no answer"


def held_back(retry_not_before: datetime | None, now: datetime) -> str | None:
    """Why a look past a deadline may not be made now: the provider's Retry-After still
    runs (a look would be a request it refused in advance), as the escalation says it."""
    if retry_not_before is None or retry_not_before <= now:
        return None
    return (
        "; the provider's Retry-After allows no status request before "
        f"{isoformat(retry_not_before)}"
    )


def recovery_stop(
    op: OperationRecord, lapse: Lapse, now: datetime, *, looked_before: bool
) -> Stop | None:
    """The timeout of an operation whose deadline ``lapse`` covered, when no recovery look
    may be made: the provider's Retry-After still runs, there is no job to ask about, or
    the one look was made already (``looked_before``: one look, ever). None: look."""
    held = held_back(op.retry_not_before, now)
    if held is None and op.remote_job_id is not None and not looked_before:
        return None
    stop = outage_stop(op.deadline_at, lapse, None)
    return Stop(stop.reason, stop.detail + (held or ""))
