"""``AsyncClient``: the agent API from asyncio code, the twin of ``Client``."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx

from reconciler.client import calls
from reconciler.client.model import HistoryEntry, Operation, Page, Provider, RunResult
from reconciler.client.sync import check_max_wait, new_key, settled_for_run, unreachable
from reconciler.client.tracecontext import trace_headers
from reconciler.core.errors import InvalidRequest, ServiceError

T = TypeVar("T")


class AsyncClient:
    """Start, wait for and cancel operations from asyncio; the same calls as ``Client``.

    Calls that cannot make a second job (reads, waits, cancels, and a start with an
    ``idempotency_key``) are retried ``retries`` times after a connection error,
    never after an answer: an error answer raises its ``reconciler.core.errors`` class.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        retry_delay: float = 0.25,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._retries, self._retry_delay = retries, retry_delay
        self._timeout = timeout
        self._cap: float | None = None
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": calls.USER_AGENT},
            timeout=timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: calls.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.body if call.has_body else None,
                    timeout=call.timeout if call.timeout is not None else self._timeout,
                    headers=trace_headers(),
                )
            except httpx.UnsupportedProtocol as exc:
                raise InvalidRequest(f"base_url {self.base_url!r} is not http(s)") from exc
            except httpx.TransportError as exc:
                if not call.idempotent or attempt >= self._retries:
                    raise unreachable(self.base_url, exc, call.idempotent) from exc
                await asyncio.sleep(self._retry_delay * 2**attempt)
                attempt += 1
                continue
            return calls.decode(call, response.status_code, response.content)

    async def wait_cap(self) -> float:
        """The service's cap on one long-poll (its ``server.wait_max_seconds``), read once."""
        if self._cap is None:
            try:
                self._cap = await self._send(calls.wait_cap())
            except ServiceError:
                return calls.DEFAULT_WAIT_STEP
        return self._cap

    async def start(
        self,
        provider: str,
        request: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
        deadline_seconds: float | None = None,
        max_status_requests: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Start an operation. It is NOT done: ``wait`` (or ``run``) for its answer."""
        return await self._send(
            calls.start(
                provider,
                request,
                idempotency_key=idempotency_key,
                callback_url=callback_url,
                deadline_seconds=deadline_seconds,
                max_status_requests=max_status_requests,
                metadata=metadata,
            )
        )

    async def get(self, op_id: str) -> Operation:
        return await self._send(calls.get(op_id))

    async def _wait(
        self, op_id: str, max_wait: float, settled: Callable[[Operation], bool]
    ) -> Operation:
        deadline = time.monotonic() + check_max_wait(max_wait)
        cap = await self.wait_cap()
        while True:
            left = max(0.0, deadline - time.monotonic())
            op = await self._send(calls.wait(op_id, min(left, cap), self._timeout))
            if settled(op) or time.monotonic() >= deadline:
                return op

    async def wait(self, op_id: str, max_wait: float = 600.0) -> Operation:
        """Long-poll until the operation is done or ``max_wait`` seconds passed (then
        ``done`` is false: it is still running). Each request stays within the cap."""
        return await self._wait(op_id, max_wait, lambda op: op.done)

    async def cancel(self, op_id: str, reason: str | None = None) -> Operation:
        """Record the intent; the operation is cancelled only once the provider confirms."""
        return await self._send(calls.cancel(op_id, reason))

    async def list(
        self,
        *,
        state: str | None = None,
        provider: str | None = None,
        done: bool | None = None,
        awaiting_decision: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page:
        """Your operations, newest first (``done=False``: the ones not done, those awaiting
        a decision included; ``awaiting_decision=True``: exactly those an operator must
        decide)."""
        return await self._send(
            calls.listing(
                state=state,
                provider=provider,
                done=done,
                awaiting_decision=awaiting_decision,
                limit=limit,
                cursor=cursor,
            )
        )

    async def history(self, op_id: str) -> builtins.list[HistoryEntry]:
        """Every entry, oldest first (the service pages them; this follows the pages)."""
        entries: builtins.list[HistoryEntry] = []
        cursor: str | None = None
        for _ in range(calls.MAX_HISTORY_PAGES):
            page = await self._send(calls.history(op_id, cursor))
            entries.extend(page.entries)
            cursor = page.next_cursor
            if cursor is None:
                break
        return entries

    async def providers(self) -> builtins.list[Provider]:
        return await self._send(calls.providers())

    async def run(
        self,
        provider: str,
        request: Mapping[str, Any],
        *,
        max_wait: float = 600.0,
        idempotency_key: str | None = None,
        deadline_seconds: float | None = None,
        max_status_requests: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Start one job and wait for its answer, up to ``max_wait`` seconds.

        The outcome is one of succeeded, completed_with_errors, failed, rejected (the
        provider refused the request: nothing ran), cancelled, timed_out (still running:
        keep ``operation_id`` and ``wait`` again later) or escalated (an operator must
        decide; the operation is not done until they do). Without an ``idempotency_key``
        one is made, so a resend after a connection error never starts a second job.
        """
        check_max_wait(max_wait)
        op = await self.start(
            provider,
            request,
            idempotency_key=idempotency_key or new_key(),
            deadline_seconds=deadline_seconds,
            max_status_requests=max_status_requests,
            metadata=metadata,
        )
        if not settled_for_run(op):
            op = await self._wait(op.id, max_wait, settled_for_run)
        return RunResult.of(op)
