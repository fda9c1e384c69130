"""Loading the configured completion hooks (``"pkg.module:function"``, or a table).

A plain hook is called as ``fn(operation, idempotency_key)`` (sync or async) and
may run again after a crash with the same key: at-least-once. A transactional
hook (``{ target = "pkg.mod:fn", transactional = true }``) is called as
``fn(operation, idempotency_key, conn)`` inside the database transaction that
records its step done, so what it writes through ``conn`` commits exactly once;
it must be a plain function (it runs in that transaction's thread).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.config import HookSpec
from reconciler.core.errors import ConfigError

HookFn = Callable[..., Any]


@dataclass(frozen=True)
class Hook:
    name: str
    fn: HookFn
    transactional: bool = False

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def load_hook(spec: str | HookSpec, where: str) -> Hook:
    target = spec.target if isinstance(spec, HookSpec) else spec
    transactional = isinstance(spec, HookSpec) and spec.transactional
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}: hooks: {target!r} must look like 'pkg.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: hooks: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{where}: hooks: {target!r} is not a callable in {module_name!r}")
    if transactional and inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"{where}: hooks: {target!r} is async; a transactional hook must be a plain "
            "function (it runs inside the step's database transaction)"
        )
    return Hook(target, fn, transactional)


def load_hooks(specs: Sequence[str | HookSpec], where: str) -> tuple[Hook, ...]:
    hooks = tuple(load_hook(spec, where) for spec in specs)
    names = [h.name for h in hooks]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{where}: hooks: {name!r} is listed twice; list each hook once")
    return hooks
