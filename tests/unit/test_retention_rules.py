"""The pure half of retention: windows, cutoffs, the key digest and the keyed record chain."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.chain import GENESIS
from reconciler.core.retention import (
    RetentionPolicy,
    cutoffs,
    key_digest,
    pruned_digest,
    record_hash,
    verify_records,
    window,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
KEY = b"k" * 32
days = st.floats(min_value=0, max_value=36_600, allow_nan=False)


@given(operations=days, events=days, tombstones=days)
def test_a_zero_window_keeps_forever_and_any_other_cuts_that_long_ago(
    operations: float, events: float, tombstones: float
) -> None:
    limits = cutoffs(RetentionPolicy.of_days(operations, events, tombstones), NOW)
    for given_days, cut in (
        (operations, limits.operations),
        (events, limits.events),
        (tombstones, limits.tombstones),
    ):
        if given_days == 0:
            assert cut is None
        else:
            assert cut is not None and cut <= NOW
            assert abs((NOW - cut).total_seconds() - given_days * 86_400) < 1e-3


def test_everything_kept_only_when_every_window_is_zero() -> None:
    assert RetentionPolicy.of_days(0, 0, 0).keeps_everything
    assert not RetentionPolicy.of_days(0, 7, 0).keeps_everything
    assert window(0) is None and window(1) == timedelta(days=1)


def test_a_tombstone_keeps_a_digest_of_the_key_never_the_key() -> None:
    digest = key_digest("order-42")
    assert digest is not None and "order-42" not in digest and len(digest) == 64
    assert key_digest("order-42") == digest and key_digest("order-43") != digest
    assert key_digest(None) is None


@given(st.lists(st.tuples(st.text(min_size=1), st.text(), st.integers(0, 10**6)), max_size=20))
def test_the_pruned_digest_does_not_depend_on_the_order(heads: list[tuple[str, str, int]]) -> None:
    assert pruned_digest(heads) == pruned_digest(list(reversed(heads)))


def _chain(sizes: list[int], key: bytes | None) -> list[dict[str, Any]]:
    records, prev = [], GENESIS
    for seq, size in enumerate(sizes, start=1):
        record: dict[str, Any] = {
            "seq": seq,
            "at": NOW + timedelta(minutes=seq),
            "actor": "retention:replica-1",
            "cutoff": NOW - timedelta(days=30),
            "operations": size,
            "history_entries": size * 9,
            "done_from": NOW - timedelta(days=40 - seq),
            "done_until": NOW - timedelta(days=31 - seq),
            "digest": pruned_digest([(f"op_{seq}_{i}", "h", 9) for i in range(size)]),
            "prev_hash": prev,
        }
        record["hash"] = record_hash(record, prev, key)
        prev = record["hash"]
        records.append(record)
    return records


@given(st.lists(st.integers(1, 500), min_size=1, max_size=8))
def test_an_intact_log_verifies_and_sums_what_went(sizes: list[int]) -> None:
    summary, fault = verify_records(_chain(sizes, KEY), KEY)
    assert fault is None
    assert summary.operations == sum(sizes) and summary.records == len(sizes)
    assert summary.history_entries == 9 * sum(sizes)
    assert summary.done_until == NOW - timedelta(days=31 - len(sizes))


FIELDS = ("at", "actor", "cutoff", "operations", "history_entries", "done_until", "digest")


@given(
    st.lists(st.integers(1, 500), min_size=1, max_size=6),
    st.data(),
)
def test_any_edit_of_a_record_fails_at_that_record(sizes: list[int], data: st.DataObject) -> None:
    records = _chain(sizes, KEY)
    index = data.draw(st.integers(0, len(records) - 1))
    name = data.draw(st.sampled_from(FIELDS))
    value = records[index][name]
    if isinstance(value, int):
        records[index][name] = value + 1
    elif isinstance(value, datetime):
        records[index][name] = value + timedelta(seconds=1)
    else:
        records[index][name] = value + "x"
    _, fault = verify_records(records, KEY)
    assert fault is not None and fault.seq == index + 1


def test_a_removed_or_forged_record_fails() -> None:
    records = _chain([3, 4, 5], KEY)
    _, fault = verify_records([records[0], records[2]], KEY)
    assert fault is not None and "sequence broken" in fault.describe()
    # Rebuilt without the key: the hashes are plain SHA-256, which the keyed check refuses.
    forged = _chain([3, 4, 5], None)
    _, fault = verify_records(forged, KEY)
    assert fault is not None and fault.seq == 1 and "edited" in fault.describe()


def test_an_empty_log_says_nothing_was_removed() -> None:
    summary, fault = verify_records([], KEY)
    assert fault is None and summary.describe() == "retention removed nothing"
