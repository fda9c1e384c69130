"""Everything a running service holds, built once from the settings.

The doors (API routes, console, MCP) receive it; the engine sees it only as
``engine.deps.EngineDeps``; ``reconciler.app`` builds the app around one. Tests
build one with a ``ManualClock``, a seeded ``Random`` and their own environment
instead of the defaults.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from reconciler.config import DEFAULT_PROVIDERS_DIR, Secret, Settings
from reconciler.core.clock import Clock, SystemClock
from reconciler.core.completion_lanes import first_lane, round_steps
from reconciler.core.create_wait import CreateWaits
from reconciler.core.errors import ConfigError, InvalidRequest
from reconciler.core.ids import worker_id
from reconciler.core.limits import ProviderLimits
from reconciler.core.principal import Principal
from reconciler.core.quotas import Quota
from reconciler.core.records import OperationRecord
from reconciler.core.signatures import Verifier, build_verifier, decode_whsec
from reconciler.core.trust import TrustView
from reconciler.engine.create_start import CreateStarts
from reconciler.engine.group_commit import GroupCommitter
from reconciler.engine.wakeups import Notifier
from reconciler.logs import OutageLog
from reconciler.metrics import Metrics
from reconciler.outbound import ssrf
from reconciler.outbound.address_classes import IPAddress
from reconciler.outbound.callbacks import receiver_host
from reconciler.providers.adapter import ProviderAdapter
from reconciler.providers.http_adapter import build_adapter
from reconciler.providers.loader import load_providers
from reconciler.providers.result_fetch import URL_NAME
from reconciler.providers.secrets import webhook_secrets
from reconciler.providers.spec import ProviderSpec, WebhookSpec
from reconciler.storage import completion_steps, trust
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.journal import Also, Journal
from reconciler.storage.operation_reads import ViewBatcher
from reconciler.telemetry import OFF, Telemetry
from reconciler.telemetry import build as build_telemetry
from reconciler.tracing import Tracing

# How often an open request's token is checked again (a cache hit, except once per window).
TOKEN_RECHECK_SECONDS = 1.0


@dataclass
class Runtime:
    settings: Settings
    db: Database
    journal: Journal
    providers: dict[str, ProviderSpec]
    environ: Mapping[str, str]
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)
    worker_id: str = field(default_factory=lambda: worker_id(socket.gethostname(), os.getpid()))
    notifier: Notifier = field(default_factory=Notifier)
    create_waits: CreateWaits = field(default_factory=CreateWaits)  # agent_actions.start
    webhook_intakes: dict[str, tuple[WebhookSpec, Verifier]] = field(default_factory=dict)
    adapters: dict[str, ProviderAdapter] = field(default_factory=dict)
    callback_key: bytes | None = None
    allow_hosts: ssrf.AllowList = field(default_factory=lambda: ssrf.as_allow_list(()))
    transport: Any = None  # an httpx transport for provider calls (tests); None = network
    resolver: ssrf.Resolver = ssrf.system_resolver  # for provider URLs on other hosts
    webhooks: GroupCommitter = field(init=False)
    # Where a create stored here starts at once (the app's engine); None: by a claim.
    create_starts: CreateStarts | None = None
    views: ViewBatcher = field(init=False)
    metrics: Metrics = field(default_factory=Metrics)
    # Authenticated principals by digest of the Authorization header, with their expiry.
    token_cache: dict[str, tuple[Principal, float]] = field(default_factory=dict)
    # How often an open request (/wait, /mcp) checks its token again (``inbound.auth``).
    token_recheck_seconds: float = TOKEN_RECHECK_SECONDS
    # The bearer token /metrics asks for ([server] metrics_token_env); None: /metrics is open.
    metrics_token: Secret | None = None
    # Traces (``[telemetry]``): chosen once here; off, every span call is a no-op.
    telemetry: Telemetry = field(default_factory=lambda: OFF)
    # The doors' 5xx answers: in an outage every request fails alike, so they are logged as
    # one outage (``logs.OutageLog``), which ends when the database's writes succeed again.
    request_failures: OutageLog = field(init=False)
    # Request-schema checks run off the loop one at a time: a costly one (bounded by
    # ``request_schema.CHECK_SECONDS``) queues the next rather than many taking the GIL.
    request_checks: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))

    @property
    def tracing(self) -> Tracing:
        return self.telemetry.tracing

    def __post_init__(self) -> None:
        self.webhooks = GroupCommitter(
            self.db,
            self.journal,
            self.clock.now,
            on_hint=self.notifier.wake,
            wait_seconds=self.settings.server.webhook_wait_seconds,
            monotonic=self.clock.monotonic,
        )
        self.views = ViewBatcher(self.db, self.clock.now)
        self.request_failures = OutageLog(
            logging.getLogger("reconciler.http"), "API requests", self.clock.monotonic
        )
        self.db.availability.on_recovery(self.request_failures.succeeded)
        self.metrics.watch_states(self._state_counts_in_flight, self._state_counts_ended)
        self.metrics.watch_trust(self.trust_views)
        self.metrics.watch_writes(lambda: self.db.write_transactions, lambda: self.db.write_cycles)
        self.metrics.watch_database_size(self.db.size_bytes)

    def trust_views(self) -> dict[str, TrustView]:
        """Every provider's webhook trust as operators see it (``storage.trust.trust_views``)."""
        policies = {name: spec.polling.trust() for name, spec in self.providers.items()}
        with self.db.read() as conn:
            return trust.trust_views(conn, policies)

    def _state_counts_in_flight(self) -> dict[str, int]:
        with self.db.read() as conn:
            return store.count_by_state(conn, ended=False)

    def _state_counts_ended(self) -> dict[str, int]:
        with self.db.read() as conn:
            return store.count_by_state(conn, ended=True)

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
        transport: Any = None,
        telemetry: Telemetry | None = None,
    ) -> Runtime:
        env = dict(os.environ if environ is None else environ)
        key = settings.audit_key(env)
        clock = clock or SystemClock()
        providers = load_providers(
            settings.providers_path(),
            settings.providers,
            env,
            missing_ok=settings.providers_dir == DEFAULT_PROVIDERS_DIR,
            public_url=settings.server.public_url,
        )
        ssrf.validate_allow_hosts(settings.callbacks.allow_hosts)
        allow = ssrf.as_allow_list(settings.callbacks.allow_hosts)
        has_hooks = bool(settings.hooks)

        def first(op: OperationRecord) -> str:
            host = receiver_host(op.callback_url, allow) if op.callback_url else None
            return first_lane(has_hooks, host)

        hook_names = [spec.target for spec in settings.hooks]

        def round_rows(op: OperationRecord) -> list[Also]:
            names = round_steps(hook_names, bool(op.callback_url))
            return [completion_steps.made(op, names)] if names else []

        runtime = cls(
            settings=settings,
            db=Database(
                settings.database_url,
                background_checkpoint=True,
                write_wait_seconds=settings.server.write_wait_seconds,
                now=clock.now,
            ),
            journal=Journal(
                key=key.reveal().encode("utf-8") if key else None,
                first_lane=first,
                round_rows=round_rows,
            ),
            providers=providers,
            environ=env,
            clock=clock,
            rng=rng or random.Random(),
            callback_key=_callback_key(settings, env),
            allow_hosts=allow,
            transport=transport,
            metrics_token=settings.metrics_token(env),
            telemetry=telemetry if telemetry is not None else build_telemetry(settings, env),
        )
        for name, spec in providers.items():
            if spec.webhook is not None:
                secrets = [s.reveal() for s in webhook_secrets(spec.webhook, spec.where, env)]
                verifier = build_verifier(
                    spec.webhook.scheme,
                    secrets,
                    clock=clock,
                    tolerance_seconds=spec.webhook.tolerance_seconds,
                    signature_header=spec.webhook.signature_header,
                )
                runtime.webhook_intakes[name] = (spec.webhook, verifier)
        return runtime

    def adapter(self, provider: str) -> ProviderAdapter:
        adapter = self.adapters.get(provider)
        if adapter is None:
            # The runtime's clock stamps every call: a call's sent_at is compared with times
            # the service wrote (acceptance, a webhook's arrival), so both need one clock.
            adapter = build_adapter(
                self.providers[provider],
                self.environ,
                self.transport,
                clock=self.clock,
                tracing=self.tracing,
                guard=self.provider_url_guard,
            )
            self.adapters[provider] = adapter
        return adapter

    def limits_for(self, provider: str) -> ProviderLimits:
        spec = self.providers[provider]
        limits = self.settings.limits
        return ProviderLimits(
            deadline_seconds=spec.polling.deadline_seconds,
            max_status_requests=spec.polling.max_status_requests,
            max_transport_failures=spec.polling.max_transport_failures,
            create_deadline_seconds=spec.create.create_deadline_seconds,
            min_deadline_seconds=limits.min_deadline_seconds,
            quota=Quota(limits.max_operations_in_flight, limits.max_creates_per_minute),
        )

    async def provider_url_guard(self, url: str) -> list[IPAddress]:
        """A URL a provider handed us, on a host its file lists: the callback guard's rules
        (``callbacks.allow_hosts`` exempts), resolved now; the addresses to fetch it from."""
        return await ssrf.resolve_and_check(url, self.allow_hosts, self.resolver, URL_NAME)

    def check_callback_url(self, url: str) -> None:
        if self.callback_key is None:
            raise InvalidRequest(
                "this service has no callback signing secret configured "
                f"({self.settings.callbacks.signing_secret_env}); omit callback_url and use "
                "GET /v1/operations/{id}/wait instead"
            )
        ssrf.check_url(url, self.allow_hosts)

    async def close(self) -> None:
        for adapter in self.adapters.values():
            await adapter.aclose()
        self.adapters.clear()
        self.webhooks.close()
        await self.db.aclose()
        # The last spans (the shutdown's own among them) are sent before the process ends.
        await anyio.to_thread.run_sync(self.telemetry.shutdown)


def _callback_key(settings: Settings, environ: Mapping[str, str]) -> bytes | None:
    variable = settings.callbacks.signing_secret_env
    value = environ.get(variable)
    if not value:
        return None
    try:
        return decode_whsec(Secret(value).reveal())
    except ValueError:
        raise ConfigError(
            f"{settings.source}: callbacks.signing_secret_env: {variable} is not a valid "
            "whsec_ secret (base64 after the prefix)"
        ) from None
