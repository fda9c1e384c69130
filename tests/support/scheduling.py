"""How pytest-xdist hands tests to workers: one by one, except modules kept whole, in an
order that keeps the machine busy.

A module whose tests share one expensive real process per worker (the Ray head of
tests/integration/test_ray_jobs.py, the browser of tests/integration/test_console_browser.py,
the moto server of tests/integration/test_aws_moto.py) must run on one worker, or each
worker that gets one of its tests starts its own.
``--dist loadgroup`` with ``xdist_group`` marks would say so, but with pytest 9.2 it groups
nothing (the group rides on a node id that pytest no longer lets plugins change). This
scheduler keeps the same rule on the controller, where only node ids are known: every test
is its own unit of work, as with ``--dist load``, and each module listed in ``WHOLE`` is one
unit.

The tests whose verdict rests on wall-clock latency under load (the soak's deadline and
Retry-After checks, hundreds of /wait answering at their timeout) each run several real
processes: ``ONE_AFTER_ANOTHER`` makes them one unit, so they never load the machine for
each other.

The order: the suite is bound by its two cores, except where every worker waits at once.
In collection order the fault tests (SIGKILLs, restarts, outages: mostly waiting) came
first and together, and the cores sat half idle for a minute. So the longest units
(``LONGEST``, longest first) start early but spaced out, the fault tests are spread over
the run, and the unit tests (many, short, all computing) come last, where they even out
the workers' ends.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

WHOLE = frozenset(
    {
        "tests/integration/test_ray_jobs.py",
        "tests/integration/test_console_browser.py",
        "tests/integration/test_aws_moto.py",
        # Its import graph parses every module of the package: once, not on each worker.
        "tests/unit/test_import_direction.py",
        # One live service and one loaded schema for its dozen fuzzed operations, instead
        # of one on each worker that gets one of them (0.9 s of a worker's CPU each, and
        # a service process).
        "tests/integration/test_openapi.py",
    }
)
ONE_AFTER_ANOTHER = (
    "tests/faults/test_soak.py::test_short_soak_keeps_every_invariant",
    "tests/faults/test_wait_and_stop.py::test_hundreds_of_waits_answer_at_their_timeout",
)
SERIAL = "one after another"
# Units of 20 s and more on a loaded run, longest first (each a node id prefix), except
# the latency-judged ones: they start once every worker's collection and mypy are done.
LONGEST = (
    "tests/integration/test_ray_jobs.py",
    "tests/integration/test_console_browser.py",
    "tests/integration/test_wheel_demo.py::test_an_installed_wheel",
    "tests/integration/test_demo.py::test_demo_runs_a_mixed_batch",
    "tests/integration/test_bench_smoke.py::test_each_bench_runs_as_a_script_in_its_smoke_mode"
    "[peer_dbos]",
    SERIAL,
    "tests/integration/test_two_replicas.py::test_two_replicas_on_one_postgres",
    "tests/integration/test_two_workers.py::test_two_schedulers_in_one_process",
    "tests/integration/test_local_replicas.py",
    "tests/integration/test_openapi.py",
    "tests/faults/test_deadline_outage.py",
    "tests/integration/test_two_workers.py::test_two_service_processes",
    "tests/faults/test_database_locks.py",
    "tests/integration/test_wait.py::test_two_hundred_waiters",
    "tests/faults/test_create_crash.py",
    "tests/integration/test_aws_moto.py",
)
# The longest units start within this share of the run (by count of units before them).
LONGEST_WITHIN = 0.75
SPREAD = "tests/faults/"
LAST = "tests/unit/"


def order(scopes: list[str]) -> list[str]:
    """``scopes`` (collection order) in the order they are handed out (see the module)."""

    ranks = {
        scope: rank
        for scope in scopes
        if (rank := next((i for i, p in enumerate(LONGEST) if scope.startswith(p)), None))
        is not None
    }
    longest = sorted(ranks, key=ranks.__getitem__)
    rest = [s for s in scopes if s not in ranks]
    last = [s for s in rest if s.startswith(LAST)]
    spread = [s for s in rest if s.startswith(SPREAD)]
    middle = [s for s in rest if not s.startswith((LAST, SPREAD))]
    keyed: list[tuple[float, int, str]] = [(i / len(middle), 2, s) for i, s in enumerate(middle)]
    keyed += [((j + 0.5) / len(spread), 1, s) for j, s in enumerate(spread)]
    keyed += [(LONGEST_WITHIN * k / len(longest), 0, s) for k, s in enumerate(longest)]
    return [s for *_, s in sorted(keyed)] + last


class LoadKeepingModulesWhole(LoadScopeScheduling):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(ONE_AFTER_ANOTHER):
            return SERIAL
        module = nodeid.split("::", 1)[0]
        return module if module in WHOLE else nodeid

    def _assign_work_unit(self, node: Any) -> None:
        # The queue is complete at the first assignment (schedule() fills it, then assigns).
        if not self._ordered:
            self._ordered = True
            queue = self.workqueue
            self.workqueue = OrderedDict((scope, queue[scope]) for scope in order(list(queue)))
        super()._assign_work_unit(node)
