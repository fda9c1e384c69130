"""The collectors that read the database at scrape time read nothing when registered.

The registry asks each collector for its families when it is registered, which is while
the runtime is being built; a collector without a sample-free ``describe`` would be
collected then: a query at start-up for nothing, against a database that may be down.
"""

from __future__ import annotations

from reconciler.metrics import Metrics


def test_registering_the_database_collectors_reads_nothing_and_a_scrape_reads_each_once() -> None:
    asked: list[str] = []

    def read(name: str, value: object) -> object:
        asked.append(name)
        return value

    metrics = Metrics()
    metrics.watch_states(lambda: read("in_flight", {}), lambda: read("ended", {}))
    metrics.watch_database_size(lambda: read("size", 4096))
    metrics.watch_trust(lambda: read("trust", {}))
    assert asked == []
    text = metrics.render().decode()
    assert sorted(asked) == ["ended", "in_flight", "size", "trust"]
    assert "reconciler_database_size_bytes 4096.0" in text
    assert "reconciler_webhook_misses" in text
