"""Providers: declarative provider files, their state tables and the adapters that call them.

``files`` loads and validates ``[providers.NAME]`` tables into ``ProviderSpec``;
``state_table`` classifies remote states; ``adapter`` defines the adapter protocol,
the typed call results and the pure readings of bodies; ``http_adapter`` is the
declarative httpx implementation and ``build_adapter``.
"""

from reconciler.providers.adapter import (
    CallResult,
    CreateOutcome,
    LookupOutcome,
    LookupVerdict,
    ProviderAdapter,
    ResultCheck,
    StatusOutcome,
    StatusView,
    check_result,
    create_outcome,
    lookup_outcome,
    status_outcome,
    status_view,
)
from reconciler.providers.http_adapter import HttpAdapter, build_adapter
from reconciler.providers.spec import ProviderSpec, load_providers

__all__ = [
    "CallResult",
    "CreateOutcome",
    "HttpAdapter",
    "LookupOutcome",
    "LookupVerdict",
    "ProviderAdapter",
    "ProviderSpec",
    "ResultCheck",
    "StatusOutcome",
    "StatusView",
    "build_adapter",
    "check_result",
    "create_outcome",
    "load_providers",
    "lookup_outcome",
    "status_outcome",
    "status_view",
]
