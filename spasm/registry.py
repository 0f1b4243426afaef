"""Named registries: backends by kind, projections by condition (a leaf: imports only errors).

A registry maps a name to an implementation that registers itself with a decorator
(``@BACKENDS.register("openai")``). The built-in names are listed here with the module that
implements them, imported only when the implementation is first looked up: so the layers
that only *check* a name (the config) never import the layers that implement it, and
importing this module stays cheap. Plugins register the same way, with the same decorators.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BACKENDS", "PROJECTIONS", "Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to implementations; ``builtins`` are modules that register on import."""

    def __init__(self, what: str, builtins: dict[str, str] | None = None) -> None:
        self.what = what
        #: Built-in name → the module that registers it on import.
        self._builtins = dict(builtins or {})
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Register an implementation under ``name`` (a decorator); a later one replaces it."""

        def decorate(impl: T) -> T:
            self._entries[name] = impl
            return impl

        return decorate

    def names(self) -> list[str]:
        """Every known name (built-in or registered), sorted; imports nothing."""
        return sorted(set(self._builtins) | set(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._builtins or name in self._entries

    def get(self, name: str) -> T | None:
        """The implementation registered under ``name`` (a built-in's module is imported on
        first look-up), or ``None``."""
        if name not in self._entries and name in self._builtins:
            importlib.import_module(self._builtins[name])
        return self._entries.get(name)

    def unregister(self, name: str) -> None:
        """Forget a registered ``name`` (tests and plugins that replace a built-in); a built-in
        name stays known."""
        self._entries.pop(name, None)


#: Backend factories by config ``kind`` (:mod:`spasm.backends.registry` builds from them).
BACKENDS: Registry[Callable[..., object]] = Registry(
    "backend kind",
    {"openai": "spasm.backends.openai_compat", "embedded": "spasm.backends.embedded"},
)
#: Projections Ψ by condition name (:mod:`spasm.projection`).
PROJECTIONS: Registry[Callable[..., object]] = Registry(
    "projection",
    {"ecp": "spasm.projection", "concat": "spasm.projection", "quoted": "spasm.projection"},
)
