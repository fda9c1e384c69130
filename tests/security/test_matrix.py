# ruff: noqa: E501  (test node ids are kept whole so they can be searched for)
"""The attack matrix in one place: every attack, and the tests that pin its refusal.

Tried as an adversary would (authenticated agents and anonymous senders, loopback
only). Storage-bound rows run on SQLite and PostgreSQL (the ``db_url`` fixture).
Attacks refused before this matrix was drawn keep their tests where they were; this table
names them, and ``test_every_listed_test_exists`` fails if one is renamed or removed,
so the matrix cannot silently lose a row.

| attack | refused how | tests |
| --- | --- | --- |
| disk flood through status reads (1 MB requests) | payloads written once, beside the row | amplification |
| WAL growth under a flood | truncating checkpoint off the hot path, size limit | amplification |
| create-reconcile retry storm, provider down | one call per backoff step, reserved before sending | amplification |
| extend beyond the offer, huge/negative/NaN amounts | 400 naming the field, API and CLI | offered_options |
| forging another agent's callback | per-agent derived secrets, rotation window | callback_secrets |
| instant escalations, unbounded creates | min deadline, in-flight cap, 429 + Retry-After | quotas |
| hint flood filling the history | hints coalesce while one is pending | quotas |
| unbounded /history | pages with a cursor | quotas |
| tokens that never expire, open /metrics | --expires-in, metrics_token_env | quotas |
| idempotent retry dropping new fields | 409 naming the field; numbers by value | idempotency |
| lone surrogates in agent bodies | 400 naming the field, connection kept | bad_unicode |
| signed webhook with unstorable ids | 400 counted `unstorable`, never a 503 loop | bad_unicode |
| disconnect mid-body | counted `client_disconnected`, info, no traceback | bad_unicode |
| IDOR on every route, token tricks | 404 / 403 / 401 | refused_attacks |
| SSRF forms (private, metadata, numeric, rebinding) | refused at intake and at delivery | ssrf, callback_delivery |
| forged and replayed webhooks | 401 with nothing stored; seen ids have no effect | webhook_endpoint, signatures |
| oversized and nested JSON, lying lengths | 413 while streaming, depth bound, 400 | agent_api, webhook_endpoint, intake |
| NUL / unstorable text in ids, filters, bodies, forms, argv | 400 / tool error / -32602 / one line, naming the field | one_input_rule |
| duplicate member names, non-JSON bodies | 400, 415 | one_input_rule |
| /mcp streams held open, oversized bodies, one token filling the server | POST only, body limit, per-token cap, ended at revocation | mcp_door |
| secrets in logs, history, answers | never written | no_secret_leaks |
| a result of millions of lines | read as a stream by a child process, counts exact | provider_answers, result_scan |
| gzip bombs from a provider | decoded a piece at a time within the limit | provider_answers, lookup_paging, result_scan |
| result_ref, redirects to internal addresses | own origin or [result] hosts, then the SSRF guard; no request | provider_answers, http_adapter |
| lookups that loop or never end | a seen cursor ends it; an unread list settles nothing | lookup_paging |
| large orphan and ignored webhook events | id, type, job id, digest and 4 KiB kept | orphan_events |
| request_schema checks that stall the service | RE2 patterns, hashed uniqueItems, a time bound (413), off the loop | schema_cost |
| a retry racing the prune of its operation | the keyed insert stops on a row its snapshot sees | prune_race |
| retention records or tombstones deleted or edited | the log's head kept apart, tombstones counted and digested | retention_account |
| /metrics cost growing with stored rows | in-flight states at each scrape, ended ones apart | scrape_cost |
| stacked encodings, header credentials in another case | contract_violation at once; caseless prefixes | provider_answers, header_credentials |
"""

from __future__ import annotations

import importlib

import pytest

MATRIX: dict[str, list[str]] = {
    "disk flood through status reads": [
        "tests.security.test_amplification::test_a_status_read_does_not_rewrite_the_request",
    ],
    "WAL growth under a flood": [
        "tests.security.test_amplification::test_the_wal_is_reset_once_it_passes_its_bound",
    ],
    "create-reconcile retry storm": [
        "tests.security.test_amplification::test_every_create_or_lookup_waits_one_growing_backoff_step",
        "tests.security.test_amplification::test_provider_down_costs_one_call_per_backoff_step",
    ],
    "extensions beyond the offer": [
        "tests.security.test_offered_options::test_the_planner_refuses_more_than_was_offered",
        "tests.security.test_offered_options::test_api_extensions_beyond_the_offer_are_400_naming_the_field",
        "tests.security.test_offered_options::test_cli_extensions_beyond_the_offer_fail_cleanly",
    ],
    "forged callbacks": [
        "tests.security.test_callback_secrets::test_agent_a_cannot_sign_a_callback_that_verifies_for_agent_b",
        "tests.security.test_callback_secrets::test_a_delivered_callback_verifies_with_the_agents_own_secret_only",
        "tests.security.test_callback_secrets::test_rotation_signs_with_both_secrets_inside_the_window_only",
        "tests.security.test_callback_secrets::test_secrets_are_stored_nowhere_in_clear",
    ],
    "quotas": [
        "tests.security.test_quotas::test_a_vanishing_deadline_is_refused",
        "tests.security.test_quotas::test_creates_beyond_the_rate_are_429_with_retry_after",
        "tests.security.test_quotas::test_operations_in_flight_are_capped_per_agent",
        "tests.security.test_quotas::test_a_hint_flood_adds_one_history_entry_while_the_read_is_pending",
        "tests.security.test_quotas::test_history_is_paged_with_a_cursor",
        "tests.security.test_quotas::test_expired_tokens_are_refused",
        "tests.security.test_quotas::test_metrics_can_require_a_bearer_token",
    ],
    "idempotent retries": [
        "tests.security.test_idempotency::test_a_retry_with_another_term_is_409_naming_it",
        "tests.security.test_idempotency::test_numbers_compare_by_value",
        "tests.security.test_idempotency::test_the_migration_carries_stored_operations_over",
        "tests.integration.test_agent_api::test_same_key_with_another_request_is_a_conflict",
    ],
    "bad Unicode and disconnects": [
        "tests.security.test_bad_unicode_and_disconnects::test_a_lone_surrogate_in_a_create_is_400_naming_the_field",
        "tests.security.test_bad_unicode_and_disconnects::test_a_lone_surrogate_in_a_cancel_or_decision_is_400",
        "tests.security.test_bad_unicode_and_disconnects::test_a_signed_webhook_with_unstorable_ids_is_400_and_counted",
        "tests.security.test_bad_unicode_and_disconnects::test_a_sender_that_hangs_up_mid_body_is_counted_at_info",
    ],
    "IDOR and token tricks": [
        "tests.security.test_refused_attacks::test_no_route_reaches_another_agents_operation",
        "tests.security.test_refused_attacks::test_token_tricks_are_401",
        "tests.security.test_refused_attacks::test_revoked_and_expired_tokens_stop_working",
        "tests.integration.test_agent_api::test_another_agents_operation_is_not_found",
        "tests.integration.test_tokens::test_authentication_outcomes",
    ],
    "SSRF forms": [
        "tests.unit.test_ssrf::test_forbidden_addresses_are_refused_with_their_class",
        "tests.unit.test_ssrf::test_numeric_forms_are_normalised_like_libc",
        "tests.unit.test_ssrf::test_name_resolving_to_private_address_is_refused",
        "tests.unit.test_ssrf::test_embedded_ipv4_is_judged_by_the_ipv4_address",
        "tests.integration.test_callback_delivery::test_dns_rebinding_between_attempts_is_refused",
        "tests.integration.test_callback_delivery::test_literal_metadata_address_is_refused_and_never_connected",
        "tests.integration.test_callback_delivery::test_redirect_is_not_followed_and_the_target_never_contacted",
        "tests.unit.test_intake::test_a_refused_callback_url_is_an_invalid_request",
    ],
    "forged and replayed webhooks": [
        "tests.integration.test_webhook_endpoint::test_rejected_deliveries_are_401_and_store_nothing",
        "tests.integration.test_webhook_endpoint::test_repeated_event_id_is_acknowledged_without_effect",
        "tests.integration.test_webhook_endpoint::test_same_event_id_with_another_body_is_a_conflict_without_effect",
        "tests.unit.test_signatures::test_timestamp_outside_tolerance_is_rejected",
        "tests.unit.test_signatures::test_tampering_is_a_mismatch",
    ],
    "oversized and nested JSON": [
        "tests.integration.test_webhook_endpoint::test_oversized_body_is_413",
        "tests.integration.test_webhook_endpoint::test_small_declared_length_with_a_huge_chunked_body_is_refused",
        "tests.integration.test_agent_api::test_bodies_that_lie_about_their_length_are_refused",
        "tests.integration.test_agent_api::test_each_bad_create_is_refused_with_a_message_and_nothing_stored",
        "tests.unit.test_intake::test_any_json_value_is_either_parsed_or_refused_with_invalid_request",
    ],
    "one input rule": [
        "tests.security.test_one_input_rule::test_a_nul_anywhere_in_a_create_is_400_naming_the_field_and_nothing_is_stored",
        "tests.security.test_one_input_rule::test_a_nul_in_an_operation_id_is_400_before_any_lookup",
        "tests.security.test_one_input_rule::test_a_nul_in_a_list_filter_is_400",
        "tests.security.test_one_input_rule::test_an_unstorable_tool_argument_is_a_tool_error_naming_it",
        "tests.security.test_one_input_rule::test_an_unstorable_task_id_is_invalid_params_not_an_internal_error",
        "tests.security.test_one_input_rule::test_a_nul_in_a_console_form_is_400_naming_the_field",
        "tests.security.test_one_input_rule::test_the_cli_refuses_bad_arguments_in_one_line",
        "tests.security.test_one_input_rule::test_duplicate_member_names_are_400",
        "tests.security.test_one_input_rule::test_a_body_that_is_not_declared_json_is_415",
    ],
    "the /mcp door": [
        "tests.security.test_mcp_door::test_get_is_405_and_holds_no_stream",
        "tests.security.test_mcp_door::test_the_api_body_limit_holds_on_mcp",
        "tests.security.test_mcp_door::test_one_token_cannot_hold_more_than_its_share_and_revoking_it_ends_its_requests",
        "tests.security.test_mcp_door::test_a_request_open_when_its_token_expires_is_ended",
        "tests.security.test_mcp_door::test_a_legacy_stream_open_at_revocation_ends_with_an_error_event",
        "tests.security.test_mcp_door::test_a_client_hanging_up_mid_body_is_logged_at_info",
        "tests.security.test_mcp_door::test_a_quota_refusal_on_start_job_is_a_tool_error_with_the_retry_time",
        "tests.security.test_mcp_door::test_the_front_door_deadlines_hold_on_mcp",
    ],
    "secrets never leak": [
        "tests.integration.test_no_secret_leaks::test_a_full_run_leaks_no_secret",
    ],
    "huge results": [
        "tests.security.test_provider_answers::test_a_million_line_result_is_counted_exactly_without_holding_it",
        "tests.security.test_provider_answers::test_a_json_document_larger_than_can_be_checked_whole_is_refused_naming_why",
        "tests.unit.test_result_scan::test_a_chunked_scan_reports_what_a_whole_line_by_line_read_does",
        "tests.unit.test_result_scan::test_a_line_longer_than_the_limit_is_a_problem_and_is_not_held",
    ],
    "compressed bodies": [
        "tests.security.test_provider_answers::test_a_gzip_bomb_status_answer_is_refused_without_expanding_it",
        "tests.security.test_provider_answers::test_a_gzip_bomb_result_is_refused_once_it_expands_past_max_bytes",
        "tests.security.test_provider_answers::test_a_body_in_an_encoding_not_asked_for_is_not_read",
        "tests.unit.test_result_scan::test_a_body_decodes_whole_or_is_refused_past_its_limit",
    ],
    "provider URLs": [
        "tests.security.test_provider_answers::test_a_result_url_off_the_providers_origin_and_unlisted_is_never_fetched",
        "tests.security.test_provider_answers::test_a_listed_host_that_resolves_to_a_metadata_address_is_refused",
        "tests.security.test_provider_answers::test_a_listed_loopback_host_needs_the_allow_list",
        "tests.security.test_provider_answers::test_a_redirect_off_the_providers_origin_is_not_followed",
        "tests.security.test_provider_answers::test_a_listed_public_host_is_fetched_at_the_checked_address_without_credentials",
        "tests.integration.test_http_adapter::test_redirects_to_another_origin_drop_credentials",
        "tests.integration.test_http_adapter::test_a_result_url_on_another_loopback_port_is_never_requested",
    ],
    "lookups that cannot end": [
        "tests.security.test_lookup_paging::test_a_lookup_that_cannot_read_the_list_to_its_end_settles_nothing",
    ],
    "bounded webhook events": [
        "tests.security.test_orphan_events::test_an_orphan_keeps_its_ids_type_digest_and_4_kib_of_its_body",
        "tests.security.test_orphan_events::test_three_hundred_orphans_of_60_kb_grow_the_database_by_a_few_megabytes",
        "tests.security.test_orphan_events::test_an_ignored_type_keeps_its_job_id_and_never_attaches",
        "tests.security.test_orphan_events::test_a_cut_orphan_still_settles_a_create_unknown_when_its_job_is_learned",
    ],
    "request_schema cost": [
        "tests.security.test_schema_cost::test_unique_items_over_20000_objects_is_linear",
        "tests.security.test_schema_cost::test_a_backtracking_pattern_is_matched_in_linear_time",
        "tests.security.test_schema_cost::test_a_pattern_re2_cannot_take_stops_the_service_at_start",
        "tests.security.test_schema_cost::test_a_fan_out_past_the_bound_is_refused_with_413",
        "tests.security.test_schema_cost::test_healthz_answers_while_a_check_runs_and_the_create_stores_nothing",
    ],
    "retries racing the prune": [
        "tests.faults.test_prune_race::test_a_retry_racing_the_prune_of_its_operation_starts_no_job",
    ],
    "retention tampering": [
        "tests.security.test_retention_account::test_each_tampering_fails_verification_naming_what_is_missing",
        "tests.security.test_retention_account::test_the_dry_run_counts_the_job_events_the_prune_deletes",
    ],
    "metrics cost": [
        "tests.security.test_scrape_cost::test_a_scrape_counts_what_is_in_flight_and_not_the_ended_rows",
    ],
    "stacked encodings and header credentials": [
        "tests.security.test_provider_answers::test_a_status_answer_with_1500_stacked_encodings_is_a_contract_violation",
        "tests.security.test_header_credentials::test_the_headers_that_passed_are_refused",
    ],
}


@pytest.mark.parametrize("node", [n for nodes in MATRIX.values() for n in nodes])
def test_every_listed_test_exists(node: str) -> None:
    module, _, name = node.partition("::")
    assert callable(getattr(importlib.import_module(module), name, None)), node
