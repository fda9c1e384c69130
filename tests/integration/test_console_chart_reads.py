"""The charts' storage reads on both backends: hours of completions and verdicts, transitions.

What the providers page draws is read back from rows the service's own storage
functions wrote, and the trust transitions found by replaying the stored
verdicts (read by ``commands.provider_reads`` only when they are needed) are the ones
``count_completions`` reported when it counted them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from reconciler.commands.provider_reads import TrustHistory, read_providers
from reconciler.console import provider_charts
from reconciler.core.clock import ManualClock
from reconciler.core.states import State
from reconciler.core.trust import TrustMode, TrustPolicy, Verdict
from reconciler.storage import provider_stats
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from tests.support.chart_data import POLICY, TRANSITIONS, VERDICTS, completed_hours
from tests.support.factories import insert_operation

pytestmark = pytest.mark.both_backends


def test_hours_hold_the_completions_and_verdicts_of_each_hour(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    made = completed_hours(db, journal, "sim", clock.now())
    window = made.window
    # Outside the window or not an end state: not counted.
    insert_operation(
        db,
        journal,
        window.starts[0] - timedelta(hours=1),
        state=State.SUCCEEDED.value,
        status_requests_used=50,
        done_at=window.starts[0] - timedelta(seconds=1),
    )
    insert_operation(db, journal, window.starts[5], state=State.OBSERVING.value)
    with db.read() as conn:
        hours = provider_stats.hourly(conn, window.starts, window.end)
    assert set(hours) == {"sim"}
    found = hours["sim"]
    assert [h.start for h in found] == list(window.starts)
    assert {i: (h.completed, h.reads) for i, h in enumerate(found) if h.completed} == made.reads
    judged = {i: h.verdicts for i, h in enumerate(found) if h.verdicts}
    assert judged == {i: {v: 1} for i, v in VERDICTS.items()}
    assert found[6].webhook_first_share == 1.0 and found[4].webhook_first_share == 0.0
    assert found[0].reads_per_completed is None and found[0].webhook_first_share is None


def test_transitions_replayed_from_the_verdicts_are_the_counted_ones(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    made = completed_hours(db, journal, "sim", clock.now())
    expected = [(made.window.starts[i], state) for i, state in TRANSITIONS]
    assert [(at.replace(minute=0, second=0), s) for at, s in made.transitions] == expected
    window = made.window

    def history(policies: dict[str, TrustPolicy], since: datetime) -> dict[str, TrustHistory]:
        starts = (since, window.starts[-1])  # the chart's hours need not be whole here
        return read_providers(db, policies, starts, window.end, clock.now()).history

    found = history({"sim": POLICY}, window.starts[0])["sim"]
    markers = provider_charts.transitions(found.verdicts, POLICY, found.stored, window.starts[0])
    assert [(m.at, m.label) for m in markers] == made.transitions
    deciding = [v for v in VERDICTS.values() if v is not Verdict.LATE]
    assert [v for v, _, _ in found.verdicts] == deciding
    # No longer configured, or not adaptive: no replay read.
    assert history({}, window.starts[0]) == {}
    assert history({"sim": TrustPolicy(mode=TrustMode.OFF)}, window.starts[0]) == {}
    # The last change before the window: nothing to mark, and no replay read.
    later = made.transitions[-1][0] + timedelta(seconds=1)
    assert history({"sim": POLICY}, later) == {}
