"""An operation's history reads as a story (docs/design.md#history), over the API and the CLI.

Runs of the service against the simulated provider in the in-process world
(``tests/support/world.py``, one manual clock): one that meets a 503 with
``Retry-After`` and then succeeds, one that spends its budget and is escalated, then
extended by an operator. The API gives the entries (oldest first, each observation with its
delay source); ``reconciler ops history`` tells them as lines; ``ops list`` and
``ops show`` show the operations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main
from tests.support.process import cli
from tests.support.waiting import wait_until
from tests.support.world import SyncWorld, sync_world

POLLING: dict[str, Any] = {
    "base_delay_seconds": 0.05,
    "max_delay_seconds": 0.2,
    "jitter_floor": 0.5,
    "deadline_seconds": 30,
    "max_status_requests": 20,
}
CLOCK = r"\d\d:\d\d:\d\d"
SOURCES = {"provider_retry_after", "provider_poll_hint", "local_backoff", "manual_extension"}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[SyncWorld]:
    """The in-process world: the runs' times are the manual clock's, so the story's are."""
    with sync_world(tmp_path, db_url, polling=POLLING) as world:
        yield world


@pytest.fixture
def config(tmp_path: Path, db_url: str) -> Path:
    path = tmp_path / "cli.toml"
    path.write_text(f"database_url = {json.dumps(db_url)}\n", "utf-8")
    return path


def story(config: Path, op_id: str) -> list[str]:
    """The story's lines after its header, which names the operation, provider, job and state."""
    result = cli(config, "ops", "history", op_id)
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert re.fullmatch(
        rf"operation {op_id} \(provider sim, job (job_\w+|not known yet)\), state [a-z_]+", header
    ), header
    return lines


def clock(text: str) -> datetime:
    return datetime.strptime(text, "%H:%M:%S")


def matching(lines: list[str], pattern: str) -> list[re.Match[str]]:
    found = [m for m in (re.fullmatch(pattern, line) for line in lines) if m]
    assert found, f"no line matches {pattern!r} in:\n" + "\n".join(lines)
    return found


def finished_history(stack: SyncWorld, op_id: str) -> list[dict[str, Any]]:
    """The history once the completion handler has closed it (it runs after the end state)."""

    def closed() -> list[dict[str, Any]] | None:
        entries = stack.history(op_id)
        return entries if entries[-1]["cause"] == "completion_finished" else None

    entries: list[dict[str, Any]] = wait_until(closed, 10, "the completion handler to finish")
    return entries


def check_oldest_first(entries: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    times = [datetime.fromisoformat(e["at"]) for e in entries]
    assert times == sorted(times)


def check_lines_follow_entries(lines: list[str], entries: list[dict[str, Any]]) -> None:
    """One line per entry, in the same order, each starting with the entry's time."""
    assert len(lines) == len(entries)
    for line, entry in zip(lines, entries, strict=True):
        at = datetime.fromisoformat(entry["at"]).strftime("%H:%M:%S")
        assert line.startswith(f"{at} "), (line, entry)


def test_a_retry_after_run_reads_like_the_seed_story(stack: SyncWorld, config: Path) -> None:
    request = {
        "scenario": "success",
        "duration": 1.2,
        "webhooks": "never",
        "status_fault": 503,
        "status_fault_after": 1,
        "status_fault_count": 1,
        "retry_after": 1,
    }
    op = stack.wait(stack.create(request).json()["id"], timeout=20)
    assert op["state"] == "succeeded", op
    entries = finished_history(stack, op["id"])
    check_oldest_first(entries)
    reads = [e for e in entries if e["cause"] == "status_read"]
    for entry in reads:
        waited = entry["detail"]["decision"] == "wait"
        assert (entry["delay_source"] in SOURCES) if waited else entry["delay_source"] is None
    [refused] = [e for e in reads if e["detail"]["http_status"] == 503]
    assert refused["delay_source"] == "provider_retry_after"
    assert refused["detail"]["retry_after"] == "1"
    assert any(e["delay_source"] == "local_backoff" for e in reads)

    lines = story(config, op["id"])
    check_lines_follow_entries(lines, entries)
    matching(lines, rf"{CLOCK} operation created, deadline {CLOCK}, budget 20")
    matching(lines, rf"{CLOCK} submitted job {op['remote_job_id']} \(HTTP 202 via create\)")
    matching(
        lines, rf"{CLOCK} polled, state (queued|running), next poll {CLOCK} from local backoff"
    )
    [guided] = matching(
        lines, rf"({CLOCK}) received 503, Retry-After 1, next poll ({CLOCK}) from provider guidance"
    )
    # The next poll is the answer's time plus the second the provider asked for.
    gap = (clock(guided.group(2)) - clock(guided.group(1))) % timedelta(days=1)
    assert timedelta(seconds=1) <= gap <= timedelta(seconds=2)
    matching(lines, rf"{CLOCK} polled, state succeeded, collecting the result")
    matching(lines, rf"{CLOCK} result_collecting → succeeded \(result_verified\)")


def test_an_escalated_and_extended_run_tells_its_escalation_and_decision(
    stack: SyncWorld, config: Path
) -> None:
    created = stack.create(
        {"scenario": "never_finishes", "webhooks": "never"}, max_status_requests=3
    )
    op_id = created.json()["id"]
    op = stack.wait_state(op_id, {"escalated"}, timeout=15)
    assert op["state"] == "escalated"

    lines = story(config, op_id)
    check_lines_follow_entries(lines, stack.history(op_id))
    assert len(matching(lines, rf"{CLOCK} polled, state running, next poll {CLOCK} from .+")) == 2
    # The last read ends the run: it names no next poll.
    matching(lines, rf"{CLOCK} polled, state running")
    matching(lines, rf"{CLOCK} observing → escalated \(escalation:request_budget_exhausted\)")
    matching(lines, rf"{CLOCK} escalated: request_budget_exhausted — 3 of 3 status requests used.*")

    decided = stack.client.post(
        f"/v1/operations/{op_id}/decisions",
        json={
            "action": "extend",
            "extra_seconds": 60,
            "extra_status_requests": 2,
            "note": "one more look\nafter the fix",
        },
        headers=stack.headers(operator=True),
    )
    assert decided.status_code == 200, decided.text
    stack.wait_state(op_id, {"observing"}, timeout=5)
    again = stack.wait_state(op_id, {"escalated"}, timeout=15)
    assert again["budget"]["status_requests_used"] == 5

    entries = stack.history(op_id)
    check_oldest_first(entries)
    [decision] = [e for e in entries if e["kind"] == "decision"]
    assert decision["delay_source"] == "manual_extension"
    lines = story(config, op_id)
    check_lines_follow_entries(lines, entries)
    # The operator's note on the decision's one line.
    matching(
        lines,
        rf"{CLOCK} operator:ops-1 decided extend \(\+60 s, \+2 status requests\): "
        "one more look after the fix",
    )
    matching(lines, rf"{CLOCK} escalated → observing \(decision:extend\)")
    assert len(matching(lines, rf"{CLOCK} escalated: request_budget_exhausted — .*")) == 2


def run_main(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (the same parser and handlers ``python -m reconciler`` runs)."""
    code = main([*args, "--config", str(config)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ops_list_and_show(
    stack: SyncWorld, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = stack.wait(stack.create({"scenario": "success", "duration": 0.2}).json()["id"])
    assert done["state"] == "succeeded"
    created = stack.create({"scenario": "unknown_state", "duration": 0.2, "webhooks": "never"})
    stuck = stack.wait_state(created.json()["id"], {"escalated"}, timeout=15)
    assert stuck["state"] == "escalated"

    listing = cli(config, "ops", "list")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()}
    assert rows[done["id"]][1:4] == ["sim", "succeeded", done["remote_job_id"]]
    assert rows[stuck["id"]][1:4] == ["sim", "escalated", stuck["remote_job_id"]]
    # Newest first.
    assert list(rows) == [stuck["id"], done["id"]]

    code, out, _ = run_main(capsys, config, "ops", "list", "--state", "escalated")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == [stuck["id"]]
    code, out, err = run_main(capsys, config, "ops", "list", "--state", "cancelled")
    assert code == 0 and out == ""
    assert "no operations" in err

    shown = cli(config, "ops", "show", stuck["id"])
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    api = stack.get(stuck["id"], operator=True)
    for key in ("id", "state", "done", "remote_job_id", "remote_state", "budget", "deadline_at"):
        assert view[key] == api[key], key
    assert view["escalation"]["reason"] == "unknown_state"
    assert view["escalation"]["message"] == api["escalation"]["message"]
    assert view["escalation"]["options"] == api["escalation"]["options"]

    for command in ("show", "history"):
        code, _, err = run_main(capsys, config, "ops", command, "op_0000000000nosuchoperation0")
        assert code == 1
        assert "does not exist" in err  # one line; an unhandled error would raise here
