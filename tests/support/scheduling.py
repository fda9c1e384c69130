"""How pytest-xdist hands tests to workers: one by one, except modules kept whole.

A module whose tests share one expensive real process per worker (the Ray head of
tests/integration/test_ray_jobs.py) must run on one worker, or each worker that gets
one of its tests starts its own. ``--dist loadgroup`` with ``xdist_group`` marks would
say so, but with pytest 9.2 it groups nothing (the group rides on a node id that
pytest no longer lets plugins change). This scheduler keeps the same rule on the
controller, where only node ids are known: every test is its own unit of work, as
with ``--dist load``, and each module listed in ``WHOLE`` is one unit.

The tests whose verdict rests on wall-clock latency under load (the soak's deadline and
Retry-After checks, hundreds of /wait answering at their timeout) each run several real
processes: ``ONE_AFTER_ANOTHER`` makes them one unit, so they never load the machine for
each other.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

WHOLE = frozenset({"tests/integration/test_ray_jobs.py"})
ONE_AFTER_ANOTHER = (
    "tests/faults/test_soak.py::test_short_soak_keeps_every_invariant",
    "tests/faults/test_wait_and_stop.py::test_hundreds_of_waits_answer_at_their_timeout",
)


class LoadKeepingModulesWhole(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(ONE_AFTER_ANOTHER):
            return "one after another"
        module = nodeid.split("::", 1)[0]
        return module if module in WHOLE else nodeid
