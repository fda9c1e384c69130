"""What ``reconciler demo`` shows: live progress while it runs, and the closing summary.

Progress is a ``rich`` table redrawn in place on a terminal and a plain line every
few seconds otherwise (no ANSI codes in pipes and logs). The summary is plain text
built from values the demo collected; nothing here does I/O beyond writing to the
console it is given.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean
from types import TracebackType
from typing import Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from reconciler.core.states import END_STATES, State
from reconciler.core.trust import TrustView

FIXED_POLL_INTERVAL = 2.0
PLAIN_EVERY_SECONDS = 2.0
# End states first in a fixed order, then escalated, then anything still moving.
STATE_ORDER = [s.value for s in State if s in END_STATES] + [State.ESCALATED.value]
END_VALUES = frozenset(s.value for s in END_STATES)


def fixed_poller_requests(seconds: float, interval: float = FIXED_POLL_INTERVAL) -> int:
    """Status requests a poller reading every ``interval`` seconds makes until it sees the end.

    Its reads happen at ``interval``, ``2 x interval``, ...; the first one at or after the
    end is the last, so it makes ``ceil(seconds / interval)`` of them (at least one).
    """
    return max(1, math.ceil(max(0.0, seconds) / interval))


def settled(state: str) -> bool:
    """An end state, or escalated: waiting for a person, which is a bounded stop too."""
    return state == State.ESCALATED.value or state in END_VALUES


@dataclass(frozen=True)
class Snapshot:
    """The batch at one moment, for the progress view."""

    elapsed: float
    total: int
    states: Counter[str]
    by_kind: dict[str, Counter[str]]
    status_requests: int
    callbacks: int

    @property
    def settled(self) -> int:
        return sum(n for state, n in self.states.items() if settled(state))


class ProgressView(Protocol):
    def __enter__(self) -> ProgressView: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def update(self, snapshot: Snapshot) -> None: ...


def _states_text(counts: Counter[str]) -> str:
    ordered = sorted(counts.items(), key=lambda kv: (_rank(kv[0]), kv[0]))
    return ", ".join(f"{state} {n}" for state, n in ordered)


def _rank(state: str) -> int:
    return STATE_ORDER.index(state) if state in STATE_ORDER else -1


def progress_line(snap: Snapshot) -> str:
    return (
        f"[{snap.elapsed:5.1f}s] {snap.settled}/{snap.total} settled | "
        f"{_states_text(snap.states)} | status requests {snap.status_requests} | "
        f"callbacks {snap.callbacks}"
    )


def progress_table(snap: Snapshot) -> Group:
    table = Table(title="reconciler demo", title_justify="left", expand=False)
    table.add_column("scenario")
    table.add_column("ops", justify="right")
    table.add_column("settled", justify="right")
    table.add_column("states")
    for kind in sorted(snap.by_kind):
        counts = snap.by_kind[kind]
        done = sum(n for state, n in counts.items() if settled(state))
        table.add_row(kind, str(sum(counts.values())), str(done), _states_text(counts))
    totals = (
        f"elapsed {snap.elapsed:.1f}s   settled {snap.settled}/{snap.total}   "
        f"status requests {snap.status_requests}   callbacks received {snap.callbacks}"
    )
    return Group(table, Text(totals), Text(_states_text(snap.states) or "submitting…"))


class LiveView:
    """A table updated in place (terminals only)."""

    def __init__(self, console: Console) -> None:
        self._live = Live(console=console, auto_refresh=False, transient=False)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._live.__exit__(kind, exc, tb)

    def update(self, snapshot: Snapshot) -> None:
        self._live.update(progress_table(snapshot), refresh=True)


class PlainView:
    """One line every few seconds, and one whenever the settled count grows to the total."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._last_at = -math.inf
        self._last_settled = -1

    def __enter__(self) -> PlainView:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def update(self, snapshot: Snapshot) -> None:
        finished = snapshot.settled == snapshot.total and snapshot.settled != self._last_settled
        if finished or snapshot.elapsed - self._last_at >= PLAIN_EVERY_SECONDS:
            print(progress_line(snapshot), file=self._out, flush=True)
            self._last_at = snapshot.elapsed
            self._last_settled = snapshot.settled


def make_view(out: TextIO | None = None) -> ProgressView:
    stream = out or sys.stdout
    if stream.isatty():
        return LiveView(Console(file=stream))
    return PlainView(stream)


# --- the summary ---------------------------------------------------------------------


@dataclass(frozen=True)
class OpOutcome:
    """One operation at the end of the run. Times are epoch seconds."""

    op_id: str
    kind: str
    state: str
    submitted_at: float
    done_at: float | None
    provider_final_at: float | None  # the simulated job's first final state
    status_requests: int | None  # as the provider counted them; None if no job was made
    callbacks: int
    escalation_reason: str | None = None
    escalation_message: str | None = None
    provider: str = "sim"

    @property
    def done(self) -> bool:
        return self.state != State.ESCALATED.value and settled(self.state)

    def fixed_poller(self) -> int | None:
        if self.provider_final_at is None:
            return None
        return fixed_poller_requests(self.provider_final_at - self.submitted_at)

    def lag(self) -> float | None:
        """From the provider's final state to the operation's end, as the service saw it."""
        if self.done_at is None or self.provider_final_at is None:
            return None
        return max(0.0, self.done_at - self.provider_final_at)


@dataclass(frozen=True)
class TrustSummary:
    """One provider's webhook trust as the run watched it, and at the end."""

    timeline: Sequence[tuple[float, str]]  # (seconds into the run, state) at each change
    final: TrustView


@dataclass(frozen=True)
class RunReport:
    seed: int
    timeout: float
    elapsed: float
    outcomes: Sequence[OpOutcome]
    repeats: Sequence[tuple[str, str | None]]  # (expected op id, op id the repeat returned)
    rejected_callbacks: int
    audit_text: str
    audit_ok: bool
    problems: Sequence[str] = field(default_factory=tuple)
    mcp_lines: Sequence[str] = field(default_factory=tuple)  # one job through MCP, last
    trust: Sequence[TrustSummary] = ()  # one per provider
    # Scenario -> "state" or "escalated:reason": how its operations must end.
    expected_ends: Mapping[str, str] = field(default_factory=dict)

    @property
    def unexpected_ends(self) -> list[OpOutcome]:
        """Settled operations that ended otherwise than their scenario does."""
        out = []
        for o in self.outcomes:
            want = self.expected_ends.get(o.kind)
            if want is None or not settled(o.state):
                continue
            got = o.state if o.state != "escalated" else f"escalated:{o.escalation_reason}"
            if got != want:
                out.append(o)
        return out

    @property
    def unsettled(self) -> list[OpOutcome]:
        return [o for o in self.outcomes if not settled(o.state)]

    @property
    def callback_faults(self) -> list[OpOutcome]:
        """Finished operations without exactly one callback, or escalated ones with any."""
        return [o for o in self.outcomes if o.callbacks != (1 if o.done else 0)]

    @property
    def repeat_faults(self) -> list[tuple[str, str | None]]:
        return [(want, got) for want, got in self.repeats if want != got]

    def failures(self) -> list[str]:
        reasons = list(self.problems)
        for o in self.unexpected_ends:
            reasons.append(
                f"{o.op_id} ({o.kind}) ended {o.state}"
                + (f" ({o.escalation_reason})" if o.escalation_reason else "")
                + f", not {self.expected_ends[o.kind]}"
            )
        if self.unsettled:
            moving = Counter(o.state for o in self.unsettled)
            reasons.append(
                f"{len(self.unsettled)} operation(s) neither ended nor escalated within "
                f"{self.timeout:g} s ({_states_text(moving)})"
            )
        if self.callback_faults:
            reasons.append(
                f"{len(self.callback_faults)} operation(s) did not get exactly the expected "
                "callbacks: " + ", ".join(f"{o.op_id}={o.callbacks}" for o in self.callback_faults)
            )
        if self.rejected_callbacks:
            reasons.append(f"{self.rejected_callbacks} callback(s) failed signature verification")
        if self.repeat_faults:
            reasons.append(
                "a repeated idempotency key did not return the same operation: "
                + ", ".join(f"{want} -> {got}" for want, got in self.repeat_faults)
            )
        if not self.audit_ok:
            reasons.append(f"audit verify failed: {self.audit_text}")
        return reasons


def _section(title: str) -> list[str]:
    return ["", title, "-" * len(title)]


def _end_states(outcomes: Sequence[OpOutcome]) -> list[str]:
    lines = _section("Operations per end state")
    counts = Counter(o.state for o in outcomes)
    for state, n in sorted(counts.items(), key=lambda kv: (_rank(kv[0]) < 0, _rank(kv[0]))):
        note = ""
        if state == State.ESCALATED.value:
            note = "  (stopped with a reason; waiting for a person's decision)"
        elif not settled(state):
            note = "  (still moving: NOT settled)"
        lines.append(f"  {state:<26}{n:>4}{note}")
    lines.append("")
    lines.append(f"  {'scenario':<24}{'ops':>4}  states")
    by_kind: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, Counter())[o.state] += 1
    for kind in sorted(by_kind):
        counts = by_kind[kind]
        lines.append(f"  {kind:<24}{sum(counts.values()):>4}  {_states_text(counts)}")
    return lines


def _indent(text: str, prefix: str = "      ") -> list[str]:
    return [prefix + line for line in text.splitlines()]


def _escalations(outcomes: Sequence[OpOutcome]) -> list[str]:
    escalated = [o for o in outcomes if o.escalation_reason]
    lines = _section(f"Escalations ({len(escalated)})")
    if not escalated:
        lines.append("  none")
        return lines
    by_reason: dict[str, list[OpOutcome]] = {}
    for o in escalated:
        by_reason.setdefault(o.escalation_reason or "", []).append(o)
    for reason in sorted(by_reason):
        group = by_reason[reason]
        kinds = ", ".join(sorted({o.kind for o in group}))
        lines.append(f"  {reason}: {len(group)} operation(s) (scenario {kinds})")
        first = group[0]
        lines.extend(_indent(first.escalation_message or "(no message)"))
        others = [o.op_id for o in group[1:]]
        if others:
            lines.append(f"      … and {len(others)} more like it: {', '.join(others)}")
    return lines


def _mean_text(values: Iterable[float]) -> str:
    items = list(values)
    return f"{mean(items):.1f}" if items else "-"


def _requests(outcomes: Sequence[OpOutcome]) -> list[str]:
    lines = _section("Status requests per operation (as the provider counted them)")
    measured = [
        o for o in outcomes if o.status_requests is not None and o.fixed_poller() is not None
    ]
    # Escalated operations stopped early; counting them would flatter the service.
    finished = [o for o in measured if o.done]
    if not finished:
        return [*lines, "  no operation finished"]
    ours = [o.status_requests or 0 for o in finished]
    fixed = [o.fixed_poller() or 0 for o in finished]
    lines.append(f"  over the {len(finished)} finished operations:")
    lines.append(f"    this service:          {sum(ours):>5} in total, mean {mean(ours):.1f}")
    lines.append(
        f"    fixed 2-second poller: {sum(fixed):>5} in total, mean {mean(fixed):.1f}"
        "  (ceil(time from submission to the provider's final state / 2 s))"
    )
    lines.append(f"    ratio: {sum(ours) / sum(fixed):.2f} of the fixed poller's requests")
    lines.append("")
    lines.append(f"  {'scenario':<24}{'ops':>4}{'service':>9}{'fixed 2s':>10}{'lag to end':>12}")
    for kind in sorted({o.kind for o in measured}):
        group = [o for o in measured if o.kind == kind]
        lags = [lag for o in group if (lag := o.lag()) is not None]
        lag_text = f"{_mean_text(lags)} s" if lags else "-"
        lines.append(
            f"  {kind:<24}{len(group):>4}"
            f"{_mean_text(o.status_requests or 0 for o in group):>9}"
            f"{_mean_text(o.fixed_poller() or 0 for o in group):>10}{lag_text:>12}"
        )
    lags = [lag for o in finished if (lag := o.lag()) is not None]
    if lags:
        lines.append(
            "  (means per operation; lag to end = from the provider's final state to the "
            f"operation's end state: mean {mean(lags):.1f} s, max {max(lags):.1f} s; a fixed "
            "2 s poller: up to 2 s)"
        )
    return lines


def _callbacks(report: RunReport) -> list[str]:
    lines = _section("Callbacks")
    done = [o for o in report.outcomes if o.done]
    delivered = sum(o.callbacks for o in report.outcomes)
    once = sum(1 for o in done if o.callbacks == 1)
    lines.append(
        f"  {delivered} delivered (signature verified) for {len(done)} finished operations; "
        f"exactly once each: {once} of {len(done)}"
        + ("  -> ok" if once == len(done) and not report.callback_faults else "  -> PROBLEM")
    )
    escalated = [o for o in report.outcomes if o.state == State.ESCALATED.value]
    if escalated:
        lines.append(
            f"  {len(escalated)} escalated operation(s) got no callback: they are not done until "
            "a person decides (the callback follows the decision)"
        )
    if report.rejected_callbacks:
        lines.append(f"  {report.rejected_callbacks} request(s) failed signature verification")
    for o in report.callback_faults:
        lines.append(f"  PROBLEM {o.op_id} ({o.state}): {o.callbacks} callback(s)")
    return lines


def _idempotency(report: RunReport) -> list[str]:
    lines = _section("Repeated idempotency keys")
    if not report.repeats:
        return [*lines, "  none sent"]
    same = len(report.repeats) - len(report.repeat_faults)
    lines.append(
        f"  {len(report.repeats)} repeated submission(s) with the same key and request: "
        f"{same} returned the existing operation" + ("  -> ok" if not report.repeat_faults else "")
    )
    return lines


def _trust(report: RunReport) -> list[str]:
    lines: list[str] = []
    for summary in report.trust:
        lines.extend(_provider_trust(summary, report.outcomes))
    return lines


def _provider_trust(summary: TrustSummary, outcomes: Sequence[OpOutcome]) -> list[str]:
    v = summary.final
    mine = [o for o in outcomes if o.provider == v.provider]
    kinds = ", ".join(sorted({o.kind for o in mine})) or "none"
    lines = _section(f"Webhook trust (provider {v.provider})")
    lines.append(f"  {len(mine)} operation(s): {kinds}")
    if v.state is None:
        return [*lines, "  off: every operation on the normal schedule"]
    changes = ", ".join(f"{state} at {max(0.0, at):.0f} s" for at, state in summary.timeline)
    lines.append(f"  states seen: {changes}")
    share = f"{v.webhook_first_share:.0%}" if v.webhook_first_share is not None else "n/a"
    lines.append(
        f"  now {v.state.value}: {v.webhook_first} webhook-first, {v.late} late, "
        f"{v.misses} missed ({share} webhook-first), streak {v.streak} of {v.trust_after}"
    )
    finished = [o for o in mine if o.done and o.status_requests is not None and o.fixed_poller()]
    if finished:
        ours = [o.status_requests or 0 for o in finished]
        fixed = sum(o.fixed_poller() or 0 for o in finished)
        lines.append(
            f"  status reads per finished operation: {mean(ours):.2f}, "
            f"{sum(ours) / fixed:.2f} of the fixed poller's (a webhook-first completion "
            "under trust costs one: the confirmation read)"
        )
    return lines


def render_report(report: RunReport) -> str:
    lines = [
        "",
        f"Summary: {len(report.outcomes)} operations, seed {report.seed}, {report.elapsed:.1f} s",
        *_end_states(report.outcomes),
        *_escalations(report.outcomes),
        *_requests(report.outcomes),
        *_trust(report),
        *_callbacks(report),
        *_idempotency(report),
        *_section("Audit"),
        f"  {report.audit_text}",
        *(
            _section("One job through MCP (start_job, then wait_job)") + list(report.mcp_lines)
            if report.mcp_lines
            else []
        ),
        "",
    ]
    failures = report.failures()
    if failures:
        lines.append("RESULT: FAILED")
        lines.extend(f"  - {reason}" for reason in failures)
    else:
        lines.append(
            f"RESULT: OK: every operation ended or escalated with a reason within "
            f"{report.timeout:g} s"
        )
    return "\n".join(lines)
