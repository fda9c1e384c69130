"""A claim of several shares: each share gets its own due operations, two round trips.

The worker claims for every share with free slots at once (a provider's, the hooks', the
callback hosts'). Their filters are disjoint; on PostgreSQL every share's candidates are
read in one statement and every chosen one leased in one more, where a claim was two
statements a share. A share's ``pick`` still decides which of its candidates it takes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconciler.core.states import State
from reconciler.storage import leases
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from tests.support.factories import insert_operation
from tests.support.statements import recording

pytestmark = pytest.mark.both_backends

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DUE = NOW - timedelta(seconds=1)


def _seed(db: Database) -> dict[str, str]:
    journal = Journal()
    ended = {"state": State.SUCCEEDED.value, "completion_pending": True, "next_poll_at": DUE}
    return {
        "sim": insert_operation(db, journal, NOW, next_poll_at=DUE).id,
        "hooks": insert_operation(db, journal, NOW, **ended).id,
        "callbacks": insert_operation(db, journal, NOW, completion_lane="cb:a.example", **ended).id,
        "skipped": insert_operation(db, journal, NOW, completion_lane="cb:b.example", **ended).id,
    }


def test_each_share_gets_its_own_and_a_pick_leaves_the_rest_unleased(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _seed(db)
    hooks = leases.ShareFilter(completion=True, lanes=leases.Lanes.HOOKS)
    callbacks = leases.ShareFilter(completion=True, lanes=leases.Lanes.CALLBACKS)
    asks = {
        "sim": leases.Ask(5, leases.ShareFilter(provider="sim", completion=False)),
        "hooks": leases.Ask(5, hooks),
        # The host of b.example is full: its candidate is passed over.
        "callbacks": leases.Ask(
            5, callbacks, lambda found: [i for i, lane in found if "a." in lane]
        ),
    }
    with recording(monkeypatch) as ran, db.write() as conn:
        claimed = leases.claim_shares(conn, "w1", NOW, 30.0, asks)
    assert {key: [op.id for op, _ in got] for key, got in claimed.items()} == {
        "sim": [ids["sim"]],
        "hooks": [ids["hooks"]],
        "callbacks": [ids["callbacks"]],
    }
    with db.read() as conn:
        assert store.get_operation(conn, ids["skipped"]).lease_owner is None  # type: ignore[union-attr]
        assert store.get_operation(conn, ids["sim"]).lease_owner == "w1"  # type: ignore[union-attr]
    # PostgreSQL: the three shares' candidates, then the leases (with the records' parts).
    assert len(ran) == (2 if not db.sqlite else 3 + 1 + 1)
