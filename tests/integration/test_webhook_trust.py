"""Webhook trust through the real shell and the simulated provider, on a manual clock.

Every case runs the service's own steps (create, poll, webhook intake, the trust keeper)
against the sim over ASGI, on SQLite (the health's storage on PostgreSQL too); time only
moves when the rig moves it, to the next moment something is due.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from reconciler.core.trust import TrustPolicy, TrustState, Verdict
from reconciler.storage.database import Database
from reconciler.storage.trust import count_completions, load_health
from tests.support.trust_rig import POLLING, START, Rig, open_rig

TRUSTED_MAX = 10 * POLLING["max_delay_seconds"]


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


async def earn_trust(rig: Rig, count: int = POLLING["trust_after"]) -> list[str]:
    """``count`` short jobs whose webhooks arrive: each completion is webhook-first."""
    ids = [await rig.create(scenario="success", duration=20 + 7 * i) for i in range(count)]
    await rig.run_until(rig.done(*ids))
    return ids


def test_trust_is_earned_then_a_job_costs_one_read(tmp_path: Path, db_url: str) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url)
        try:
            assert rig.view().state is TrustState.LEARNING
            first = await earn_trust(rig)
            view = rig.view()
            assert view.state is TrustState.TRUSTED, view
            assert (view.webhook_first, view.misses, view.webhook_first_share) == (3, 0, 1.0)
            assert view.last_verified_webhook_at is not None
            # Learning: the normal schedule read each job several times before its webhook.
            assert all(rig.row(i)["status_requests_used"] >= 2 for i in first)

            op_id = await rig.create(scenario="success", duration=400)
            await rig.advance(1)
            row = rig.row(op_id)
            assert row["delay_source"] == "webhook_trust"
            wait = (row["next_poll_at"] - row["accepted_at"]).total_seconds()
            assert 0.5 * TRUSTED_MAX <= wait <= TRUSTED_MAX
            await rig.run_until(rig.done(op_id))
            row = rig.row(op_id)
            assert row["state"] == "succeeded"
            assert row["status_requests_used"] == 1  # the confirmation read only
            lines = rig.story(op_id)
            assert any("from webhook trust" in line for line in lines), lines
            assert rig.view().webhook_first == 4
            metrics = (await rig.client.get("/metrics")).text
            assert 'reconciler_webhook_trust_state{provider="sim",state="trusted"} 1.0' in metrics
            assert 'reconciler_webhook_trust_state{provider="sim",state="learning"} 0.0' in metrics
            assert 'reconciler_webhook_first_ratio{provider="sim"} 1.0' in metrics
            assert 'reconciler_webhook_misses_total{provider="sim"} 0.0' in metrics
            assert 'reconciler_status_reads_per_operation_count{provider="sim"} 4.0' in metrics
            assert 'reconciler_status_reads_per_operation_bucket{le="1.0",provider="sim"} 1.0' in (
                metrics
            )
        finally:
            await rig.close()

    run(body)


def test_an_outage_is_caught_at_the_first_miss_and_every_stretched_wait_comes_back(
    tmp_path: Path, db_url: str
) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url, provider_concurrency=2)
        try:
            await earn_trust(rig)
            waiting = [await rig.create(scenario="never_finishes") for _ in range(12)]
            lost = await rig.create(scenario="success", duration=30, webhooks="never")
            await rig.advance(1)
            stretched = {r["id"]: r["next_poll_at"] for r in rig.rows(delay_source="webhook_trust")}
            assert set(waiting) | {lost} == set(stretched)
            # The lost job's stretched read finds it done with no webhook: pending, not yet
            # a miss (a webhook may still follow within the grace).
            await rig.run_until(lambda: rig.row(lost)["done_at"] is not None)
            found_at = rig.now
            assert rig.verdicts()[-1]["verdict"] == Verdict.PENDING.value
            assert rig.view().state is TrustState.TRUSTED
            await rig.run_until(lambda: rig.view().state is TrustState.DISTRUSTED)
            assert rig.now - found_at <= timedelta(seconds=POLLING["webhook_grace_seconds"] + 2)
            view = rig.view()
            assert (view.misses, view.streak) == (1, 0)
            assert rig.verdicts()[-1]["verdict"] == Verdict.MISS.value
            # Every stretched operation is back on its normal schedule: never later than
            # the stretched read it had, and the others spread so at most 2 reads a second
            # come due (a read kept at its stretched moment was due then anyway).
            assert rig.rows(delay_source="webhook_trust") == []
            now = rig.now
            times = []
            for op_id in waiting:
                row = rig.row(op_id)
                assert row["delay_source"] == "local_backoff"
                notes = rig.notes(op_id)
                assert len(notes) == 1
                until = datetime.fromisoformat(notes[0]["detail"]["stretched_until"])
                assert now <= row["next_poll_at"] <= until
                if row["next_poll_at"] < until:
                    times.append(row["next_poll_at"])
                text = notes[0]["detail"]["note"]
                assert f"webhooks distrusted after a miss on {lost}; next poll " in text
                assert text.endswith("from local backoff")
            assert len(times) >= len(waiting) // 2, times  # the spread is what brings most back
            times.sort()
            for i in range(len(times) - 2):
                assert times[i + 2] - times[i] >= timedelta(seconds=0.5), times
            story = rig.story(waiting[0])
            assert any("webhooks distrusted after a miss on" in line for line in story), story
        finally:
            await rig.close()

    run(body)


def test_a_late_webhook_within_the_grace_is_not_a_miss(tmp_path: Path, db_url: str) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url)
        try:
            await earn_trust(rig)
            # The provider's webhook for this job comes 5 s after the end; the job ends
            # just before its stretched read, which therefore finds it first.
            op_id = await rig.create(scenario="never_finishes", webhooks="delayed", webhook_delay=5)
            await rig.advance(1)
            read_at = rig.row(op_id)["next_poll_at"]
            rig.clock.set(read_at - timedelta(seconds=1))
            rig.sim.force(rig.job(op_id), "succeeded")
            await rig.run_until(rig.done(op_id))
            assert rig.verdicts()[-1]["verdict"] == Verdict.PENDING.value
            await rig.advance(POLLING["webhook_grace_seconds"] + 2)
            last = rig.verdicts()[-1]
            assert last["verdict"] == Verdict.LATE.value
            assert last["hinted_at"] is not None
            view = rig.view()
            assert view.state is TrustState.TRUSTED
            assert (view.late, view.misses) == (1, 0)
        finally:
            await rig.close()

    run(body)


@pytest.mark.both_backends
def test_health_survives_a_restart(tmp_path: Path, db_url: str) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url)
        try:
            await earn_trust(rig)
        finally:
            await rig.close()
        tokens = (rig.agent_token, rig.operator_token)
        again = await open_rig(tmp_path, db_url, clock=rig.clock, tokens=tokens)
        try:
            assert again.view().state is TrustState.TRUSTED
            op_id = await again.create(scenario="success", duration=100)
            await again.advance(1)
            assert again.row(op_id)["delay_source"] == "webhook_trust"
        finally:
            await again.close()

    run(body)


@pytest.mark.both_backends
def test_two_replicas_share_the_health(tmp_path: Path, db_url: str) -> None:
    async def body() -> None:
        first = await open_rig(tmp_path, db_url)
        tokens = (first.agent_token, first.operator_token)
        second = await open_rig(
            tmp_path, db_url, clock=first.clock, sim=first.sim, tokens=tokens, seed=8
        )
        try:
            await earn_trust(first)
            assert second.view() == first.view()
            assert second.view().state is TrustState.TRUSTED
            # The other replica starts a job: its first fallback read is stretched too.
            op_id = await second.create(scenario="success", duration=50, webhooks="never")
            await second.advance(1)
            assert second.row(op_id)["delay_source"] == "webhook_trust"
            # ... and the miss that replica finds distrusts the provider for both.
            await second.run_until(lambda: second.view().state is TrustState.DISTRUSTED)
            assert first.view().state is TrustState.DISTRUSTED
            assert first.view() == second.view()
        finally:
            await second.close()
            await first.close()

    run(body)


@pytest.mark.both_backends
def test_counting_from_many_transactions_at_once_loses_no_update(db_url: str) -> None:
    """Replicas counting completions of one provider at the same moment: every one counts."""
    writers, each = 8, 5
    policy = TrustPolicy(trust_after=writers * each)
    barrier = threading.Barrier(writers)
    # Eight processes' worth of writers on one SQLite file take its lock in turns, and a
    # loaded machine can keep one waiting past the service's 5 s bound: what is tested is
    # that no count is lost, not that bound.
    databases = [Database(db_url, write_wait_seconds=60) for _ in range(writers)]
    transitions: list[int] = []
    errors: list[BaseException] = []

    def write(index: int) -> None:
        db = databases[index]
        try:
            barrier.wait(timeout=30)
            for n in range(each):
                with db.write() as conn:
                    found = count_completions(
                        conn,
                        "sim",
                        [(Verdict.WEBHOOK_FIRST, f"op_{index}_{n}")],
                        START,
                        policy,
                    )
                transitions.extend(1 for _ in found)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    def round_of_writers() -> None:
        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    try:
        round_of_writers()  # learning, then trusted by the last of them
        assert not errors, errors
        with databases[0].read() as conn:
            health = load_health(conn, "sim")
        assert (health.webhook_first, health.streak) == (writers * each, writers * each)
        assert health.state is TrustState.TRUSTED
        assert transitions == [1]  # exactly one transaction made it trusted
        round_of_writers()  # trusted: the one-statement increments, all at once
        assert not errors, errors
        with databases[0].read() as conn:
            health = load_health(conn, "sim")
        assert health.webhook_first == 2 * writers * each
        assert transitions == [1]
    finally:
        for db in databases:
            db.dispose()


def test_a_job_done_before_its_deadline_with_its_webhook_lost_succeeds(
    tmp_path: Path, db_url: str
) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url)
        try:
            await earn_trust(rig)
            # Trusted: the first fallback read would come 600-1200 s after the create, past
            # this operation's 300 s deadline. The final look reads just before it.
            body = {
                "provider": "sim",
                "request": {"scenario": "success", "duration": 60, "webhooks": "never"},
                "deadline_seconds": 300,
            }
            response = await rig.client.post("/v1/operations", json=body, headers=rig.headers())
            op_id = response.json()["id"]
            await rig.run_until(rig.done(op_id))
            row = rig.row(op_id)
            assert row["state"] == "succeeded"
            assert row["status_requests_used"] == 1
            entries = await rig.history(op_id)
            observing = next(e for e in entries if e["to"] == "observing")
            assert observing["delay_source"] == "webhook_trust"
            read = next(e for e in entries if e["cause"] == "status_read")
            deadline = row["deadline_at"]
            assert datetime.fromisoformat(read["at"]) < deadline
        finally:
            await rig.close()

    run(body)


def test_trust_off_records_nothing_and_never_stretches(tmp_path: Path, db_url: str) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url, polling={"webhook_trust": "off"})
        try:
            ids = await earn_trust(rig, count=5)
            assert rig.verdicts() == []
            view = rig.view()
            assert (view.state, view.webhook_first) == (None, 0)
            for op_id in ids:
                sources = {e["delay_source"] for e in await rig.history(op_id)}
                assert "webhook_trust" not in sources
        finally:
            await rig.close()

    run(body)


def test_a_failure_is_announced_like_a_success(tmp_path: Path, db_url: str) -> None:
    async def body() -> None:
        rig = await open_rig(tmp_path, db_url)
        try:
            await earn_trust(rig)
            op_id = await rig.create(scenario="late_failure", duration=90)
            await rig.run_until(rig.done(op_id))
            row = rig.row(op_id)
            assert (row["state"], row["status_requests_used"]) == ("failed", 1)
            assert rig.verdicts()[-1]["verdict"] == Verdict.WEBHOOK_FIRST.value
            assert rig.view().webhook_first == POLLING["trust_after"] + 1
        finally:
            await rig.close()

    run(body)
