"""An operation an agent creates on this replica starts here as its insert commits.

Left to the claims, a new operation waits for the next one to find it due: under load,
most of an agent's POST (the create's wait for the job id, ``server.create_wait_seconds``)
was that wait. So the create first takes a free slot of its provider's share
(``Worker.reserve``, never waiting: none while a claim is in flight); the insert
then leases the row to this worker and counts the first create call, exactly what a
claim and the create step's ``prepare`` would have written, and the step starts from the
committed row. A crash in between leaves what a crash after a claim leaves: a row leased
with its create counted, taken over once the lease runs out, and settled as a create that
may have been sent. With no free slot, or no engine running here, nothing changes: the
insert wakes the claims as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from reconciler.core.records import OperationRecord, with_changes
from reconciler.engine.flow import Prep
from reconciler.engine.steps.create import CreateStep
from reconciler.engine.worker import Worker


class Start:
    """One reserved slot, for one new operation: its insert's values, then its step."""

    def __init__(self, starts: CreateStarts, share: str) -> None:
        self._starts = starts
        self._share = share
        self._settled = False

    def changes(self, op: OperationRecord) -> Mapping[str, Any]:
        """The lease and the first create's count, for ``op``'s insert (on the writer)."""
        starts = self._starts
        now = op.created_at
        return {
            "lease_owner": starts.worker.owner,
            "lease_expires_at": now + timedelta(seconds=starts.lease_seconds),
            **starts.step.first_send(op, now),
        }

    def begin(self, op: OperationRecord) -> None:
        """``op`` was inserted with ``changes``: its create step starts in the slot.

        As after a claim, the run is handed the operation as it was due (its next try,
        which the count scheduled, is for a create that got no answer) and the step the
        record its write left (``Prep``), with the request it sends."""
        if not self._settled:
            self._settled = True
            due = with_changes(op, {"next_poll_at": op.created_at})
            self._starts.worker.start(due, Prep(op, op.request), self._share)

    def cancel(self) -> None:
        """Nothing was inserted (an error, or the key's operation existed): the slot back."""
        if not self._settled:
            self._settled = True
            self._starts.worker.give(self._share)


class CreateStarts:
    def __init__(self, worker: Worker, step: CreateStep, lease_seconds: float) -> None:
        self.worker = worker
        self.step = step
        self.lease_seconds = lease_seconds

    def reserve(self, provider: str) -> Start | None:
        """A slot of ``provider``'s share for a create about to be stored; None: none free."""
        if not self.worker.reserve(provider):
            return None
        return Start(self, provider)
