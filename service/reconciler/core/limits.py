"""The bounds one operation is started within: the provider file's and the service's."""

from __future__ import annotations

from dataclasses import dataclass, field

from reconciler.core.quotas import Quota


@dataclass(frozen=True)
class ProviderLimits:
    """What the provider file authorises; an agent may ask for less, never for more."""

    deadline_seconds: float
    max_status_requests: int
    max_transport_failures: int
    create_deadline_seconds: float
    min_deadline_seconds: float = 0.0  # the service's floor ([limits] min_deadline_seconds)
    quota: Quota = field(default_factory=lambda: Quota(max_in_flight=0, max_per_minute=0))
