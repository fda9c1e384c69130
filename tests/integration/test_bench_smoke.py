"""The benchmarks, run small so the scripts cannot rot unnoticed.

Every bench in ``bench/`` runs as a script in its ``--smoke`` mode (a few seconds, tiny
sizes, figures printed, no target judged), each its own test so that they spread over
the workers: before, nothing ran them, and ``bench/faults.py`` could not start (its
``bench/mcp.py`` hid the MCP SDK) while ``bench/poller.py --only ticks`` stopped on an
assertion the claim cap had made wrong. Then the benchmarks' pure parts and set-up.

No timing is asserted here: the figures are the benchmarks' business; these tests check
that the benches run, and that what they measure is what they claim to measure.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from bench import lag, naive, poller, stages, support

from reconciler.core.vocabulary import EscalationReason
from reconciler.storage import audit, leases
from reconciler.storage.database import Database
from reconciler.storage.tables import HISTORY, OPS
from tests.support.databases import postgres_admin_url

ROOT = Path(__file__).resolve().parents[2]
# Each bench, and a line its smoke run prints only once it got to the end.
BENCHES = {
    "amplification": "ratio bytes per read",
    "call_shapes": "ratio body/rest",
    "credentials": "ratio signed/bearer",
    "faults": "db_lock ",
    "lag": "p99 median",
    "mcp_vs_http": "one read at a time",
    "naive": "status reads per operation",
    "peer_dbos": "medians over rounds",
    "poller": "full tick at 1 k",
    "poison": " tracebacks, provider requests per op",
    "prune_race": "prune race done",
    "replicas": "median completed operations/s",
    "results": '{"ok": true}',
    "retention": "medians over rounds",
    "schema_stall": "schema stall done",
    "scrape_cost": "scrape cost done",
    "soak": "RESULT: OK",
    "storage_bytes": "ratio stored/payload",
    "throughput": "medians over rounds",
    "webhooks": "ratio ours/bare",
    "write_path": "ratio loop/threads",
}
# The rest of bench/: the parts the benches above run or import, exercised through them.
PARTS = {
    "fast_http",
    "fast_provider",
    "peer_dbos_app",
    "soak_checks",
    "soak_infra",
    "soak_load",
    "soak_sim",
    "stages",
    "support",
    "throughput_parts",
    "trust_sim",
}
SMOKE_TIMEOUT = 300.0  # a loaded machine's worst; a smoke run takes seconds


def test_every_bench_has_a_smoke_run() -> None:
    found = {p.stem for p in (ROOT / "bench").glob("*.py")}
    unlisted = found - set(BENCHES) - PARTS
    assert not unlisted, f"give these a --smoke mode and list them in BENCHES: {unlisted}"
    assert not (set(BENCHES) | PARTS) - found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BENCHES))
def test_each_bench_runs_as_a_script_in_its_smoke_mode(name: str, tmp_path: Path) -> None:
    args = [sys.executable, f"bench/{name}.py", "--smoke"]
    if name == "replicas":
        admin = postgres_admin_url()
        if admin is None:
            pytest.skip("bench/replicas.py needs PostgreSQL (RECONCILER_TEST_POSTGRES_URL)")
        args += ["--postgres-url", admin]
    if name == "write_path" and postgres_admin_url() is None:
        pytest.skip("bench/write_path.py needs PostgreSQL (RECONCILER_TEST_POSTGRES_URL)")
    if name == "storage_bytes" and postgres_admin_url() is not None:
        args += ["--postgres", postgres_admin_url() or ""]
    if name == "amplification":
        args += ["--dir", str(tmp_path)]
    if name == "throughput":
        args += ["--stages"]  # the per-stage breakdown's wrappers, in the measured service
    # As a person runs it: from the checkout, with nothing of the test run on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COVERAGE_PROCESS_START")}
    done = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert BENCHES[name] in done.stdout, done.stdout[-2000:]
    if name == "throughput":
        # Every stage was recorded: the wrappers found what they wrap in this checkout.
        stages_seen = (
            "due -> claimed",
            "call end -> committed",
            "POST wait for the job id",
            "writer statements",
        )
        for stage in (*stages_seen, "in a transaction"):
            assert stage in done.stdout, done.stdout[-3000:]


def test_the_waits_are_taken_per_operation_and_in_the_order_sent() -> None:
    """create -> callback pairs each POST with its operation's first callback, fifths go by
    the order sent, and 503s and refused deliveries are counted as given."""
    timings = [(f"op_{i}", float(i), i + 0.1, 202) for i in range(10)]
    timings.append(("", 10.0, 10.2, 503))
    arrived = {f"op_{i}": i + 1.0 + (i // 2) for i in range(10)}  # later and later
    seen = stages.waits(timings, arrived, {"503": 2})
    assert seen.posts == 11 and seen.agent_refused == 1
    assert seen.webhooks_refused == {"503": 2}
    assert seen.trend == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert seen.callback_p50 == pytest.approx(3.0)


def test_the_threads_line_takes_cores_and_transactions_over_the_load_only() -> None:
    """Startup and the idle tail after the last write are left out: a writer on a core for
    1 s of a 4 s load, inside transactions for 3 s of it."""
    writes = [{"queued": 10.0, "start": 10.0, "committed": 14.0}]
    cpu = [
        [9.0, {"MainThread": 5.0, "db-writer-0": 0.0}],  # startup: not in the window
        [10.0, {"MainThread": 6.0, "db-writer-0": 1.0}],
        [14.0, {"MainThread": 8.0, "db-writer-0": 2.0}],
        [20.0, {"MainThread": 9.0, "db-writer-0": 2.0}],
    ]
    runs = [["db-writer-0", 9.5, 11.0], ["db-writer-0", 12.0, 14.0]]
    text = "\n".join(stages._threads(cpu, runs, writes))
    assert "MainThread                   0.50" in text
    assert "db-writer-0                  0.25  (in a transaction 0.75)" in text
    assert "process 0.75" in text
    # With the scheduler's figures: the writer waited 2 s of the 4 for a core.
    waits = [
        [at, {"MainThread": 0.0, "db-writer-0": 1.0 + (2.0 if at >= 14.0 else 0.0)}]
        for at, _ in cpu
    ]
    text = "\n".join(stages._threads(cpu, runs, writes, waits))
    assert "db-writer-0                  0.25  0.50  (in a transaction 0.75)" in text
    assert "process 0.75, waiting for a core 0.50" in text


def test_a_thread_s_wait_for_a_core_is_read_from_the_kernel() -> None:
    """The scheduler's own count (``schedstat``), which only grows; None where there is none."""
    task = Path(f"/proc/self/task/{threading.get_native_id()}")
    first = support.run_delay(task)
    if first is None:
        pytest.skip("this kernel keeps no scheduler statistics")
    sum(range(200_000))  # some time on a core, perhaps waiting for one
    later = support.run_delay(task)
    assert later is not None and later >= first >= 0.0
    assert support.run_delay(Path("/proc/self/task/0")) is None


def test_the_statements_line_sizes_the_slow_tail_by_time_not_by_count() -> None:
    """Nine statements of 1 ms and one of 11 ms: a tenth of them over 2 ms, but more than
    half of the writers' statement time."""
    records = [[0.001, 0.0002]] * 9 + [[0.011, 0.0002]]
    (line,) = stages._statements(records)
    assert "n=10" in line and "mean 2.00 ms" in line and "on a core 0.20 ms each" in line
    assert "over 2 ms: 10% of them, 55% of the time" in line
    assert stages._statements([]) == []


def test_naive_reads_match_a_poller_stepping_on_a_clock() -> None:
    for duration in (0.5, 2.0, 3.9, 10.0, 599.99, 600.0):
        reads, t = 0, 0.0
        while True:
            t += 2.0
            reads += 1
            if t >= duration:
                break
        assert naive.naive_reads(duration, 2.0) == reads
        assert naive.naive_detection_delay(duration, 2.0) == pytest.approx(t - duration)


def test_durations_are_seeded_and_log_uniform_within_bounds() -> None:
    first = naive.log_uniform_durations(500, 10.0, 600.0, random.Random(3))
    again = naive.log_uniform_durations(500, 10.0, 600.0, random.Random(3))
    assert first == again
    assert all(10.0 <= d <= 600.0 for d in first)
    # Log-uniform: about half the jobs are shorter than the geometric mean (~77 s).
    short = sum(1 for d in first if d < (10.0 * 600.0) ** 0.5)
    assert 200 < short < 300


def test_a_webhook_brings_the_confirming_read_forward_without_an_extra_read() -> None:
    durations = naive.log_uniform_durations(200, 10.0, 600.0, random.Random(1))
    policy = poller.poll_policy(5.0, 120.0, 0.5)
    limits = poller.Limits(2400.0, 1000)
    arriving = poller.run_mode(durations, poller.Mode.WEBHOOKS, policy, limits, 9)
    lost = poller.run_mode(durations, poller.Mode.LOST, policy, limits, 9)
    assert arriving.completed == lost.completed == len(durations)
    assert arriving.reads == lost.reads
    assert all(delay == 0.0 for delay in arriving.delays)
    assert all(0.0 <= delay <= 120.0 for delay in lost.delays)
    assert max(lost.delays) > 10.0  # without webhooks the end is seen a backoff step late
    naive_result = poller.naive_mode(durations, 2.0)
    assert naive_result.mean_reads > lost.mean_reads


def test_the_simulation_obeys_the_decision_core_budget_and_deadline() -> None:
    policy = poller.poll_policy(5.0, 120.0, 0.5)
    cut = poller.simulate_job(
        600.0, poller.Mode.LOST, policy, poller.Limits(2400.0, 3), random.Random(2)
    )
    assert not cut.completed
    assert cut.reads == 3
    assert cut.outcome == EscalationReason.REQUEST_BUDGET_EXHAUSTED.value
    late = poller.simulate_job(
        600.0, poller.Mode.LOST, policy, poller.Limits(300.0, 1000), random.Random(2)
    )
    assert not late.completed
    assert late.outcome == EscalationReason.DEADLINE_EXCEEDED.value


def test_seeded_rows_are_valid_and_a_tick_reads_each_due_operation_once(
    db_url: str, tmp_path: Path
) -> None:
    seeded_at = datetime.now(UTC)
    due_ids = poller.seed(db_url, 40, 5, seeded_at)
    assert len(due_ids) == 5
    db = Database(db_url)
    try:
        assert audit.verify(db, None).ok
        with db.write() as conn:
            claims = leases.claim_records(conn, "smoke", seeded_at, 30.0, 100)
            leases.release(conn, [op.id for op, _ in claims], "smoke")
        assert sorted(op.id for op, _ in claims) == sorted(due_ids)
        seconds, claimed = poller.time_claim(db, "smoke", seeded_at, 100)
        assert claimed == 5 and seconds >= 0.0

        async def one_tick() -> tuple[int, int]:
            rig = poller.TickRig.build(db_url, due_ids, seeded_at, tmp_path)
            try:
                _, _, claimed = await rig.tick()
            finally:
                await rig.close()
            return claimed, rig.provider.reads

        assert asyncio.run(one_tick()) == (5, 5)
        with db.read() as conn:
            used: dict[str, int] = dict(
                conn.execute(sa.select(OPS.c.id, OPS.c.status_requests_used)).all()
            )
            reads = conn.execute(
                sa.select(HISTORY.c.operation_id).where(HISTORY.c.cause == "status_read")
            ).all()
        assert {op for op, n in used.items() if n} == set(due_ids)
        assert sorted(r.operation_id for r in reads) == sorted(due_ids)
        assert audit.verify(db, None).ok
    finally:
        db.dispose()


def _entry(kind: str, cause: str, at: datetime, to_state: str | None = None) -> dict[str, object]:
    return {"kind": kind, "cause": cause, "to_state": to_state, "at": at}


def test_lag_points_come_from_the_hint_the_confirming_read_and_the_first_step() -> None:
    t = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)

    def ms(n: int) -> datetime:
        return t + timedelta(milliseconds=n)

    entries = [
        _entry("transition", "observing", ms(0), "observing"),
        _entry("observation", "status_read", ms(100)),
        _entry("hint", "webhook:evt_1", ms(1000)),
        _entry("observation", "status_read", ms(1010)),
        _entry("transition", "status_confirmed_done", ms(1010), "result_collecting"),
        _entry("transition", "result_collected", ms(1020), "succeeded"),
    ]
    found = lag.lag_of("op_1", entries, ms(1030))
    assert found.via == "webhook"
    assert found.seconds("hint_at", "step_at") == pytest.approx(0.030)
    assert found.seconds("hint_at", "read_at") == pytest.approx(0.010)
    assert found.seconds("end_at", "step_at") == pytest.approx(0.010)
    # A hint answered by an earlier read does not explain the completion: a poll did.
    polled = [*entries[:3], _entry("observation", "status_read", ms(1005)), *entries[3:]]
    assert lag.lag_of("op_1", polled, ms(1030)).via == "poll"
    assert lag.lag_of("op_1", entries[:4], None).via == "incomplete"


def test_trace_stages_follow_one_operation_through_the_marks() -> None:
    t = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
    base = t.timestamp()
    found = lag.Lag("op_1", "webhook", hint_at=t, step_at=t + timedelta(seconds=1), job_id="j1")
    names = [end for _, _, end in lag.STAGES if end is not None]
    marks = [
        (base + 0.01 * (i + 1), name, "j1" if "_call" in name else "op_1")
        for i, name in enumerate(names)
    ]
    marks[0] = (marks[0][0], "wake", "-")
    marks.insert(0, (base - 1.0, "poll:start", "op_other"))
    parts = lag.trace_stages(marks, [found])
    assert all(len(values) == 1 for values in parts.values())
    assert parts["hint -> wake (commit, answer)"][0] == pytest.approx(0.01)
    assert parts["completion -> first step start"][0] == pytest.approx(1.0 - 0.01 * len(names))


def test_metric_parsers_read_prometheus_text() -> None:
    text = "\n".join(
        [
            'reconciler_status_requests_total{provider="sim",status="200"} 7.0',
            'reconciler_status_requests_total{provider="sim",status="503"} 2.0',
            'reconciler_hint_to_completion_seconds_bucket{le="0.05"} 3.0',
            'reconciler_hint_to_completion_seconds_bucket{le="0.1"} 4.0',
            "reconciler_hint_to_completion_seconds_count 4.0",
        ]
    )
    assert poller.status_reads(text) == 9
    share, count = lag.histogram_share(text, "reconciler_hint_to_completion_seconds", "0.05")
    assert (share, count) == (0.75, 4)
