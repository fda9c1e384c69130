"""Who is calling: the name and scope of the token a request came with, and the check that
an action needs an operator. Plain values: the token's lookup is ``storage.tokens``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconciler.core.errors import PermissionDenied
from reconciler.core.vocabulary import Scope


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name is the caller recorded on operations."""

    name: str
    scope: Scope
    expires_at: datetime | None = None

    @property
    def is_operator(self) -> bool:
        return self.scope is Scope.OPERATOR


def require_operator(principal: Principal) -> None:
    if not principal.is_operator:
        raise PermissionDenied("this action needs an operator token")
