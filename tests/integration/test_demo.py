"""``reconciler demo``: the whole run as a user starts it, and the pieces it is built from."""

from __future__ import annotations

import dataclasses
import random
import re
import signal
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import pytest

from reconciler.config import Settings
from reconciler.core.errors import DemoFailed
from reconciler.core.trust import TrustMode, TrustState, TrustView
from reconciler.demo import run
from reconciler.demo.plan import (
    DEMO_POLLING,
    EXPECTED_ENDS,
    LOSSY_PROVIDER,
    PROVIDER,
    WARMUP_COUNT,
    WARMUP_KINDS,
    first_wave,
    plan_batch,
)
from reconciler.demo.report import (
    OpOutcome,
    RunReport,
    TrustSummary,
    fixed_poller_requests,
    render_report,
)
from reconciler.demo.run import prepare_directory
from tests.support.console import operator_client
from tests.support.load import busy

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "Operations per end state",
    "Escalations (",
    "Status requests per operation",
    "Callbacks",
    "Repeated idempotency keys",
    "Audit",
)


def _ctrl_c_reaches_it() -> None:
    """In the demo's process before it starts: SIGINT as a terminal gives it. A test run
    started in the background (``make test &``, ``nohup``) ignores SIGINT, and a child
    that inherits that never sees its Ctrl-C: it ran on until the test gave up on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _demo_until_ctrl_c(workdir: Path) -> tuple[str, str]:
    """Run ``reconciler demo --keep-serving`` as a user does: read its summary, look at the
    console it leaves up, then press Ctrl-C. Returns (everything it printed, escalated inbox).
    """
    command = [sys.executable, "-m", "reconciler", "demo", "--operations", "12"]
    command += ["--timeout", "60", "--keep-serving", "--dir", str(workdir)]
    errors = workdir.with_name("demo-stderr.txt")
    with errors.open("w") as stderr:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=_ctrl_c_reaches_it,
        )
    # The demo ends itself at its --timeout; the watchdog only bounds a hang of the test.
    watchdog = threading.Timer(150, proc.kill)
    watchdog.start()
    out: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if line.startswith("Press Ctrl-C to stop."):
                break
        text = "".join(out)
        console = re.search(r"^operator console (http://127\.0\.0\.1:\d+)/console$", text, re.M)
        token = re.search(r"operator token \(demo-operator\):\n  (\S+)\n", text)
        assert console is not None and token is not None, text
        with closing(operator_client(console.group(1), token.group(1))) as client:
            inbox = client.get("/console", params={"state": "escalated"}).text
        # Ctrl-C on a busy machine: the stop is bounded (test_demo_stop.py says why it
        # was not), whatever the load.
        with busy():
            proc.send_signal(signal.SIGINT)
            out.append(proc.communicate(timeout=30)[0])
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 0, "".join(out) + errors.read_text()
    return "".join(out), inbox


@pytest.mark.slow
def test_demo_runs_a_mixed_batch_to_a_clean_summary_and_keeps_serving(tmp_path: Path):
    workdir = tmp_path / "demo-run"
    out, inbox = _demo_until_ctrl_c(workdir)
    for section in SECTIONS:
        assert section in out, section
    assert "\x1b[" not in out  # not a terminal: plain lines only
    assert re.search(r"^\[\s*\d+\.\ds\] \d+/12 settled", out, re.MULTILINE)
    # The batch and the one job started through MCP at the end.
    assert re.search(r"^  audit ok: 13 operations, \d+ history entries intact$", out, re.MULTILINE)
    mcp = out[out.index("One job through MCP") :]
    assert "  start_job {" in mcp and "  wait_job {" in mcp
    assert "NOT complete" in mcp and "-> succeeded, done=true" in mcp
    once = re.search(r"exactly once each: (\d+) of (\d+)  -> ok", out)
    assert once is not None and once.group(1) == once.group(2) and int(once.group(1)) >= 8
    # Both bounded stops of the mix, each with its escalation message.
    assert "  rate_limited: 1 operation(s)" in out
    assert "  unknown_state: 1 operation(s)" in out
    assert out.count("External job needs a decision") == 2
    assert "1 returned the existing operation  -> ok" in out
    assert "RESULT: OK" in out
    # --keep-serving: the escalations wait in the console until Ctrl-C, which stops cleanly.
    assert "Needs a decision" in inbox
    assert inbox.count('class="escalated-row"') >= 2  # rate_limited, unknown_state
    assert "stopping the demo's service and simulated provider" in out
    assert not workdir.exists()  # removed without --keep


def test_the_mix_is_reproducible_and_covers_every_scenario():
    first = plan_batch(50, random.Random(7), 7)
    again = plan_batch(50, random.Random(7), 7)
    assert first == again
    kinds = {p.kind for p in first}
    assert {"webhooks_lost", "rate_limit_storm", "unknown_state", "cancelled"} <= kinds
    assert len({p.key for p in first}) == 50
    assert all(1 <= p.request["duration"] <= 30 for p in first)
    assert sum(p.cancel_after is not None for p in first) == 2
    assert plan_batch(50, random.Random(8), 8) != first


def test_the_provider_that_loses_webhooks_is_not_the_one_that_earns_trust():
    # One provider for both would either stay trusted while losing webhooks (each lost
    # job found only by the final look before its deadline) or lose its trust at every
    # loss, and the healthy jobs with it: each provider's trust is shown on its own.
    planned = plan_batch(50, random.Random(7), 7)
    lossy = {p.kind for p in planned if p.provider == LOSSY_PROVIDER}
    assert lossy == {"webhooks_lost", "webhooks_lying"}
    assert {p.provider for p in first_wave(planned)} == {PROVIDER}
    # A delayed webhook comes within the grace: late, not a miss.
    delayed = [p for p in planned if p.kind == "webhooks_delayed"]
    assert delayed
    assert all(p.request["webhook_delay"] < DEMO_POLLING["webhook_grace_seconds"] for p in delayed)


def _view(provider: str, state: TrustState, first: int, missed: int) -> TrustView:
    return TrustView(provider, TrustMode.ADAPTIVE, state, None, first, 0, missed, 0, 6, None, None)


def test_each_provider_gets_its_own_trust_section_and_reads_ratio():
    def done(op_id: str, kind: str, provider: str, reads: int) -> OpOutcome:
        return OpOutcome(op_id, kind, "succeeded", 100.0, 111.0, 110.0, reads, 1, provider=provider)

    report = RunReport(
        seed=7,
        timeout=75,
        elapsed=30,
        outcomes=[
            done("op_a", "webhooks_delivered", PROVIDER, 1),
            done("op_b", "webhooks_lost", LOSSY_PROVIDER, 4),
        ],
        repeats=[],
        rejected_callbacks=0,
        audit_text="audit ok",
        audit_ok=True,
        trust=(
            TrustSummary(
                ((1.0, "learning"), (9.0, "trusted")), _view(PROVIDER, TrustState.TRUSTED, 6, 0)
            ),
            TrustSummary(
                ((1.0, "learning"), (12.0, "distrusted")),
                _view(LOSSY_PROVIDER, TrustState.DISTRUSTED, 0, 1),
            ),
        ),
    )
    out = render_report(report)
    healthy = out[out.index("Webhook trust (provider sim)\n") :]
    lossy = out[out.index("Webhook trust (provider sim-lossy)") :]
    assert "1 operation(s): webhooks_delivered" in healthy
    assert "states seen: learning at 1 s, trusted at 9 s" in healthy
    assert "status reads per finished operation: 1.00, 0.20 of the fixed poller's" in healthy
    assert "1 operation(s): webhooks_lost" in lossy
    assert "now distrusted: 0 webhook-first, 0 late, 1 missed" in lossy
    assert "status reads per finished operation: 4.00, 0.80 of the fixed poller's" in lossy


def test_fixed_poller_reads_until_it_sees_the_end():
    assert fixed_poller_requests(0.3) == 1
    assert fixed_poller_requests(2.0) == 1
    assert fixed_poller_requests(2.1) == 2
    assert fixed_poller_requests(19.5) == 10


def _outcome(op_id: str, state: str, callbacks: int) -> OpOutcome:
    return OpOutcome(op_id, "webhooks_delivered", state, 100.0, 105.0, 104.5, 3, callbacks)


def test_a_missing_or_repeated_callback_fails_the_run():
    report = RunReport(
        seed=7,
        timeout=75,
        elapsed=30,
        outcomes=[
            _outcome("op_a", "succeeded", 1),
            _outcome("op_b", "succeeded", 2),
            _outcome("op_c", "observing", 0),
        ],
        repeats=[("op_a", "op_a")],
        rejected_callbacks=0,
        audit_text="audit ok: 3 operations, 30 history entries intact",
        audit_ok=True,
    )
    failures = report.failures()
    assert any("op_b=2" in f for f in failures)
    assert any("neither ended nor escalated" in f for f in failures)
    assert "RESULT: FAILED" in render_report(report)


def test_only_a_demo_directory_is_wiped(tmp_path: Path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(DemoFailed):
        prepare_directory(precious)
    assert (precious / "notes.txt").exists()
    made = prepare_directory(tmp_path / "demo-run")
    (made / "reconciler.db").write_text("old run")
    again = prepare_directory(made)
    assert not (again / "reconciler.db").exists()


def test_an_operation_that_ends_otherwise_than_its_scenario_fails_the_run():
    lost = OpOutcome("op_a", "webhooks_lost", "result_timed_out", 100.0, 160.0, 104.5, 2, 1)
    storm = OpOutcome("op_b", "rate_limit_storm", "escalated", 100.0, None, None, 4, 0)
    report = RunReport(
        seed=7,
        timeout=120,
        elapsed=30,
        outcomes=[lost, dataclasses.replace(storm, escalation_reason="rate_limited")],
        repeats=[],
        rejected_callbacks=0,
        audit_text="audit ok",
        audit_ok=True,
        expected_ends=EXPECTED_ENDS,
    )
    assert report.failures() == ["op_a (webhooks_lost) ended result_timed_out, not succeeded"]


def test_the_warm_up_wave_earns_trust_before_the_rest():
    planned = plan_batch(50, random.Random(7), 7)
    first = first_wave(planned)
    warm = [p for p in first if p.kind in WARMUP_KINDS]
    assert len(warm) == WARMUP_COUNT
    assert {p.kind for p in first} - set(WARMUP_KINDS) == {"rate_limit_storm"}
    assert set(EXPECTED_ENDS) == {p.kind for p in planned}


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_interrupt_stops_the_demo_as_ctrl_c_even_inside_a_task_group(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    wrapped: bool,
) -> None:
    """SIGTERM mid-run raised inside an agent's connection being opened (anyio's task
    group) came out as a group, not a KeyboardInterrupt: the demo exited 1 with a
    traceback instead of 130 with its line (tests/faults/test_demo_stop.py, once)."""

    def interrupted(*_args: object) -> None:
        if wrapped:
            raise BaseExceptionGroup("unhandled errors in a TaskGroup", [KeyboardInterrupt()])
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "_run", interrupted)
    options = run.DemoOptions(directory=tmp_path / "demo-run")
    with pytest.raises(KeyboardInterrupt):
        run.run_demo(options, Settings())
    assert "interrupted; the simulated provider is stopped" in capsys.readouterr().out


def test_a_failure_in_a_task_group_is_not_taken_for_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failed(*_args: object) -> None:
        raise BaseExceptionGroup("unhandled errors in a TaskGroup", [OSError("refused")])

    monkeypatch.setattr(run, "_run", failed)
    with pytest.raises(BaseExceptionGroup):
        run.run_demo(run.DemoOptions(directory=tmp_path / "demo-run"), Settings())
