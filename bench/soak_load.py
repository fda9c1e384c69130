"""The agent side of the soak: what each operation asks for, and the agent that asks.

Every random choice about an operation (scenario, timings, cancel, resubmission,
callback) is drawn up front from the seeded ``random.Random``, so the plan of a run
is a function of its seed whatever the timing of the run turns out to be.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from reconciler.demo.sim import FaultRates

# The provider's chaos: every endpoint, every job (lost answers, resets, 5xx, at random).
CHAOS = FaultRates(
    server_error=0.04,
    rate_limit=0.03,
    drop=0.03,
    delay=0.02,
    delay_seconds=1.5,
    retry_after_seconds=1.0,
    invisible=0.05,
    invisible_seconds=1.5,
    webhook_never=0.10,
    webhook_duplicate=0.12,
    webhook_early_lie=0.06,
    webhook_out_of_order=0.10,
    webhook_delayed=0.10,
)


@dataclass(frozen=True)
class OpPlan:
    index: int
    kind: str
    key: str
    request: dict[str, Any]
    callback: bool
    deadline_seconds: float | None = None
    max_status_requests: int | None = None
    cancel_after: float | None = None
    resubmit_after: float | None = None


def _u(rng: random.Random, low: float, high: float) -> float:
    return round(rng.uniform(low, high), 2)


def _success(rng: random.Random) -> dict[str, Any]:
    request: dict[str, Any] = {"scenario": "success", "duration": _u(rng, 0.2, 2.0)}
    hint = rng.random()
    if hint < 0.1:
        request["poll_after_seconds"] = _u(rng, 0.3, 1.0)
    elif hint < 0.2:
        request["next_check_in"] = _u(rng, 0.3, 1.0)
    elif hint < 0.25:
        request["poll_after_seconds"] = rng.choice([-1, "soon", 1e9])
    return request


def _result_fault(rng: random.Random) -> dict[str, Any]:
    fault = rng.choice(
        ["checksum_mismatch", "size_mismatch", "missing_rows", "wrong_content_type", "unavailable"]
    )
    return {"scenario": "success", "duration": _u(rng, 0.2, 1.5), "result_fault": fault}


def _status_fault(rng: random.Random) -> dict[str, Any]:
    return {
        "scenario": "success",
        "duration": _u(rng, 1.0, 3.0),
        "status_fault": rng.choice([429, 429, 503]),
        "status_fault_count": rng.randint(1, 2),
        "status_fault_after": rng.randint(0, 2),
        "retry_after": rng.choice([1, 2]),
        "retry_after_form": rng.choice(["seconds", "http-date"]),
    }


def _cancelled(rng: random.Random) -> dict[str, Any]:
    mode = rng.choices(["normal", "race", "never"], weights=[6, 3, 1])[0]
    return {
        "scenario": rng.choice(["success", "success", "late_failure", "partial"]),
        "duration": _u(rng, 1.5, 4.0),
        "cancel": mode,
        "cancel_delay": _u(rng, 0.2, 1.5),
    }


# kind -> (weight, request builder, extra plan fields)
Builder = Callable[[random.Random], dict[str, Any]]
MIX: dict[str, tuple[int, Builder]] = {
    "success": (30, _success),
    "slow_success": (5, lambda r: {"scenario": "slow_success", "duration": _u(r, 2.0, 5.0)}),
    "partial": (
        8,
        lambda r: {
            "scenario": "partial",
            "duration": _u(r, 0.3, 2.0),
            "failed_items": r.randint(1, 5),
        },
    ),
    "late_failure": (8, lambda r: {"scenario": "late_failure", "duration": _u(r, 0.3, 2.0)}),
    "expired": (3, lambda r: {"scenario": "expired", "duration": _u(r, 0.3, 2.0)}),
    "unknown_state": (3, lambda r: {"scenario": "unknown_state", "duration": _u(r, 0.3, 1.5)}),
    "no_result": (2, lambda r: {"scenario": "success_without_result", "duration": _u(r, 0.2, 1.0)}),
    "result_fault": (4, _result_fault),
    "deadline": (4, lambda r: {"scenario": "never_finishes", "duration": _u(r, 1.0, 3.0)}),
    "budget": (3, lambda r: {"scenario": "slow_success", "duration": 8.0}),
    "create_drop": (4, lambda r: {**_success(r), "create_fault": "drop"}),
    "create_500": (3, lambda r: {**_success(r), "create_fault": "500_after_create"}),
    "create_hang": (2, lambda r: {**_success(r), "create_fault": "delay", "create_delay": 7.0}),
    "status_fault": (6, _status_fault),
    "invisible": (3, lambda r: {**_success(r), "invisible_for": _u(r, 0.5, 2.0)}),
    "auth_denied": (1, lambda r: {**_success(r), "auth_fault": 403, "auth_fault_after": 1}),
    "cancel": (11, _cancelled),
}


def plan_operations(rng: random.Random, count: int, run_tag: str) -> list[OpPlan]:
    kinds = list(MIX)
    weights = [MIX[k][0] for k in kinds]
    plans = []
    for index in range(count):
        kind = rng.choices(kinds, weights=weights)[0]
        request = {**MIX[kind][1](rng), "soak": {"run": run_tag, "op": index}}
        cancel_after = None
        if kind == "cancel":
            cancel_after = _u(rng, 0.0, 2.5)
        elif rng.random() < 0.04:
            cancel_after = _u(rng, 0.0, 3.0)  # a cancel that races whatever happens
        plans.append(
            OpPlan(
                index=index,
                kind=kind,
                key=f"soak-{run_tag}-{index}",
                request=request,
                callback=rng.random() < 0.85,
                deadline_seconds=_u(rng, 3.0, 6.0) if kind == "deadline" else None,
                max_status_requests=rng.randint(2, 4) if kind == "budget" else None,
                cancel_after=cancel_after,
                resubmit_after=_u(rng, 0.0, 3.0) if rng.random() < 0.12 else None,
            )
        )
    return plans


# --- the agent -----------------------------------------------------------------------


@dataclass
class OpRecord:
    plan: OpPlan
    op_id: str | None = None
    submitted_at: float | None = None
    create_statuses: list[int] = field(default_factory=list)
    resubmitted_id: str | None = None
    cancel_status: int | None = None
    errors: list[str] = field(default_factory=list)


class Agent:
    """Submits, resubmits and cancels over real HTTP; retries through outages with the same key."""

    def __init__(
        self,
        pick_url: Callable[[], str],
        token: str,
        callback_base: str,
        *,
        retry_for: float = 120.0,
    ) -> None:
        self.pick_url = pick_url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.callback_base = callback_base
        self.retry_for = retry_for
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(20.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            trust_env=False,
        )
        self.retries = 0

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _post(self, path: str, body: dict[str, Any] | None) -> httpx.Response | str:
        """POST to a replica that is up, retrying transport errors and 5xx (bounded)."""
        deadline = time.monotonic() + self.retry_for
        problem = "no attempt"
        while time.monotonic() < deadline:
            try:
                response = await self.client.post(
                    f"{self.pick_url()}{path}", json=body, headers=self.headers
                )
            except httpx.TransportError as exc:
                problem = type(exc).__name__
            else:
                if response.status_code < 500:
                    return response
                problem = f"HTTP {response.status_code}"
            self.retries += 1
            await asyncio.sleep(0.25)
        return f"gave up after {self.retry_for:g} s: {problem}"

    def create_body(self, plan: OpPlan) -> dict[str, Any]:
        body: dict[str, Any] = {
            "provider": "sim",
            "request": plan.request,
            "idempotency_key": plan.key,
        }
        if plan.callback:
            body["callback_url"] = f"{self.callback_base}/cb/{plan.index}"
        if plan.deadline_seconds is not None:
            body["deadline_seconds"] = plan.deadline_seconds
        if plan.max_status_requests is not None:
            body["max_status_requests"] = plan.max_status_requests
        return body

    async def _create(self, record: OpRecord) -> str | None:
        answer = await self._post("/v1/operations", self.create_body(record.plan))
        if isinstance(answer, str):
            record.errors.append(f"create: {answer}")
            return None
        record.create_statuses.append(answer.status_code)
        if answer.status_code not in (200, 202):
            record.errors.append(f"create: HTTP {answer.status_code} {answer.text[:200]}")
            return None
        op_id: str = answer.json()["id"]
        return op_id

    async def run(self, plan: OpPlan) -> OpRecord:
        record = OpRecord(plan, submitted_at=time.time())
        record.op_id = await self._create(record)
        if record.op_id is None:
            return record
        waits = []
        if plan.resubmit_after is not None:
            waits.append(self._resubmit(record, plan.resubmit_after))
        if plan.cancel_after is not None:
            waits.append(self._cancel(record, plan.cancel_after))
        await asyncio.gather(*waits)
        return record

    async def _resubmit(self, record: OpRecord, after: float) -> None:
        await asyncio.sleep(after)
        record.resubmitted_id = await self._create(record)

    async def _cancel(self, record: OpRecord, after: float) -> None:
        await asyncio.sleep(after)
        answer = await self._post(
            f"/v1/operations/{record.op_id}/cancel", {"reason": "soak: agent changed its mind"}
        )
        if isinstance(answer, str):
            record.errors.append(f"cancel: {answer}")
            return
        record.cancel_status = answer.status_code
        if answer.status_code != 202:
            record.errors.append(f"cancel: HTTP {answer.status_code} {answer.text[:200]}")
