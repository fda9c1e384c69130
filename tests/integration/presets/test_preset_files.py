"""The shipped preset files: each loads, opens with its reference, and lists every state word.

The word lists below are the API references' documented states (for GitHub, the
run's ``status`` words in the table and its ``conclusion`` words in the rules). A word
missing from a preset would be classified unknown and stop operations that are fine;
a word listed that the reference does not document would hide a contract change.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from reconciler.providers.loader import PRESETS_DIR, load_providers

ROOT = Path(__file__).resolve().parents[3]
PUBLIC_URL = "https://reconciler.example"
DOCUMENTED: dict[str, tuple[set[str], set[object]]] = {
    # preset: (words in [states], words decided by [status] rules)
    "openai_batch": (
        {
            "validating",
            "in_progress",
            "finalizing",
            "completed",
            "failed",
            "expired",
            "cancelling",
            "cancelled",
        },
        set(),
    ),
    "openai_responses": (
        {"queued", "in_progress", "completed", "failed", "cancelled", "incomplete"},
        set(),
    ),
    "anthropic_batches": ({"in_progress", "canceling", "ended"}, set()),
    "replicate": ({"starting", "processing", "succeeded", "failed", "canceled", "aborted"}, set()),
    "github_actions": (
        {"requested", "queued", "pending", "waiting", "in_progress", "completed"},
        {
            "success",
            "neutral",
            "cancelled",
            "failure",
            "timed_out",
            "startup_failure",
            "action_required",
            "stale",
            "skipped",
        },
    ),
    "google_lro": ({"false", "true"}, {1}),
    "vertex_batch_prediction": (
        # JOB_STATE_UNSPECIFIED is documented too, and stays unknown on purpose.
        {
            f"JOB_STATE_{w}"
            for w in (
                "QUEUED",
                "PENDING",
                "RUNNING",
                "SUCCEEDED",
                "FAILED",
                "CANCELLING",
                "CANCELLED",
                "PAUSED",
                "EXPIRED",
                "UPDATING",
                "PARTIALLY_SUCCEEDED",
            )
        },
        set(),
    ),
    "aws_transcribe": ({"QUEUED", "IN_PROGRESS", "COMPLETED", "FAILED"}, set()),
    "aws_step_functions": (
        {"RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"},
        set(),
    ),
    # Batch's job status enum; isCancelled and isTerminated decide a FAILED job's class.
    "aws_batch": (
        {"SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"},
        {True},
    ),
    "aws_bedrock_batch": (
        {
            "Submitted",
            "InProgress",
            "Completed",
            "Failed",
            "Stopping",
            "Stopped",
            "PartiallyCompleted",
            "Expired",
            "Validating",
            "Scheduled",
        },
        set(),
    ),
}


def load(name: str) -> object:
    specs = load_providers(
        Path("/nonexistent"),
        {name: {"preset": name}},
        {},
        missing_ok=True,
        check_secrets=False,
        public_url=PUBLIC_URL,
    )
    return specs[name]


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_a_preset_loads_opens_with_its_reference_and_lists_every_documented_word(
    name: str,
) -> None:
    text = (PRESETS_DIR / f"{name}.toml").read_text()
    assert text.startswith("# "), "a preset opens with a comment naming its reference"
    head = text.split("\n\n", 1)[0].lower()
    assert "reference" in head or "describe" in head, head
    spec = load(name)
    words = {w for w, _ in spec.states.entries}  # type: ignore[attr-defined]
    table_words, rule_values = DOCUMENTED[name]
    assert words == table_words
    ruled = set()
    for rule in spec.status.rules:  # type: ignore[attr-defined]
        ruled.update(rule.equals_any)
    assert rule_values <= ruled, rule_values - ruled


def test_the_documented_file_for_an_api_we_do_not_ship_loads() -> None:
    page = (ROOT / "docs" / "providers.md").read_text()
    start = page.index("# Acme Render API")
    block = page[start : page.index("```", start)]
    tables = tomllib.loads(block)["providers"]
    specs = load_providers(
        Path("/nonexistent"),
        tables,
        {},
        missing_ok=True,
        check_secrets=False,
        public_url=PUBLIC_URL,
    )
    assert specs["acme_render"].lookup is not None


def test_the_documented_aws_deployment_loads_and_names_its_state_machine() -> None:
    page = (ROOT / "docs" / "providers.md").read_text()
    start = page.index("[providers.orders]")
    tables = tomllib.loads(page[start : page.index("```", start)])["providers"]
    specs = load_providers(
        Path("/nonexistent"),
        tables,
        {},
        missing_ok=True,
        check_secrets=False,
        public_url=PUBLIC_URL,
    )
    spec = specs["orders"]
    arn = "arn:aws:states:eu-west-1:123456789012:stateMachine:orders"
    assert spec.lookup is not None and (spec.auth.service, spec.auth.region) == (
        "states",
        "eu-west-1",
    )
    for table in (spec.create, spec.lookup):
        assert {r.pointer.text: r.value for r in table.set}["/stateMachineArn"] == arn
