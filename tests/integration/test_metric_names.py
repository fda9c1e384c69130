"""``/metrics`` held to the Prometheus naming conventions, and the Grafana dashboard to it.

A real runtime (the service and the simulated provider in one process, on a manual
clock) runs operations to their end, one of them into an escalation; what that short
run cannot reach (a lease takeover, a client that leaves, a front-door refusal, a hook,
a callback, the lag a completion step observes) is counted through the runtime's own
``Metrics`` with the label values the service itself uses. Every family must then have
a sample (a histogram an observation), so a family added later fails here until this
run gives it one, and then its name is checked.

The rules are derived from each family's parsed type, name, help text and samples,
never from a list of the names we have, so a new badly named family fails without this
file knowing it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from reconciler.api.frontdoor import Refusal
from reconciler.core.vocabulary import EscalationReason
from tests.support.databases import sqlite_url
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.trust_rig import open_rig

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "reconciler.json"
PREFIX = "reconciler_"
BASE_UNITS = ("seconds", "bytes", "ratio")
# Units a name should not carry: Prometheus wants the base unit instead.
NON_BASE_UNITS = (
    "milliseconds",
    "microseconds",
    "ms",
    "minutes",
    "hours",
    "days",
    "kilobytes",
    "megabytes",
    "gigabytes",
    "bits",
    "percent",
)
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
# Label names that say their values are one per operation, job, caller or request.
UNBOUNDED_LABELS = re.compile(r"(^|_)(id|ids|key|url|uri|path|token|trace|job|operation|caller)$")
# A bounded value: a provider name, an HTTP status, an enum value, a bucket bound.
BOUNDED_VALUE = re.compile(r"^[A-Za-z0-9_.+-]{1,48}$")
# An operation's columns that are one of a kind: none may reach a label.
IDENTIFYING_COLUMNS = (
    "id",
    "remote_job_id",
    "trace_id",
    "idempotency_key",
    "idempotency_token",
    "request_fingerprint",
    "lease_owner",
)


@dataclass(frozen=True)
class Scrape:
    text: str
    families: dict[str, Any]  # name -> prometheus_client Metric, `_created` gauges left out
    identifiers: frozenset[str]  # operation ids, job ids, tokens, URLs of the run


def _created_of_another(name: str, kind: str, names: set[str]) -> bool:
    """prometheus_client's ``<family>_created`` gauge: the start time of a counter or histogram."""
    return kind == "gauge" and name.endswith("_created") and name.removesuffix("_created") in names


def parse(text: str) -> dict[str, Any]:
    parsed = list(text_string_to_metric_families(text))
    names = {f.name for f in parsed if f.type in ("counter", "histogram")}
    return {f.name: f for f in parsed if not _created_of_another(f.name, f.type, names)}


async def _run(tmp: Path, db_url: str) -> Scrape:
    rig = await open_rig(tmp, db_url)
    try:
        ids = [await rig.create(scenario="success", duration=20 + 7 * i) for i in range(2)]
        await rig.run_until(rig.finished(*ids))
        answer = await rig.submit({"scenario": "never_finishes"}, max_status_requests=1)
        assert answer.status_code == 202, answer.text
        stuck = str(answer.json()["id"])  # escalated when its one status read is spent
        await rig.run_until(lambda: rig.row(stuck)["escalation_id"] is not None)
        metrics = rig.runtime.metrics
        # What this run does not reach, counted with the values the service counts.
        metrics.lease_takeovers.inc()
        metrics.client_disconnects.labels("api").inc()
        metrics.front_door_refusals.labels(Refusal.HEADER_TIMEOUT.value).inc()
        metrics.hook_runs.labels("ok").inc()
        metrics.callback_attempts.labels("delivered").inc()
        metrics.escalations.labels(EscalationReason.CALLBACK_UNDELIVERABLE.value).inc()
        metrics.lag.observe(0.03)  # observed when a completion step starts; none is set up
        metrics.pruned({"operations": 1})  # retention is off in this run
        metrics.retention_sweeps.labels("idle").inc()
        response = await rig.client.get("/metrics")
        assert response.status_code == 200, response.text
        rows = [rig.row(i) for i in [*ids, stuck]]
        identifiers = {str(r[k]) for r in rows for k in IDENTIFYING_COLUMNS if r.get(k)}
        identifiers |= {rig.agent_token, rig.operator_token, SIM_TOKEN, WEBHOOK_SECRET, "://"}
        return Scrape(response.text, parse(response.text), frozenset(identifiers))
    finally:
        await rig.close()


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    tmp = tmp_path_factory.mktemp("metric-names")
    with sqlite_url(tmp) as url:
        yield asyncio.run(_run(tmp, url))


def sample_names(families: dict[str, Any]) -> set[str]:
    return {s.name for f in families.values() for s in f.samples}


def _basics(name: str, kind: str, help_text: str, samples: list[Sample]) -> Iterator[str]:
    if not name.startswith(PREFIX):
        yield f"does not start with {PREFIX!r}"
    if not help_text.strip():
        yield "has no help text"
    if kind not in ("counter", "gauge", "histogram"):
        yield f"has type {kind!r} (we expose counters, gauges and histograms)"
    counts = [s for s in samples if s.name.endswith("_count")]
    if not samples or (kind == "histogram" and not any(s.value for s in counts)):
        yield "has no sample in this run: give it one above, then its name is checked"


def _by_type(name: str, kind: str, help_text: str, samples: list[Sample]) -> Iterator[str]:
    if kind == "counter" and any(not s.name.endswith("_total") for s in samples):
        yield "is a counter whose samples do not end in _total"
    if kind != "counter" and "total" in name.split("_"):
        yield f"is a {kind} with _total in its name (only counters end in _total)"
    if kind == "histogram":
        if any(not s.name.endswith(HISTOGRAM_SUFFIXES) for s in samples):
            yield "is a histogram with a sample that is not _bucket/_count/_sum"
        bounds = [float(s.labels["le"]) for s in samples if "le" in s.labels]
        fractional = any(b != int(b) for b in bounds if b != float("inf"))
        if fractional and not name.endswith(tuple(f"_{u}" for u in BASE_UNITS)):
            yield "measures a quantity (fractional buckets) but has no base-unit suffix"


def _units(name: str, kind: str, help_text: str, samples: list[Sample]) -> Iterator[str]:
    words = name.split("_")
    for unit in NON_BASE_UNITS:
        if unit in words:
            yield f"uses {unit!r}: name it in the base unit"
    for unit in BASE_UNITS:
        if unit in words and not name.endswith((f"_{unit}", f"_{unit}_total")):
            yield f"carries {unit!r} other than as its suffix"
    if name.endswith("_ratio") and any(not 0.0 <= s.value <= 1.0 for s in samples):
        yield "is a _ratio with a value outside 0..1"


def _by_help(name: str, kind: str, help_text: str, samples: list[Sample]) -> Iterator[str]:
    """What the help text says the value is, the name must say too."""
    lowered = help_text.lower()
    if re.search(r"\bseconds\b", lowered) and not name.endswith(("_seconds", "_seconds_total")):
        yield "is valued in seconds (its help says so) but does not end in _seconds"
    share = re.search(r"\b(share|fraction|ratio|proportion|percentage)\b", lowered)
    if share and not name.endswith("_ratio"):
        yield "is a share (its help says so) but does not end in _ratio"


RULES = (_basics, _by_type, _units, _by_help)


def violations(name: str, kind: str, help_text: str, samples: list[Sample]) -> list[str]:
    """What breaks a convention in one parsed family (empty when it follows them all)."""
    return [found for rule in RULES for found in rule(name, kind, help_text, samples)]


def label_violations(name: str, samples: list[Sample], identifiers: frozenset[str]) -> list[str]:
    found: set[str] = set()
    for sample in samples:
        for label, value in sample.labels.items():
            if UNBOUNDED_LABELS.search(label):
                found.add(f"label {label!r} names something unbounded")
            if not BOUNDED_VALUE.match(value):
                found.add(f"label {label}={value!r} is not a bounded token")
            if any(i in value for i in identifiers):
                found.add(f"label {label}={value!r} carries an id, token or URL of the run")
    return [f"{name}: {v}" for v in sorted(found)]


def test_every_family_the_service_exposes_follows_the_naming_conventions(scrape: Scrape) -> None:
    assert len(scrape.families) >= 15, sorted(scrape.families)
    problems: list[str] = []
    for name, family in sorted(scrape.families.items()):
        samples = list(family.samples)
        problems += [
            f"{name} {p}" for p in violations(name, family.type, family.documentation, samples)
        ]
        problems += label_violations(name, samples, scrape.identifiers)
    assert not problems, "\n".join(problems)


def test_the_run_reached_the_families_through_the_service_itself(scrape: Scrape) -> None:
    """The provider path, the trust keeper and the collectors counted, not the test."""
    text = scrape.text
    assert 'reconciler_completions_total{state="succeeded"} 2.0' in text
    assert 'reconciler_escalations_total{reason="request_budget_exhausted"} 1.0' in text
    assert 'reconciler_stored_operations{state="succeeded"} 2.0' in text
    assert 'reconciler_webhook_first_ratio{provider="sim"} 1.0' in text
    assert 'reconciler_webhook_misses_total{provider="sim"} 0.0' in text
    assert 'reconciler_status_reads_per_operation_count{provider="sim"} 2.0' in text


@pytest.mark.parametrize(
    ("name", "kind", "help_text", "value", "broken"),
    [
        ("reconciler_jobs", "counter", "Jobs.", None, "do not end in _total"),
        ("reconciler_open_total", "gauge", "Open.", None, "only counters end in _total"),
        ("reconciler_lag", "gauge", "Lag in seconds.", None, "does not end in _seconds"),
        ("reconciler_lag_ms", "gauge", "Lag.", None, "base unit"),
        ("reconciler_hit_share", "gauge", "Share of hits.", 0.5, "does not end in _ratio"),
        ("reconciler_hit_ratio", "gauge", "Hits per try.", 3.0, "outside 0..1"),
        ("reconciler_reads", "gauge", "", None, "no help text"),
        ("reads", "gauge", "Reads.", None, "does not start with"),
    ],
)
def test_a_badly_named_family_is_caught(
    name: str, kind: str, help_text: str, value: float | None, broken: str
) -> None:
    sample = Sample(name, {}, 1.0 if value is None else value)
    problems = violations(name, kind, help_text, [sample])
    assert any(broken in p for p in problems), problems


def histogram(name: str, bounds: tuple[str, ...], count: float) -> list[Sample]:
    buckets = [Sample(f"{name}_bucket", {"le": le}, count) for le in (*bounds, "+Inf")]
    return [*buckets, Sample(f"{name}_count", {}, count), Sample(f"{name}_sum", {}, count)]


def test_a_histogram_of_a_quantity_without_its_unit_is_caught() -> None:
    wait = histogram("reconciler_wait", ("0.5", "1.0"), 1.0)
    assert any(
        "base-unit suffix" in p for p in violations("reconciler_wait", "histogram", "Wait.", wait)
    )
    reads = histogram("reconciler_reads", ("1.0", "2.0"), 1.0)
    assert violations("reconciler_reads", "histogram", "Reads.", reads) == []
    unobserved = histogram("reconciler_reads", ("1.0", "2.0"), 0.0)
    assert violations("reconciler_reads", "histogram", "Reads.", unobserved) != []


def test_an_unbounded_label_is_caught() -> None:
    ids = frozenset({"op_0123456789abcdef"})
    by_id = [Sample("reconciler_x_total", {"operation_id": "op_0123456789abcdef"}, 1.0)]
    assert len(label_violations("reconciler_x", by_id, ids)) == 2  # the name and the value
    by_url = [Sample("reconciler_x_total", {"target": "https://example.test/a"}, 1.0)]
    assert label_violations("reconciler_x", by_url, frozenset())


# The dashboard.

METRIC_IN_EXPR = re.compile(r"\b" + PREFIX + r"[a-zA-Z0-9_:]*")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def exprs(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(board) for t in p.get("targets", [])]


def test_the_dashboard_is_importable_with_a_prometheus_datasource_input() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    inputs = {i["name"]: i for i in board["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_every_dashboard_query_names_only_what_the_service_exposes(scrape: Scrape) -> None:
    exposed = sample_names(scrape.families)
    unknown = [
        f"{title}: {metric}"
        for title, expr in exprs(dashboard())
        for metric in METRIC_IN_EXPR.findall(expr)
        if metric not in exposed
    ]
    assert not unknown, f"the dashboard names metrics /metrics does not expose: {unknown}"


def test_the_dashboard_shows_every_family(scrape: Scrape) -> None:
    named = {m for _, expr in exprs(dashboard()) for m in METRIC_IN_EXPR.findall(expr)}
    missing = []
    for name, family in scrape.families.items():
        own = {s.name for s in family.samples}
        if not own & named:
            missing.append(name)
    assert not missing, f"families no dashboard panel shows: {sorted(missing)}"


def test_the_name_check_would_see_a_drift() -> None:
    """A renamed metric the dashboard still names is what the check reports."""
    exposed = {"reconciler_webhook_first_ratio"}
    stale = "max by (provider) (reconciler_webhook_first_share)"
    assert [m for m in METRIC_IN_EXPR.findall(stale) if m not in exposed] == [
        "reconciler_webhook_first_share"
    ]
