"""Loading the configured completion hooks (``"pkg.module:function"``)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.errors import ConfigError

HookFn = Callable[[dict[str, Any], str], Any]


@dataclass(frozen=True)
class Hook:
    name: str
    fn: HookFn

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def load_hook(spec: str, where: str) -> Hook:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}: hooks: {spec!r} must look like 'pkg.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: hooks: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{where}: hooks: {spec!r} is not a callable in {module_name!r}")
    return Hook(spec, fn)


def load_hooks(specs: Sequence[str], where: str) -> tuple[Hook, ...]:
    return tuple(load_hook(spec, where) for spec in specs)
